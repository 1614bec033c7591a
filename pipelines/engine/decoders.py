"""Decoder adapters and the ragged KV cache: one forward call for a batch whose rows sit at different
positions.

Rows of a batch accept different numbers of drafted tokens, so after a round their sequences have
different lengths. We never move cached keys and values to realign them. Instead every row keeps all
slots it ever wrote, and a validity mask says which slots hold real tokens; rejected drafts and padding
become holes. A forward call then needs, per row, the true position of each new token (for the position
embeddings) and a 4-D attention mask:

    allowed[b, q, s] = valid[b, s]                         for a cached slot s < T
                     = real[b, s - T] and s - T <= q       for a new slot (causal within the chunk)

Holes cost attention work only; when more than half of the slots are holes the cache is compacted
(real slots gathered to the front, per row).

T5 has no absolute positions but a relative position bias, computed here from each slot's true
position (kept per slot) so holes do not distort distances.

The adapters run the families' own transformers modules (embeddings, decoder layers, heads) with that
mask and those positions: Whisper and causal LMs take ``position_ids`` natively; the BART family
(BART, mBART, Marian, M2M100/NLLB, Pegasus) computes its position embeddings from the cache length, so
its adapter embeds tokens and positions itself and then calls the family's decoder layers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

NEG = torch.finfo(torch.float32).min


@dataclass(frozen=True)
class EncoderOutput:
    hidden: torch.Tensor  # (B, S, D) encoder last hidden state
    mask: torch.Tensor | None  # (B, S) 1 for real source tokens, or None when every position is real

    def select(self, rows: torch.Tensor) -> EncoderOutput:
        return EncoderOutput(self.hidden.index_select(0, rows), None if self.mask is None else self.mask.index_select(0, rows))


class RaggedCache:
    """A transformers cache plus, per row, which slots are real and the next true position."""

    def __init__(self, cache, batch: int, device: torch.device) -> None:
        self.cache = cache
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # (B, T)
        self.slot_pos = torch.zeros(batch, 0, dtype=torch.long, device=device)  # (B, T) true position of each slot
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
        self._planned: torch.Tensor | None = None  # positions of the chunk being fed

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def plan(self, chunks: list[list[int]], pad_id: int, max_pos: int | None):
        """Token ids, positions, real-token flags and the 4-D mask for feeding ``chunks`` (one list a row)."""
        batch, n = len(chunks), max(1, max(len(c) for c in chunks))
        device = self.valid.device
        ids = torch.full((batch, n), pad_id, dtype=torch.long, device=device)
        real = torch.zeros(batch, n, dtype=torch.bool, device=device)
        for b, chunk in enumerate(chunks):
            if chunk:
                ids[b, : len(chunk)] = torch.tensor(chunk, dtype=torch.long, device=device)
                real[b, : len(chunk)] = True
        positions = self.next_pos[:, None] + torch.arange(n, device=device)[None, :]
        if max_pos is not None:
            positions = positions.clamp(max=max_pos - 1)  # padding slots only; real tokens stay in range
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        new = causal[None, :, :] & real[:, None, :]
        new = new | torch.eye(n, dtype=torch.bool, device=device)[None]  # a padding query sees itself: no empty rows
        old = self.valid[:, None, :].expand(batch, n, self.length)
        allowed = torch.cat([old, new], dim=2)[:, None, :, :]
        self._planned = positions
        return ids, positions, real, allowed

    def commit(self, keep: torch.Tensor) -> None:
        """After a forward call over n new slots: ``keep`` (B, n) marks which of them hold accepted tokens."""
        self.valid = torch.cat([self.valid, keep], dim=1)
        self.slot_pos = torch.cat([self.slot_pos, self._planned], dim=1)
        self.next_pos = self.next_pos + keep.sum(dim=1)

    def rollback(self, row: int, n: int) -> None:
        """Turn the last ``n`` real slots of ``row`` into holes (rejected drafts) and step its position back."""
        if n <= 0:
            return
        slots = torch.nonzero(self.valid[row]).flatten()[-n:]
        self.valid[row, slots] = False
        self.next_pos[row] -= n

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (finished rows leave the batch and cost nothing more)."""
        self.cache.reorder_cache(rows)
        self.valid = self.valid.index_select(0, rows)
        self.slot_pos = self.slot_pos.index_select(0, rows)
        self.next_pos = self.next_pos.index_select(0, rows)

    def maybe_compact(self, threshold: float = 0.5) -> None:
        """Gather each row's real slots to the front when holes are more than ``threshold`` of the cache
        (0: whenever there is one)."""
        holes = 1.0 - self.valid.float().mean().item() if self.length else 0.0
        if holes <= threshold:
            return
        counts = self.valid.sum(dim=1)
        width = int(counts.max().item())
        # For each row, the source slot of every kept slot: real slots in order, then slot 0 as filler.
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :width]
        new_valid = torch.arange(width, device=self.valid.device)[None, :] < counts[:, None]
        for layer in _self_attention_layers(self.cache):
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys = layer.keys.gather(2, index)
            layer.values = layer.values.gather(2, index)
        self.slot_pos = self.slot_pos.gather(1, order)
        self.valid = new_valid


