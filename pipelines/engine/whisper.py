"""Whisper decoders: the main model's fixed-shape decoder (assisted output equal to plain by construction)
and the assistant's lean draft decoder.

Why fixed shapes. A matrix product's bits for one row depend on the product's shape: a one-row product
takes another kernel than a many-row one, kernels pick their blocking from the shape, attention over a
longer key axis sums in another order. A verify pass over k + 1 tokens would then give a token other logits
than a one-token step, and assisted output could depart from plain output (below float32 often, in float32
at rare near-ties), depending on which kernels a machine happens to pick (Intel AMX, AMD AVX-512, cuBLAS).

So ``WhisperDecoder`` computes every token of a request with the same arithmetic, whether it comes alone
(plain decoding) or in a verify pass:
    - every pass feeds a tile of ``width`` (W) columns per row, padded (a plain step is a verify pass of
      one token padded to W; a verify pass over more than W tokens takes several passes);
    - the batch keeps all its rows until the request ends (finished rows are fed padding), so every
      product of a request has the same shape, (B * W, D) x (D, N), whatever the lookahead;
    - keys and values live in a static cache whose slot is the true position (capacity: the model's
      448 positions): a rejected draft's slot is simply written again later, so there are no holes;
    - attention scores a query against all slots, sets slots after its position to -inf and takes a
      float32 softmax over that fixed length: the masked terms are exact zeros in the same places
      whatever the slots hold, so a query's probabilities and its weighted sum of values have the same
      bits in every run;
    - the prompt tokens whose logits nobody reads (all but the last) go through one pass of their own
      (its shape is the same in the plain and the assisted run of a request: they start alike).
Each token's logits are then computed by the same kernel calls with the same shapes on the same inputs,
in any dtype and on any device with deterministic kernels: no probe decides it. What remains assumed is
that within one product a row's bits do not depend on which row of the tile it occupies (true of every
GEMM tiling: all rows of a product share one algorithm, blocking and reduction order); the exactness tests
check the whole property on the real model. The price is the padded columns of a plain step and verify
passes split at W; ``width`` is chosen per dtype from measured step costs (``default_width``).
"""

from __future__ import annotations

import torch

from .cache import LeanCache, RaggedCache
from .decoders import Decoder, EncoderOutput

# Step cost of Whisper base's decoder (6 layers + the 51,865-token head), 2 threads, by rows per product,
# measured on a 2-core AMD EPYC (AVX-512 BF16), milliseconds: bfloat16 5.2 (1-2 rows), 5.6 (4), 6.7 (8);
# float32 with the head as W_head x^T 8.7 (4 rows) against 12.4 for transformers' one-row step.
WIDTHS = {torch.float32: 4, torch.bfloat16: 4, torch.float16: 4}


def default_width(dtype: torch.dtype) -> int:
    """Columns per row in every main-decoder pass for ``dtype`` (the verify width one pass covers)."""
    return WIDTHS.get(dtype, 4)


def _adopt_whisper(decoder: Decoder, model) -> None:
    """What both Whisper adapters read from the model: its decoder stack (WhisperForConditionalGeneration or
    WhisperForCausalLM), its position limit, and a distilled assistant's reduced head (``draft_vocab``)."""
    decoder.max_positions = decoder.config.max_target_positions
    decoder.decoder = model.model.decoder if hasattr(model.model, "decoder") else model.model
    vocab = getattr(decoder.config, "draft_vocab", None)
    if vocab:
        decoder.vocab_ids = tuple(sorted(vocab))


