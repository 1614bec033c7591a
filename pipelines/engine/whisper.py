"""Whisper decoders: the main model's fixed-shape decoder (assisted output equal to plain by construction)
and the assistant's lean draft decoder.

The main decoder is a ``fixed.FixedShapeDecoder``: every token of a request is computed with the same
kernel calls and shapes, alone or in a verify pass (see ``fixed`` for why and how); here are Whisper's
layers (self-attention over the static cache, cross-attention over keys and values computed once per
request) and the pass shape per machine and dtype, chosen from measured step costs (``step_shape``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..devices import cpu_info
from ..models.quantize import quantized
from .cache import LeanCache, RaggedCache
from .decoders import Decoder, EncoderOutput
from .draft_cache import StaticDraftCache
from .fixed import FixedCache, FixedShapeDecoder
from .graphs import cross_graph
from .lean import LeanDecoder, Linear, int8_available  # noqa: F401  (int8_available: re-exported for tests)


@dataclass(frozen=True)
class StepShape:
    width: int  # columns per row in every main-decoder pass (the verify width one pass covers)
    head_transposed: bool  # the head as (W h^T)^T rather than h W^T (same bits per row either way, other speed)
    batch_rows: int | None = None  # from this many rows on, a request takes ``batch_width`` columns
    batch_width: int | None = None

    def width_for(self, rows: int) -> int:
        """The width of a request of ``rows`` rows (fixed for the whole request, plain or assisted alike)."""
        return self.batch_width if self.batch_rows is not None and rows >= self.batch_rows else self.width


# The shape per (CPU vendor, dtype): its bits are the same for plain and assisted decoding whatever it is, so
# it is chosen for speed, from a table (deterministic per machine kind; a timing probe could pick another
# shape from one run to the next and with it other bits). Whisper base + the shipped assistant, 2 threads:
# - AMD EPYC (AVX-512 BF16), one step of the decoder and its 51,865-token head by rows per product:
#   bfloat16 5.2 ms (1-2 rows), 5.6 (4), 6.7 (8); float32 with (W h^T)^T 8.7 ms (4 rows) against 12.4 for
#   transformers' one-row step: width 4 everywhere.
# - Intel Xeon with AMX: float32 products of 4 rows take 1.4-2.4x the time of one (the head 5.1 ms against
#   2.2; MKL's small-M path), so width 4 made plain steps 1.45x slower than width 1 (two speech-long
#   recordings, plain: 15.0-15.7 s at width 4, 10.7-10.9 s at width 1, 11.5-12.0 s at width 2 with h W^T;
#   assisted 9.3-9.9 s at width 4, 9.8 s at width 2): width 2. bfloat16 (AMX tiles): width 4, head (W h^T)^T
#   (1.5 ms against 2.0 for h W^T); plain speech-long 8.3-8.9 s (width 1: 9.1 s), assisted 5.9-6.1 s. In
#   batches of 8 (chunked long-form, all of speech-long) width 2 is faster both ways: plain 18.4-19.0 s
#   against 19.8-20.1 s at width 4, assisted 15.8-16.6 against 17.2-17.3; at 4 rows it is mixed (plain
#   24.8 against 26.4 s, assisted 21.2 against 20.6): width 2 from 8 rows on.
# - AMD EPYC with AVX2 only (no AVX-512; same vendor key): float32 products of 4 rows cost more than one, as
#   on Intel, but assisted decoding still gains most at width 4. Random weights, one row, oracle drafts of
#   acceptance 0.8, lookahead 3, 2 threads, plain / assisted s: base shapes, 64 tokens: width 1 3.38 / 6.59,
#   width 2 3.88 / 4.02, width 4 4.59 / 2.61; large-v3 shapes, 24 tokens: width 1 16.98 / 23.19, width 2
#   28.04 / 21.28, width 4 31.57 / 16.62. The width serves assisted decoding (plain and assisted share it, so
#   that their bits agree): width 4 kept; a plain-only run there is 1.36x slower than width 1 would be.
# - CUDA (H200, bfloat16, graphs): a pass of 8 columns costs what one of 4 does (whisper-large-v3's shapes:
#   5.44 against 5.39 ms), so one verify pass covers up to 7 drafts. Random weights, one row, 64 tokens,
#   oracle drafts of acceptance 0.8, s: large-v3 plain 0.41 at width 4, 0.40 at 8; assisted 1.82x over plain
#   at width 4 (lookahead 3), 1.91x at width 8 (lookahead 3), 2.11x (lookahead 5); base plain 0.10 / 0.09,
#   assisted 1.03x / 1.12x (lookahead 3): width 8.
# - AMD EPYC, float32, batches (a server's): one plain step of whisper base, 2 threads, the median of 12,
#   2026-12-07: 16 rows 130.6 ms at width 4, 82.5 at width 2, 61.8 at width 1; 5 rows 74.4 / 42.1 / 38.0 ms;
#   one row 28.4 / 20.5 / 22.7 ms. A width-2 pass of 16 rows verifying one draft (103.2 ms, 1.7 tokens a row
#   at acceptance 0.7) yields as much as a width-4 pass verifying three (141.0 ms, 2.5 tokens): width 2 from 8
#   rows on, as on Intel in bfloat16 (the CLI's default of 4 files keeps width 4).
# Elsewhere (other CPUs): width 4, as on AMD.
STEP_SHAPES = {
    ("GenuineIntel", torch.float32): StepShape(2, False),
    ("GenuineIntel", torch.bfloat16): StepShape(4, True, batch_rows=8, batch_width=2),
    ("AuthenticAMD", torch.float32): StepShape(4, True, batch_rows=8, batch_width=2),
}


CUDA_SHAPE = StepShape(8, False)  # every dtype and batch size (above)


def step_shape(dtype: torch.dtype, device: torch.device | str = "cpu") -> StepShape:
    """The main decoder's pass shape for ``dtype`` on ``device`` on this machine (see ``STEP_SHAPES``)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return CUDA_SHAPE
    if kind != "cpu":  # not measured: as an unknown CPU
        return StepShape(4, False)
    return STEP_SHAPES.get((cpu_info()[0], dtype), StepShape(4, dtype == torch.float32))