def _self_attention_layers(cache):
    inner = getattr(cache, "self_attention_cache", cache)
    return inner.layers


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where attention is allowed, the dtype's lowest value elsewhere (softmax gives exactly 0 there)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def _encoder_mask(enc: EncoderOutput, n: int, dtype: torch.dtype) -> torch.Tensor | None:
    if enc.mask is None:
        return None
    allowed = enc.mask.bool()[:, None, None, :].expand(-1, 1, n, -1)
    return additive_mask(allowed, dtype)


@functools.lru_cache(maxsize=None)
def row_stable_kernels(dtype: torch.dtype) -> bool:
    """Whether this machine's matrix products in ``dtype`` give every row the same bits whether it is
    computed with 1 other row or with 2 to 8 others (the products of a Whisper base decoder: 512 and 2048
    wide, its 51,865-token head, and attention's batched products). Checked once per dtype on seeded random
    data, 48 rows at a time. One row alone is not asked about: a single-row product takes another kernel
    (here: the 2,048-input fc2 rounds differently), which is why ``stable_linear`` pads it to two rows."""
    gen = torch.Generator().manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    products = [(rand(out, inp) * 0.05, rand(48, inp)) for out, inp in ((512, 512), (2048, 512), (512, 2048), (51865, 512))]
    keys, probs = rand(8, 1500, 64), torch.softmax(torch.randn(8, 48, 1500, generator=gen), -1).to(dtype)
    with torch.inference_mode():
        for m in range(3, 10):
            for weight, x in products:
                pairs = torch.cat([torch.nn.functional.linear(x[i:i + 2], weight) for i in range(0, 48, 2)])
                groups = torch.cat([torch.nn.functional.linear(x[i:i + m], weight) for i in range(0, 48, m)])
                if not torch.equal(pairs, groups):
                    return False
            for a, b in ((rand(8, 48, 64), keys.transpose(1, 2)), (probs, keys)):
                pairs = torch.cat([torch.matmul(a[:, i:i + 2], b) for i in range(0, 48, 2)], dim=1)
                groups = torch.cat([torch.matmul(a[:, i:i + m], b) for i in range(0, 48, m)], dim=1)
                if not torch.equal(pairs, groups):
                    return False
    return True


def stable_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for x (B, n, D), with a product of one row computed as two (the row twice), so that a
    row's result does not depend on how many rows it came with (see ``row_stable_kernels``)."""
    if x.shape[0] * x.shape[1] == 1:
        return torch.nn.functional.linear(torch.cat([x, x], 1), module.weight, module.bias)[:, :1]
    return torch.nn.functional.linear(x, module.weight, module.bias)


