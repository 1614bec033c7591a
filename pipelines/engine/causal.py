"""The fixed-shape main decoder for Llama-layout causal LMs (Qwen2, Llama, Mistral without a sliding window).

Assisted output equals plain output by construction (``fixed``: one tile width for every pass, a static
cache whose slot is the position, attention over all slots with a float32 softmax). The layer math is the
family's own, run through the model's modules and weights:
    x = x + W_o attn(RoPE(W_q RMSNorm(x)), RoPE(W_k RMSNorm(x)), W_v RMSNorm(x))     (grouped-query heads)
    x = x + W_down (silu(W_gate RMSNorm'(x)) * W_up RMSNorm'(x))
then the final RMSNorm and the head. RoPE's cos/sin are read from a table computed once per decoder (by
the model's own rotary module), so a token's angles never depend on the pass it comes in.
"""

from __future__ import annotations

import torch

from .fixed import FixedCache, FixedShapeDecoder

FAMILIES = ("qwen2", "llama", "mistral")
WIDTH = 4  # columns per pass: a 1.5B model's step reads ~3 GB of bfloat16 weights, about the same for 1 or 4 columns
TABLE_MAX = 32_768  # RoPE positions tabulated (and the longest request a fixed cache may hold)
CAPACITY_STEP = 64  # a request's cache capacity is rounded up to this many slots


def fits(config) -> bool:
    """Whether ``config`` describes a model this decoder runs exactly: a Llama-layout family with full causal
    attention (Qwen2 carries a ``sliding_window`` size that is off unless ``use_sliding_window``)."""
    if config.model_type not in FAMILIES or getattr(config, "use_sliding_window", False):
        return False
    return config.model_type == "qwen2" or not getattr(config, "sliding_window", None)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FixedCausalDecoder(FixedShapeDecoder):
    """A Qwen2/Llama/Mistral ``...ForCausalLM`` as the main model, with fixed shapes (module docstring)."""

    def __init__(self, model, width: int = WIDTH) -> None:
        super().__init__(model)
        config = self.config
        self.inner = model.model
        self.width = width
        self.head_transposed = self.dtype == torch.float32  # (W h^T)^T in float32, as measured on AMD
        self.max_positions = min(getattr(config, "max_position_embeddings", TABLE_MAX) or TABLE_MAX, TABLE_MAX)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim ** -0.5
        self.head_weight = model.lm_head.weight.detach()
        positions = torch.arange(self.max_positions, device=self.device)[None]
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        # cos/sin (P, Dh) in the model's dtype, exactly what its rotary module gives for each position
        with torch.no_grad():
            cos, sin = self.inner.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0], sin[0]

    @property
    def reads_encoder(self) -> bool:
        return False

    def new_cache(self, batch: int, capacity: int | None = None, shape_rows: int | None = None) -> FixedCache:
        """A static cache for ``batch`` rows of at most ``capacity`` positions (prompt + new tokens): the
        capacity is part of every attention product's shape, so the plain and the assisted run of a request
        (same prompts, same limit) get the same one. The width is the decoder's whatever the rows
        (``shape_rows`` is not read)."""
        need = capacity or self.max_positions
        slots = min(self.max_positions, -(-need // CAPACITY_STEP) * CAPACITY_STEP)
        return self.make_cache(len(self.inner.layers), batch, slots, self.kv_heads, self.head_dim, self.width)

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, write, cache: FixedCache) -> torch.Tensor:
        """The decoder layers over one tile of ids and positions (B, w) on the device: hidden states (B, w, D)
        after the final norm. The tile's keys and values are written to their slots (``writer``) before attention
        reads the cache."""
        device = self.device
        batch, w = ids.shape
        group = self.heads // self.kv_heads
        store = self.writer(positions, write)
        # allowed[b, 0, g * w + c, s] = s <= position of column c (the query rows of a key/value head's group)
        allowed = (torch.arange(cache.slot_count, device=device)[None, None, :] <= positions[:, :, None])[:, None]
        allowed = allowed.repeat(1, 1, group, 1)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (B, 1, w, Dh)
        x = self.inner.embed_tokens(ids)
        for layer, keys, values in zip(self.inner.layers, cache.keys, cache.values):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_proj(h).view(batch, w, self.heads, self.head_dim).transpose(1, 2)
            k = a.k_proj(h).view(batch, w, self.kv_heads, self.head_dim).transpose(1, 2)
            v = a.v_proj(h).view(batch, w, self.kv_heads, self.head_dim).transpose(1, 2)
            q = (q * cos + _rotate_half(q) * sin) * self.scaling
            k = k * cos + _rotate_half(k) * sin
            store(keys, k)
            store(values, v)
            # grouped-query attention: query head h reads key/value head h // group, so the `group` query
            # heads of one key/value head go through one product as group * w rows
            q = q.reshape(batch, self.kv_heads, group * w, self.head_dim)
            out = self.attend(q, keys, values, allowed).reshape(batch, self.heads, w, self.head_dim)
            x = x + a.o_proj(self.merge_heads(out))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.inner.norm(x)