def _adopt_whisper(decoder: Decoder, model) -> None:
    """What both Whisper adapters read from the model: its decoder stack (WhisperForConditionalGeneration or
    WhisperForCausalLM), its position limit, and a distilled assistant's reduced head (``draft_vocab``)."""
    decoder.max_positions = decoder.config.max_target_positions
    decoder.decoder = model.model.decoder if hasattr(model.model, "decoder") else model.model
    vocab = getattr(decoder.config, "draft_vocab", None)
    if vocab:
        decoder.vocab_ids = tuple(sorted(vocab))


class WhisperDecoder(FixedShapeDecoder):
    """WhisperForConditionalGeneration (the main model) or WhisperForCausalLM, run with fixed shapes (see
    the module docstring) through the model's own modules and weights, in transformers' layer order (pre-norm
    layers, q scaled after its projection). ``forward`` takes ``need_from``: per row, the first chunk token
    whose logits the caller reads (tokens before it go through the prompt pass, without the head)."""

    def __init__(self, model, width: int | None = None) -> None:
        super().__init__(model)
        _adopt_whisper(self, model)
        self.heads = self.config.decoder_attention_heads
        self.shape = step_shape(self.dtype, self.device)
        self.width = width  # None: by the request's rows (``StepShape.width_for``)
        self.head_transposed = self.shape.head_transposed
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

    def new_cache(self, batch: int, capacity: int | None = None, shape_rows: int | None = None) -> FixedCache:
        """Always the model's 448 positions, and the width for ``batch`` rows, or for ``shape_rows`` when given (a
        continuous batch's: the rows it may grow to) (``StepShape.width_for``): the shape every pass of the
        request then shares."""
        d = self.config.d_model
        return self.make_cache(len(self.decoder.layers), batch, self.max_positions, self.heads, d // self.heads,
                               self.width or self.shape.width_for(shape_rows or batch))

    def _begin(self, cache: FixedCache, enc: EncoderOutput | None) -> None:
        """The request's cross-attention keys and values: with static writes (graphs.py) computed by a graph of
        their own into the cache's buffers (every request of a pooled cache, its first too, so that they have
        the same bits whichever request comes first); else computed and kept."""
        if not cache.needs_cross():
            return
        if cache.scratch is None:
            cache.set_cross([self._cross(layer, enc.hidden) for layer in self.decoder.layers])
            return
        if cache.cross_graph is None:
            projections = [(layer.encoder_attn.k_proj, layer.encoder_attn.v_proj) for layer in self.decoder.layers]
            cache.cross, cache.cross_graph = cross_graph(projections, self.heads, enc.hidden.shape, self.dtype,
                                                         self.device, self.graphs == "capture")
        cache.cross_graph(enc.hidden)
        cache.cross_filled()

    def _join_cross(self, cache: FixedCache, row: int, enc: EncoderOutput) -> None:
        """Slot ``row``'s cross-attention keys and values from the joining sequence's encoder output alone, written
        in place (the buffers a captured pass reads)."""
        for layer, (keys, values) in zip(self.decoder.layers, cache.cross):
            k, v = self._cross(layer, enc.hidden)
            keys[row : row + 1].copy_(k)
            values[row : row + 1].copy_(v)

    def _cross(self, layer, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = layer.encoder_attn
        return self._split(a.k_proj(hidden)), self._split(a.v_proj(hidden))

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, H, T, D/H), contiguous."""
        return t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2).contiguous()

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, write, cache: FixedCache) -> torch.Tensor:
        """The decoder layers over one tile of ids and positions (B, w) on the device: hidden states (B, w, D)
        after the final layer norm. The tile's keys and values are written to their slots (``writer``) before
        attention reads the cache."""
        dec, device = self.decoder, self.device
        store = self.writer(positions, write)
        # allowed[b, 0, c, s] = s <= position of column c: a query sees the slots up to its own position
        allowed = (torch.arange(cache.slot_count, device=device)[None, None, :] <= positions[:, :, None])[:, None]
        x = dec.embed_tokens(ids) + dec.embed_positions.weight[positions]
        for layer, keys, values, (cross_k, cross_v) in zip(dec.layers, cache.keys, cache.values, cache.cross):
            a, c = layer.self_attn, layer.encoder_attn
            h = layer.self_attn_layer_norm(x)
            q = self._split(a.q_proj(h) * a.scaling)
            k, v = self._split(a.k_proj(h)), self._split(a.v_proj(h))
            store(keys, k)
            store(values, v)
            x = x + a.out_proj(self.merge_heads(self.attend(q, keys, values, allowed)))
            q = self._split(c.q_proj(layer.encoder_attn_layer_norm(x)) * c.scaling)
            x = x + c.out_proj(self.merge_heads(self.attend(q, cross_k, cross_v, None)))
            x = x + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(x))))
        return dec.layer_norm(x)


class WhisperDraftDecoder(LeanDecoder):
    """A Whisper decoder used as an assistant (a ``WhisperForCausalLM`` reading the main encoder's output),
    run through a lean forward of its own layers: q, k and v projected by one fused matrix, the
    cross-attention keys and values computed once per request, no per-call module dispatch, and optionally
    int8 weights. The layer math is Whisper's (pre-norm; q scaled by head_dim^-1/2 before the product):
        x = x + W_o attn(LN1(x))            self-attention over its cache (ragged; static on CUDA)
        x = x + W_o' attn(LN2(x), K_enc, V_enc)
        x = x + W_2 gelu(W_1 LN3(x) + b_1) + b_2
    then the final layer norm and the (draft-vocabulary) head. Its numerics only change which tokens are
    proposed; the main model's verification decides every output token. ``dtype``: its weights' and
    activations' dtype; default float32 on a CPU (the int8 kernels take float32 inputs; int8 forces it) and
    the model's own elsewhere (on an H200 a float32 draft step took 0.60 ms of kernels at base shapes against
    a bfloat16 main step's 0.80; ``bench shapes --step-costs`` times both dtypes side by side). A model whose
    decoder linears ``models.quantize.quantize_model`` replaced (``--dtype int8``/``int4``) runs them as they are,
    q, k and v as three products, in the dtype it was quantized in (their kernels take it; ``int8`` is ignored)."""

    def __init__(self, model, int8: bool = False, dtype: torch.dtype | None = None) -> None:
        super().__init__(model)
        _adopt_whisper(self, model)
        dec = self.decoder
        weight_only = quantized(model) is not None
        self.int8 = int8 and not weight_only and int8_available(self.device)
        if weight_only:
            dtype = model.dtype
        elif self.int8 or (dtype is None and self.device.type == "cpu"):
            dtype = torch.float32
        self.dtype = dtype or model.dtype
        self.heads = self.kv_heads = self.config.decoder_attention_heads
        self.head_dim = self.config.d_model // self.heads
        self.embed = dec.embed_tokens.weight.detach().to(self.dtype)
        self.positions = dec.embed_positions.weight.detach().to(self.dtype)
        norm = lambda m: _layer_norm(m, self.dtype)  # noqa: E731
        self.norm = norm(dec.layer_norm)
        lin = lambda *modules, scale=1.0: _draft_linear(modules, scale, self.int8, self.dtype)  # noqa: E731
        self.layers = []
        for layer in dec.layers:
            a, c = layer.self_attn, layer.encoder_attn
            self.layers.append({
                "ln1": norm(layer.self_attn_layer_norm), "qkv": lin(a.q_proj, a.k_proj, a.v_proj, scale=a.scaling),
                "o": lin(a.out_proj), "ln2": norm(layer.encoder_attn_layer_norm), "q2": lin(c.q_proj, scale=c.scaling),
                "k2": lin(c.k_proj), "v2": lin(c.v_proj), "o2": lin(c.out_proj),
                "ln3": norm(layer.final_layer_norm), "fc1": lin(layer.fc1), "fc2": lin(layer.fc2),
            })
        head = model.proj_out.weight.detach()
        if self.vocab_ids is not None:
            head = head.index_select(0, torch.tensor(self.vocab_ids, dtype=torch.long, device=head.device))
        self.head = Linear(head, None, self.int8, self.dtype)

    @property
    def reads_encoder(self) -> bool:
        return True

    def ready(self, cache: RaggedCache | StaticDraftCache, enc: EncoderOutput | None) -> None:
        """The request's cross-attention keys and values, (B, H, T, D/H) a layer, from the encoder output
        (B, T, D), when ``cache`` has none yet: on a static cache by a graph of their own into its buffers
        (every request, its first too: the same kernels whichever comes first), else computed and kept."""
        if not cache.needs_cross() or enc is None:
            return
        if not isinstance(cache, StaticDraftCache):
            cache.set_cross(self._cross_pairs(enc))
            return
        if cache.cross_graph is None:
            projections = [(layer["k2"], layer["v2"]) for layer in self.layers]
            cache.cache.cross, cache.cross_graph = cross_graph(projections, self.heads, enc.hidden.shape, self.dtype,
                                                               self.device, self.graphs == "capture")
        cache.cross_graph(enc.hidden)  # (copied in: cast to the drafter's dtype)
        cache.cross_filled()

    def _cross_pairs(self, enc: EncoderOutput) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Cross-attention keys and values (B, H, T, D/H) a layer from the encoder output (B, T, D), in the
        drafter's dtype (a ragged cache's: computed eagerly)."""
        hidden = enc.hidden.to(self.dtype)
        split = lambda t: t.view(t.shape[0], t.shape[1], self.heads, -1).transpose(1, 2)  # noqa: E731
        return [(split(layer["k2"](hidden)), split(layer["v2"](hidden))) for layer in self.layers]

    def join_cross(self, cache: RaggedCache, row: int, enc: EncoderOutput) -> None:
        """Row ``row``'s cross-attention keys and values in a ragged cache from ``enc`` (1, T, D) alone, in place."""
        for (keys, values), (k, v) in zip(cache.cache.cross, self._cross_pairs(enc)):
            keys[row : row + 1].copy_(k)
            values[row : row + 1].copy_(v)

    def _step(self, ids: torch.Tensor, real: torch.Tensor, cache: RaggedCache | StaticDraftCache, enc: EncoderOutput | None):
        """Float32 logits (B, n, V') for the token ids (B, n) on the device and their real-token flags (B, n)
        (``Decoder.forward_ids``); ``enc`` is read only while the cache has no cross-attention yet."""
        positions, allowed = cache.plan(real, self.max_positions)
        store: LeanCache = cache.cache
        batch, n = ids.shape
        heads = self.heads
        split = lambda t: t.view(batch, t.shape[1], heads, -1).transpose(1, 2)  # noqa: E731  (B, T, D) -> (B, H, T, D/H)
        merge = lambda t: t.transpose(1, 2).reshape(batch, n, -1)  # noqa: E731
        self.ready(cache, enc)  # (the first step of a request only)
        x = torch.nn.functional.embedding(ids, self.embed) + torch.nn.functional.embedding(positions, self.positions)
        cross_mask = None if enc is None or enc.mask is None else enc.mask.bool()[:, None, None, :]
        for layer, kv, (cross_k, cross_v) in zip(self.layers, store.layers, store.cross):
            qkv = layer["qkv"](layer["ln1"](x)).view(batch, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
            cache.write(kv, qkv[1], qkv[2])
            attn = torch.nn.functional.scaled_dot_product_attention(qkv[0], kv.keys, kv.values, attn_mask=allowed, scale=1.0)
            x = x + layer["o"](merge(attn))
            q = split(layer["q2"](layer["ln2"](x)))
            attn = torch.nn.functional.scaled_dot_product_attention(q, cross_k, cross_v, attn_mask=cross_mask, scale=1.0)
            x = x + layer["o2"](merge(attn))
            x = x + layer["fc2"](torch.nn.functional.gelu(layer["fc1"](layer["ln3"](x))))
        return self.head(self.norm(x)).float(), real


def _draft_linear(modules: tuple, scale: float, int8: bool, dtype: torch.dtype):
    """One product over ``modules`` side by side, the first's output times ``scale``: y = [s (x W_1^T + b_1),
    x W_2^T + b_2, ...] (a missing bias is zeros). ``nn.Linear`` modules: their weights concatenated into one
    lean ``Linear`` (s folded into W_1 and b_1); weight-only quantized ones (``models.quantize``): each run as
    it is, the outputs concatenated."""
    if not all(isinstance(m, torch.nn.Linear) for m in modules):
        def run(x: torch.Tensor) -> torch.Tensor:
            outs = [m(x) for m in modules]
            if scale != 1.0:
                outs[0] = outs[0] * scale
            return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]
        return run
    scales = [scale] + [1.0] * (len(modules) - 1)
    weight = torch.cat([m.weight * s for m, s in zip(modules, scales)])
    bias = None
    if any(m.bias is not None for m in modules):
        bias = torch.cat([torch.zeros_like(m.weight[:, 0]) if m.bias is None else m.bias * s for m, s in zip(modules, scales)])
    return Linear(weight, bias, int8, dtype)


def _layer_norm(module: torch.nn.LayerNorm, dtype: torch.dtype = torch.float32):
    """The module's layer norm as a function in ``dtype`` (the module itself is left as it is: it may be shared)."""
    weight, bias = module.weight.detach().to(dtype), module.bias.detach().to(dtype)
    return lambda x: torch.nn.functional.layer_norm(x, module.normalized_shape, weight, bias, module.eps)