def _call(module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


class Decoder:
    """One model seen as a decoder: ``encode`` (if it has an encoder), a fresh cache, and ``forward``
    over a chunk of new tokens per row returning float32 logits (B, n, V). An assistant with a reduced draft
    head returns logits over its draft vocabulary only: column c holds token ``vocab_ids[c]``."""

    def __init__(self, model) -> None:
        self.model = model
        self.config = model.config
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.max_positions: int | None = None
        self.vocab_ids: tuple[int, ...] | None = None  # sorted ids of the logits' columns; None: every id
        self.compact_at = 0.5  # compact the cache when holes pass this share of it (RaggedCache.maybe_compact)

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(self.config.is_encoder_decoder)

    def encode(self, **inputs) -> EncoderOutput:
        raise TypeError(f"{self.model.__class__.__name__} has no encoder")

    def new_cache(self, batch: int) -> RaggedCache:
        from transformers import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(), DynamicCache()) if self.reads_encoder else DynamicCache()
        return RaggedCache(cache, batch, self.device)

    @property
    def reads_encoder(self) -> bool:
        return self.is_encoder_decoder

    def forward(self, chunks: list[list[int]], cache: RaggedCache, enc: EncoderOutput | None, pad_id: int):
        ids, positions, real, allowed = cache.plan(chunks, pad_id, self.max_positions)
        self._ragged = cache  # T5 reads the slot positions for its relative position bias
        logits = self._forward(ids, positions, additive_mask(allowed, self.dtype), cache.cache, enc)
        return logits.float(), real

    def _forward(self, ids, positions, mask, cache, enc):  # pragma: no cover - abstract
        raise NotImplementedError