class FixedCache:
    """The main Whisper decoder's keys and values, (B, heads, capacity, head_dim) per layer, slot = true
    position; the cross-attention keys and values, computed once from the encoder output; and per row the
    next true position. Nothing is ever moved or compacted."""

    def __init__(self, layers: int, batch: int, capacity: int, heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (batch, heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.next_pos = [0] * batch
        self.capacity, self.device = capacity, device

    def commit(self, keep: torch.Tensor) -> None:
        """After a forward call: ``keep`` (B, n) marks the chunk's tokens that were accepted."""
        self.next_pos = [p + n for p, n in zip(self.next_pos, keep.sum(dim=1).tolist())]

    def rollback(self, row: int, n: int) -> None:
        """Forget the last ``n`` tokens of ``row`` (their slots are written again by the next tokens)."""
        self.next_pos[row] -= max(0, n)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (an assistant's cache; the main decoder keeps its batch whole)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        if self.cross is not None:
            self.cross = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross]
        self.next_pos = [self.next_pos[i] for i in rows.tolist()]

    def maybe_compact(self, threshold: float = 0.5) -> None:
        """Nothing to compact: a static cache has no holes."""


class WhisperDecoder(Decoder):
    """WhisperForConditionalGeneration (the main model) or WhisperForCausalLM, run with fixed shapes (see
    the module docstring) through the model's own modules and weights, in transformers' layer order (pre-norm
    layers, q scaled after its projection). ``forward`` takes ``need_from``: per row, the first chunk token
    whose logits the caller reads (tokens before it go through the prompt pass, without the head)."""

    fixed_batch = True  # the engine keeps finished rows in the batch (shapes stay fixed for the request)

    def __init__(self, model, width: int | None = None) -> None:
        super().__init__(model)
        _adopt_whisper(self, model)
        self.heads = self.config.decoder_attention_heads
        self.width = width or default_width(self.dtype)
        weight = model.proj_out.weight
        if self.vocab_ids is not None:
            weight = weight.index_select(0, torch.tensor(self.vocab_ids, dtype=torch.long, device=weight.device))
        self.head_weight = weight.detach().contiguous()

    @property
    def reads_encoder(self) -> bool:
        return True

    def encode(self, input_features: torch.Tensor, **_) -> EncoderOutput:
        hidden = self.model.model.encoder(input_features.to(device=self.device, dtype=self.dtype)).last_hidden_state
        return EncoderOutput(hidden, None)

    def new_cache(self, batch: int) -> FixedCache:
        d = self.config.d_model
        return FixedCache(len(self.decoder.layers), batch, self.max_positions, self.heads, d // self.heads, self.dtype,
                          self.device)

    def forward(self, chunks: list[list[int]], cache: FixedCache, enc: EncoderOutput | None, pad_id: int,
                need_from: list[int] | None = None):
        """Logits (B, n, V) float32 for ``chunks`` (one list of new tokens per row, n the longest), and the
        real-token flags (B, n). Columns not computed (before ``need_from[b]``, past a row's chunk) are 0."""
        batch, n = len(chunks), max(1, max(len(c) for c in chunks))
        real = torch.zeros(batch, n, dtype=torch.bool)
        for b, c in enumerate(chunks):
            real[b, : len(c)] = True
        need = [min(max(0, f), len(c)) for f, c in zip(need_from or [0] * batch, chunks)]
        if cache.cross is None:
            cache.cross = [self._cross(layer, enc.hidden) for layer in self.decoder.layers]
        self._prefill(chunks, need, cache, pad_id)
        logits = torch.zeros(batch, n, self.head_weight.shape[0])
        for ids, positions, where in self._blocks(chunks, need, cache.next_pos, pad_id):
            hidden = self._layers(ids, positions, where, cache)
            out = self._head(hidden).float().view(batch, self.width, -1).cpu()
            for b, col, j in where:
                logits[b, j] = out[b, col]
        return logits, real

    def _prefill(self, chunks: list[list[int]], need: list[int], cache: FixedCache, pad_id: int) -> None:
        """Tokens before ``need[b]`` (a prompt but its last token) in one pass of width max(need), no head."""
        width = max(need)
        if not width:
            return
        ids = torch.full((len(chunks), width), pad_id, dtype=torch.long)
        positions = torch.zeros(len(chunks), width, dtype=torch.long)
        where = []
        for b, (c, m) in enumerate(zip(chunks, need)):
            start = cache.next_pos[b]
            positions[b] = torch.arange(start, start + width).clamp(max=self.max_positions - 1)
            ids[b, :m] = torch.tensor(c[:m], dtype=torch.long)
            where += [(b, j, j) for j in range(m)]
        self._layers(ids, positions, where, cache)

    def _blocks(self, chunks: list[list[int]], need: list[int], next_pos: list[int], pad_id: int):
        """The W-wide passes over the tokens from ``need[b]`` on: pass i holds chunk tokens need + i W ...
        need + (i + 1) W - 1 of every row from column 0, padding after. Yields (ids (B, W), positions (B, W),
        where = [(row, column, chunk index)] of the real tokens)."""
        w = self.width
        passes = max(-(-(len(c) - m) // w) for c, m in zip(chunks, need))
        for i in range(passes):
            ids = torch.full((len(chunks), w), pad_id, dtype=torch.long)
            positions = torch.arange(w).repeat(len(chunks), 1)
            where = []
            for b, (c, start) in enumerate(zip(chunks, next_pos)):
                first = need[b] + i * w  # chunk index of column 0
                if first >= len(c):
                    continue
                positions[b] = torch.arange(start + first, start + first + w).clamp(max=self.max_positions - 1)
                for col in range(min(w, len(c) - first)):
                    ids[b, col] = c[first + col]
                    where.append((b, col, first + col))
            yield ids, positions, where

    def _cross(self, layer, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = layer.encoder_attn
        return self._split(a.k_proj(hidden)), self._split(a.v_proj(hidden))

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, H, T, D/H), contiguous."""
        return t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2).contiguous()

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, where: list[tuple[int, int, int]],
                cache: FixedCache) -> torch.Tensor:
        """The decoder layers over one tile (B, w): hidden states (B, w, D) after the final layer norm. The
        real tokens' keys and values are written to their slots before attention reads the cache."""
        dec, device = self.decoder, self.device
        ids, positions = ids.to(device), positions.to(device)
        batch, w = ids.shape
        rows = torch.tensor([b for b, _, _ in where], dtype=torch.long, device=device)
        cols = torch.tensor([c for _, c, _ in where], dtype=torch.long, device=device)
        slots = positions[rows, cols]
        # allowed[b, 0, c, s] = s <= position of column c: a query sees the slots up to its own position
        allowed = (torch.arange(cache.capacity, device=device)[None, None, :] <= positions[:, :, None])[:, None]
        x = dec.embed_tokens(ids) + dec.embed_positions.weight[positions]
        for layer, keys, values, (cross_k, cross_v) in zip(dec.layers, cache.keys, cache.values, cache.cross):
            a, c = layer.self_attn, layer.encoder_attn
            h = layer.self_attn_layer_norm(x)
            q = self._split(a.q_proj(h) * a.scaling)
            k, v = self._split(a.k_proj(h)), self._split(a.v_proj(h))
            keys[rows, :, slots] = k[rows, :, cols]
            values[rows, :, slots] = v[rows, :, cols]
            x = x + a.out_proj(self._attend(q, keys, values, allowed))
            q = self._split(c.q_proj(layer.encoder_attn_layer_norm(x)) * c.scaling)
            x = x + c.out_proj(self._attend(q, cross_k, cross_v, None))
            x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        return dec.layer_norm(x)

    @staticmethod
    def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """softmax(q k^T) v per head over every slot (q already scaled), slots not ``allowed`` at -inf, the
        softmax in float32: (B, H, w, Dh) -> (B, w, D)."""
        scores = torch.matmul(q, k.transpose(-1, -2)).float()
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
        batch, heads, w, dim = out.shape
        return out.transpose(1, 2).reshape(batch, w, heads * dim)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (B * w, V) = h W^T over the head's rows (a draft vocabulary K: column c is token K[c]; the
        main model always scores the whole vocabulary). In float32 computed as (W h^T)^T, which this CPU's
        BLAS runs 2-4 times faster at 2-8 rows than h W^T; either way each row's bits depend only on it."""
        h = hidden.reshape(-1, hidden.shape[-1])
        if h.dtype == torch.float32:
            return torch.mm(self.head_weight, h.t()).t()
        return torch.nn.functional.linear(h, self.head_weight)


class WhisperDraftDecoder(Decoder):
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
        _adopt_whisper(self, model)
        dec = self.decoder
        self.int8 = int8 and int8_available()
        self.dtype = torch.float32  # activations stay float32 (the int8 kernels take float32 inputs)
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
        head = model.proj_out.weight.detach()
        if self.vocab_ids is not None:
            head = head.index_select(0, torch.tensor(self.vocab_ids, dtype=torch.long))
        self.head = lin(head)

    @property
    def reads_encoder(self) -> bool:
        return True

    def new_cache(self, batch: int) -> RaggedCache:
        return RaggedCache(LeanCache(len(self.layers)), batch, self.device)

    def forward(self, chunks: list[list[int]], cache: RaggedCache, enc: EncoderOutput | None, pad_id: int,
                need_from: list[int] | None = None):
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
