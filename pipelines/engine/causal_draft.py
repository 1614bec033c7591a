"""The lean draft decoder for Llama-layout causal assistants (Qwen2, Llama, Mistral): int8 weights.

A draft step of a small causal LM on a CPU reads every weight once, so its cost is the bytes of its
weights: Qwen2.5-Coder-0.5B in bfloat16 takes ~80 ms a step on 2 cores (0.4 of the 1.5B main model's
step), which eats most of what its drafts save. Here its linear layers (q/k/v fused, gate/up fused, o,
down and the head) hold int8 weights per output channel (``lean.Linear``) and the rest runs in float32:
~32 ms a step. The layer math is the family's own:
    x = x + W_o attn(RoPE(W_q n1(x) + b_q), RoPE(W_k n1(x) + b_k), W_v n1(x) + b_v)     (grouped-query heads)
    x = x + W_down (silu(W_gate n2(x)) * W_up n2(x))
    logits = W_head n(x),   n(x) = g * x / sqrt(mean(x^2) + eps)   (RMSNorm)
over the ragged cache (``cache.RaggedCache``, rejected drafts become holes; on CUDA a static one,
``draft_cache.StaticDraftCache``). The int8 error (~1% of the
logits) only changes which tokens are proposed: the main model's verification decides every output token.
"""

from __future__ import annotations

import torch

from .cache import LeanCache, RaggedCache
from .decoders import EncoderOutput
from .draft_cache import StaticDraftCache
from .lean import LeanDecoder, Linear, int8_available


def can_draft(model) -> bool:
    """Whether ``model`` can run as a lean int8 drafter here: a Llama-layout causal LM (``causal.fits``) and
    a torch with int8 linear kernels."""
    from .causal import fits

    return not model.config.is_encoder_decoder and fits(model.config) and int8_available(model.device)


def _rms_norm(module):
    """The module's RMSNorm as a float32 function: g * x / sqrt(mean(x^2) + eps)."""
    weight = module.weight.detach().float()
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    return lambda x: weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _bias(linear: torch.nn.Linear) -> torch.Tensor:
    return linear.bias.detach() if linear.bias is not None else torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device)


class CausalDraftDecoder(LeanDecoder):
    """A Qwen2/Llama/Mistral ``...ForCausalLM`` as an assistant, int8 weights (module docstring; with
    ``int8=False`` float32 weights, the same math: tests compare it with the model's own forward)."""

    def __init__(self, model, int8: bool = True) -> None:
        super().__init__(model)
        self.int8 = int8 and int8_available(self.device)
        lin = lambda w, b=None: Linear(w, b, self.int8)  # noqa: E731
        config, inner = self.config, model.model
        self.max_positions = getattr(config, "max_position_embeddings", None)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.embed = inner.embed_tokens.weight.detach()  # looked up in the model's dtype, then float32
        self.rotary = inner.rotary_emb
        self.norm = _rms_norm(inner.norm)
        self.layers = []
        for layer in inner.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.layers.append({
                "n1": _rms_norm(layer.input_layernorm), "n2": _rms_norm(layer.post_attention_layernorm),
                "qkv": lin(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                           torch.cat([_bias(a.q_proj), _bias(a.k_proj), _bias(a.v_proj)])),
                "o": lin(a.o_proj.weight, a.o_proj.bias),
                "gate_up": lin(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                "down": lin(mlp.down_proj.weight, mlp.down_proj.bias), "act": mlp.act_fn,
            })
        self.head = lin(model.lm_head.weight)
        self.dtype = torch.float32  # activations (the int8 kernels take float32 inputs)

    @property
    def reads_encoder(self) -> bool:
        return False

    def _step(self, ids: torch.Tensor, real: torch.Tensor, cache: RaggedCache | StaticDraftCache, enc: EncoderOutput | None):
        """Float32 logits (B, n, V) for the token ids (B, n) on the device and their real-token flags (B, n)
        (``Decoder.forward_ids``)."""
        positions, allowed = cache.plan(real, self.max_positions)
        store: LeanCache = cache.cache
        batch, n = ids.shape
        dh, h, kvh = self.head_dim, self.heads, self.kv_heads
        x = torch.nn.functional.embedding(ids, self.embed).float()
        # RoPE angles from the model's own rotary module, in float32: cos/sin (B, 1, n, Dh)
        cos, sin = (t[:, None] for t in self.rotary(x, positions))
        for layer, kv in zip(self.layers, store.layers):
            qkv = layer["qkv"](layer["n1"](x))
            q = qkv[..., : h * dh].view(batch, n, h, dh).transpose(1, 2)
            k = qkv[..., h * dh : (h + kvh) * dh].view(batch, n, kvh, dh).transpose(1, 2)
            v = qkv[..., (h + kvh) * dh :].view(batch, n, kvh, dh).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            cache.write(kv, k, v)
            attn = torch.nn.functional.scaled_dot_product_attention(q, kv.keys, kv.values, attn_mask=allowed,
                                                                    enable_gqa=kvh != h)
            x = x + layer["o"](attn.transpose(1, 2).reshape(batch, n, h * dh))
            gate, up = layer["gate_up"](layer["n2"](x)).chunk(2, dim=-1)
            x = x + layer["down"](layer["act"](gate) * up)
        return self.head(self.norm(x)), real


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """t cos + rotate_half(t) sin, rotate_half([a, b]) = [-b, a] over the last axis (halves)."""
    from .causal import _rotate_half

    return t * cos + _rotate_half(t) * sin