class _Layer:
    """One layer's self-attention keys and values (B, heads, T, head_dim), grown a chunk at a time."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None


class LeanCache:
    """The Whisper adapters' cache: self-attention keys/values per layer (compacted and reordered by
    ``RaggedCache`` like any other) and the cross-attention keys/values, computed once from the encoder
    output."""

    def __init__(self, layers: int) -> None:
        self.layers = [_Layer() for _ in range(layers)]
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def reorder_cache(self, rows: torch.Tensor) -> None:
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys, layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
        if self.cross is not None:
            self.cross = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross]


class WhisperDecoder(Decoder):
    """WhisperForConditionalGeneration (main or assistant) or WhisperForCausalLM (decoder-only assistant
    that reads a Whisper encoder's output). The forward calls the model's own decoder modules in the order
    and with the tensor layouts transformers' Whisper decoder uses (pre-norm layers, q scaled after its
    projection, contiguous heads, SDPA with scale 1), so its logits are bit-equal to transformers' (tested
    in float32 and bfloat16), without the per-call dispatch (5% of a plain decoding step in an interleaved
    A/B here)."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.max_positions = self.config.max_target_positions
        self.decoder = model.model.decoder if hasattr(model.model, "decoder") else model.model
        vocab = getattr(self.config, "draft_vocab", None)  # a distilled assistant's reduced head
        if vocab:
            self.vocab_ids = tuple(sorted(vocab))
        self._draft_head = None
        # Below float32, a verify pass over several tokens rounds differently from one-token steps (a
        # one-row product takes another kernel; attention over several queries another path; holes in
        # the cache move terms of the softmax's sums). Where the kernels allow it, compute so that every
        # token's logits have the same bits either way: products of one row done as two, attention as
        # plain matrix products with a float32 softmax, and the cache compacted whenever it has a hole.
        self.row_stable = self.dtype != torch.float32 and row_stable_kernels(self.dtype)
        if self.row_stable:
            self.compact_at = 0.0

    @property
    def reads_encoder(self) -> bool:
        return True

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head. With a draft vocabulary K (an assistant only), logits for K alone:
        z_c = h . W_{K[c]}, one column per id of K. The draft's argmax and softmax are those over K;
        verification by the main model stays over the full vocabulary, so outputs are unchanged and sampling
        stays exact (q, the distribution the draft was drawn from, is zero outside K)."""
        if self.vocab_ids is None:
            return self.model.proj_out(hidden)
        if self._draft_head is None or self._draft_head.dtype != hidden.dtype:
            rows = torch.tensor(self.vocab_ids, dtype=torch.long)
            self._draft_head = self.model.proj_out.weight.index_select(0, rows).to(hidden.dtype).contiguous()
        return torch.nn.functional.linear(hidden, self._draft_head)

    def encode(self, input_features: torch.Tensor, **_) -> EncoderOutput:
        hidden = self.model.model.encoder(input_features.to(self.dtype)).last_hidden_state
        return EncoderOutput(hidden, None)

    def new_cache(self, batch: int) -> RaggedCache:
        return RaggedCache(LeanCache(len(self.decoder.layers)), batch, self.device)

    def _heads(self, t: torch.Tensor, batch: int) -> torch.Tensor:
        """(B, T, D) -> (B, H, T, D/H), contiguous."""
        return t.view(batch, t.shape[1], self.config.decoder_attention_heads, -1).transpose(1, 2).contiguous()

    def _attend_stable(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(q k^T + mask) v per head as two matrix products and a float32 softmax, a single query
        padded to two rows: each query's result has the same bits alone or in a verify pass. (B, n, D)."""
        batch, heads, n, dim = q.shape
        if n == 1:
            q = torch.cat([q, q], dim=2)
            mask = None if mask is None else torch.cat([mask, mask], dim=2)
        scores = torch.matmul(q, k.transpose(-1, -2))
        if mask is not None:
            scores = scores + mask
        out = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)[:, :, :n]
        return out.transpose(1, 2).reshape(batch, n, heads * dim)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """softmax(q k^T + mask) v per head (q is already scaled), heads merged back: (B, n, D)."""
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=1.0, is_causal=False)
        batch, n = q.shape[0], q.shape[2]
        return out.reshape(batch, -1, n, out.shape[-1]).transpose(1, 2).contiguous().reshape(batch, n, -1).contiguous()

    def forward(self, chunks: list[list[int]], cache: RaggedCache, enc: EncoderOutput | None, pad_id: int):
        ids, positions, real, allowed = cache.plan(chunks, pad_id, self.max_positions)
        mask = additive_mask(allowed, self.dtype)
        store: LeanCache = cache.cache
        batch = ids.shape[0]
        dec = self.decoder
        if store.cross is None:
            store.cross = [(self._heads(layer.encoder_attn.k_proj(enc.hidden), batch),
                            self._heads(layer.encoder_attn.v_proj(enc.hidden), batch)) for layer in dec.layers]
        lin, attend = (stable_linear, self._attend_stable) if self.row_stable else (_call, self._attend)
        x = dec.embed_tokens(ids) + dec.embed_positions.weight[positions]
        for layer, kv, (cross_k, cross_v) in zip(dec.layers, store.layers, store.cross):
            a, c = layer.self_attn, layer.encoder_attn
            h = layer.self_attn_layer_norm(x)
            q = self._heads(lin(a.q_proj, h) * a.scaling, batch)
            k, v = self._heads(lin(a.k_proj, h), batch), self._heads(lin(a.v_proj, h), batch)
            kv.keys = k if kv.keys is None else torch.cat([kv.keys, k], dim=-2)
            kv.values = v if kv.values is None else torch.cat([kv.values, v], dim=-2)
            x = x + lin(a.out_proj, attend(q, kv.keys, kv.values, mask))
            q = self._heads(lin(c.q_proj, layer.encoder_attn_layer_norm(x)) * c.scaling, batch)
            x = x + lin(c.out_proj, attend(q, cross_k, cross_v, None))
            x = x + lin(layer.fc2, layer.activation_fn(lin(layer.fc1, layer.final_layer_norm(x))))
        hidden = dec.layer_norm(x)
        if self.vocab_ids is None:
            return lin(self.model.proj_out, hidden).float(), real
        return self._head(hidden).float(), real


class Linear:
    """y = x W^T + b, with W kept in float32 or, for an assistant, as int8 per output channel
    (W ~ s_o * Q_o, Q_o in [-127, 127], dynamic quantization of x per call): about 2.5 times less time per
    draft-sized product on these CPUs, at ~1% relative error in the drafts' logits. Only drafts use it;
    verification never does."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, int8: bool) -> None:
        weight = weight.detach().float().contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.packed = None
        if int8:
            import warnings

            scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
            with warnings.catch_warnings():  # quantized tensors are deprecated upstream; torch is pinned (pyproject)
                warnings.simplefilter("ignore", UserWarning)
                q = torch.quantize_per_channel(weight, scales.double(), torch.zeros(len(scales), dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(q, self.bias)
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.quantized.linear_dynamic(x, self.packed)
        return torch.nn.functional.linear(x, self.weight, self.bias)


def _layer_norm(module: torch.nn.LayerNorm):
    """The module's layer norm as a float32 function (the module itself is left as it is: it may be shared)."""
    weight, bias = module.weight.detach().float(), module.bias.detach().float()
    return lambda x: torch.nn.functional.layer_norm(x, module.normalized_shape, weight, bias, module.eps)


def int8_available() -> bool:
    """Whether this torch build can run int8 dynamic-quantized linear layers (x86: fbgemm/onednn)."""
    return any(e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm"))


class WhisperDraftDecoder(WhisperDecoder):
    """A Whisper decoder used as an assistant (a ``WhisperForCausalLM`` reading the main encoder's output),
    run through a lean forward of its own layers: q, k and v projected by one fused matrix, the
    cross-attention keys and values computed once per request, no per-call module dispatch, and optionally
    int8 weights. The layer math is Whisper's (pre-norm; q scaled by head_dim^-1/2 before the product):
        x = x + W_o attn(LN1(x))            self-attention over the ragged cache
        x = x + W_o' attn(LN2(x), K_enc, V_enc)
        x = x + W_2 gelu(W_1 LN3(x) + b_1) + b_2
    then the final layer norm and the (draft-vocabulary) head. Its numerics only change which tokens are
    proposed; the main model's verification decides every output token."""

    def __init__(self, model, int8: bool = False) -> None:
        super().__init__(model)
        self.int8 = int8 and int8_available()
        self.dtype = torch.float32  # activations stay float32 (the int8 kernels take float32 inputs)
        self.row_stable, self.compact_at = False, 0.5  # drafts only propose: their rounding never decides
        dec = self.decoder
        self.heads = self.config.decoder_attention_heads
        self.embed, self.positions = dec.embed_tokens.weight.detach().float(), dec.embed_positions.weight.detach().float()
        self.norm = _layer_norm(dec.layer_norm)
        lin = lambda w, b=None: Linear(w, b, self.int8)  # noqa: E731
        self.layers = []
        for layer in dec.layers:
            a, c = layer.self_attn, layer.encoder_attn
            qkv_w = torch.cat([a.q_proj.weight * a.scaling, a.k_proj.weight, a.v_proj.weight])
            qkv_b = torch.cat([a.q_proj.bias * a.scaling, torch.zeros_like(a.v_proj.bias), a.v_proj.bias])
            self.layers.append({
                "ln1": _layer_norm(layer.self_attn_layer_norm), "qkv": lin(qkv_w, qkv_b), "o": lin(a.out_proj.weight, a.out_proj.bias),
                "ln2": _layer_norm(layer.encoder_attn_layer_norm), "q2": lin(c.q_proj.weight * c.scaling, c.q_proj.bias * c.scaling),
                "k2": lin(c.k_proj.weight), "v2": lin(c.v_proj.weight, c.v_proj.bias), "o2": lin(c.out_proj.weight, c.out_proj.bias),
                "ln3": _layer_norm(layer.final_layer_norm), "fc1": lin(layer.fc1.weight, layer.fc1.bias), "fc2": lin(layer.fc2.weight, layer.fc2.bias),
            })
        head = model.proj_out.weight
        if self.vocab_ids is not None:
            head = head.index_select(0, torch.tensor(self.vocab_ids, dtype=torch.long))
        self.head = lin(head)

    def forward(self, chunks: list[list[int]], cache: RaggedCache, enc: EncoderOutput | None, pad_id: int):
        ids, positions, real, allowed = cache.plan(chunks, pad_id, self.max_positions)
        store: LeanCache = cache.cache
        batch, n = ids.shape
        heads = self.heads
        split = lambda t: t.view(batch, t.shape[1], heads, -1).transpose(1, 2)  # noqa: E731  (B, T, D) -> (B, H, T, D/H)
        merge = lambda t: t.transpose(1, 2).reshape(batch, n, -1)  # noqa: E731
        if store.cross is None:
            hidden = enc.hidden.float()
            store.cross = [(split(layer["k2"](hidden)), split(layer["v2"](hidden))) for layer in self.layers]
        x = torch.nn.functional.embedding(ids, self.embed) + torch.nn.functional.embedding(positions, self.positions)
        cross_mask = None if enc.mask is None else enc.mask.bool()[:, None, None, :]
        for layer, kv, (cross_k, cross_v) in zip(self.layers, store.layers, store.cross):
            qkv = layer["qkv"](layer["ln1"](x)).view(batch, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
            kv.keys = qkv[1] if kv.keys is None else torch.cat([kv.keys, qkv[1]], dim=2)
            kv.values = qkv[2] if kv.values is None else torch.cat([kv.values, qkv[2]], dim=2)
            attn = torch.nn.functional.scaled_dot_product_attention(qkv[0], kv.keys, kv.values, attn_mask=allowed, scale=1.0)
            x = x + layer["o"](merge(attn))
            q = split(layer["q2"](layer["ln2"](x)))
            attn = torch.nn.functional.scaled_dot_product_attention(q, cross_k, cross_v, attn_mask=cross_mask, scale=1.0)
            x = x + layer["o2"](merge(attn))
            x = x + layer["fc2"](torch.nn.functional.gelu(layer["fc1"](layer["ln3"](x))))
        return self.head(self.norm(x)).float(), real


class BartFamilyDecoder(Decoder):
    """BART, mBART, Marian, M2M100/NLLB and Pegasus: the same decoder-layer template with different
    embeddings. Token and position embeddings are computed here (per-row positions), then the family's
    own layers, final layer norm and head run."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.decoder = model.get_decoder()
        self.kind = self.config.model_type
        self.embed_scale = getattr(self.decoder, "embed_scale", None)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> EncoderOutput:
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return EncoderOutput(hidden, attention_mask)

    def _positions(self, positions: torch.Tensor) -> torch.Tensor:
        emb = self.decoder.embed_positions
        if self.kind == "m2m_100":  # sinusoidal table offset by padding_idx + 1
            return emb.weights.index_select(0, (positions + emb.padding_idx + 1).view(-1)).view(*positions.shape, -1)
        offset = getattr(emb, "offset", 0)  # BART/mBART learned positions start at 2
        return torch.nn.functional.embedding(positions + offset, emb.weight)

    def _forward(self, ids, positions, mask, cache, enc):
        dec = self.decoder
        hidden = dec.embed_tokens(ids)
        if self.kind in ("marian", "pegasus"):  # these scale outside the embedding module
            hidden = hidden * self.embed_scale
        hidden = hidden + self._positions(positions).to(hidden.dtype)
        if getattr(dec, "layernorm_embedding", None) is not None:
            hidden = dec.layernorm_embedding(hidden)
        enc_mask = _encoder_mask(enc, ids.shape[1], self.dtype)
        for layer in dec.layers:
            hidden = layer(hidden, mask, enc.hidden, encoder_attention_mask=enc_mask, cache=cache, use_cache=True)
            if isinstance(hidden, tuple):
                hidden = hidden[0]
        if getattr(dec, "layer_norm", None) is not None:
            hidden = dec.layer_norm(hidden)
        logits = self.model.lm_head(hidden)
        bias = getattr(self.model, "final_logits_bias", None)
        return logits + bias.to(logits.dtype) if bias is not None else logits


class CausalDecoder(Decoder):
    """Decoder-only language models (Llama, Qwen, GPT-2, ...): position ids and 4-D masks are native."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.max_positions = getattr(self.config, "max_position_embeddings", None)

    @property
    def reads_encoder(self) -> bool:
        return False

    def _forward(self, ids, positions, mask, cache, enc):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        return out.logits


class T5Decoder(Decoder):
    """T5 / mT5 / Flan-T5: no absolute positions, but a relative position bias in self-attention. With holes
    in the cache the slot index is not the position, so the bias is computed here from each row's true
    positions: bias[b, h, q, s] = table[h, bucket(pos(s) - pos(q))], and handed to every layer."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.decoder = model.get_decoder()
        self.attention = self.decoder.block[0].layer[0].SelfAttention

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_) -> EncoderOutput:
        hidden = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return EncoderOutput(hidden, attention_mask)

    def _bias(self, positions: torch.Tensor) -> torch.Tensor:
        att = self.attention
        keys = torch.cat([self._ragged.slot_pos, positions], dim=1)  # (B, T + n)
        relative = keys[:, None, :] - positions[:, :, None]  # (B, n, T + n): memory - context
        buckets = att._relative_position_bucket(relative, bidirectional=False, num_buckets=att.relative_attention_num_buckets,
                                                max_distance=att.relative_attention_max_distance)
        return att.relative_attention_bias(buckets).permute(0, 3, 1, 2)  # (B, H, n, T + n)

    def _forward(self, ids, positions, mask, cache, enc):
        dec = self.decoder
        hidden = dec.embed_tokens(ids)
        bias = self._bias(positions).to(hidden.dtype)
        enc_mask = _encoder_mask(enc, ids.shape[1], self.dtype)
        for block in dec.block:
            hidden, _, _ = block(hidden, attention_mask=mask, position_bias=bias, encoder_hidden_states=enc.hidden,
                                 encoder_attention_mask=enc_mask, cache=cache, use_cache=True)
        hidden = dec.final_layer_norm(hidden)
        if getattr(self.config, "scale_decoder_outputs", False):
            hidden = hidden * (self.model.model_dim ** -0.5)
        return self.model.lm_head(hidden)


BART_FAMILY = ("bart", "mbart", "marian", "m2m_100", "pegasus", "nllb")


def as_decoder(model, assistant: bool = False, int8: bool = False) -> Decoder:
    """The adapter for ``model``'s family; unknown families are refused with the list of known ones.
    ``assistant``: the model only drafts, so a lean forward may serve it (Whisper), with int8 weights when
    ``int8`` (and the CPU supports them)."""
    kind = model.config.model_type
    if kind == "whisper":
        return WhisperDraftDecoder(model, int8) if assistant else WhisperDecoder(model)
    if kind in BART_FAMILY:
        return BartFamilyDecoder(model)
    if kind in ("t5", "mt5"):
        return T5Decoder(model)
    if not model.config.is_encoder_decoder:
        return CausalDecoder(model)
    raise TypeError(f"no engine adapter for {kind!r} encoder-decoder models (known: whisper, t5, mt5, {', '.join(BART_FAMILY)})")
