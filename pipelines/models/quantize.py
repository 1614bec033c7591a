"""Weight-only quantized linear layers for the CPU: int8 (one scale per output channel) and int4 (a scale and
an offset per group of ``group_size`` inputs), run by torch's own CPU kernels, activations unquantized.

Why weight-only. Decoding on a CPU reads every weight once a step: a 1.5B model's bfloat16 linears are ~2.6 GB
a step, their int4 form ~0.7 GB. Only the weights shrink; the activations stay in the compute dtype (bfloat16
where the CPU multiplies it natively, else float32) and no scale is ever computed from them, so no value of
one row (one token) reaches another row's arithmetic. That keeps the property the fixed-shape decoders need
(``engine/fixed.py``): a row's output has the same bits whether it is computed alone or inside a pass of
several rows, so a verify pass gives each token the logits a plain step gives it. Measured on a 2-core AMD EPYC
(AVX-512 bf16), torch 2.13: both kernels give a row the same bits alone as inside any batch of 1 to 8 rows,
where bfloat16 ``F.linear`` does not (docs/benchmarks.md); ``tests/test_quantize.py`` checks it on every run.

Kernels (torch ATen, maintained upstream; the ops torchao's int8/int4 weight-only CPU configs call):
    int8: ``aten._weight_int8pack_mm(x (M, K), W_q (N, K) int8, s (N,))`` = x (s * W_q)^T
    int4: ``aten._convert_weight_to_int4pack_for_cpu(W_q (N, K) int32 in [0, 15], 1)`` packs the weights;
          ``aten._weight_int4pack_mm_for_cpu(x (M, K), packed, group_size, sz (K / group_size, N, 2))``
          computes x W^T with W[n, k] = (W_q[n, k] - 8) * sz[g, n, 0] + sz[g, n, 1], g = k // group_size.
Rounding: int8 symmetric per channel (s = max |W| / 127, W_q = round(W / s)); int4 asymmetric per group
(scale = (max - min) / 15, W_q = round((W - min) / scale), offset = min + 8 * scale), as torchao's
``Int4WeightOnlyConfig`` rounds. These are not llama.cpp's Q4_K / Q6_K blocks: the GGUF's weights are first
dequantized by transformers (``embedded_gguf.py``) and then quantized again here, so the numbers differ from
llama.cpp's by a second rounding.

Many rows at once (the prompt pass). Both kernels compute a tile of 4 rows at a time and unpack the weights
again for every tile, so a pass of hundreds of rows costs 2.5-4x a bfloat16 GEMM (one 8960 x 1536 projection,
310 rows, 1 thread: int4 101 ms, int8 166 ms, bfloat16 42 ms). A product of at least ``dense_rows`` rows
therefore runs ``F.linear`` on the layer's weights dequantized on the fly to the compute dtype (int4 ~14 ms for
that matrix, int8 ~4 ms; one layer's dense copy lives only for the product, no second copy of the model is
kept). Which path a row takes depends only on its pass's row count, and the fixed-shape decoders give a
request's plain and assisted runs the same shapes (the prompt pass alike, every later pass B x W rows), so
assisted output stays equal to plain output; the prompt's keys and values are the dequantized weights' (the
same numbers as the kernel's, rounded once more to the compute dtype).

What is quantized: every ``nn.Linear`` of the decoder whose shape the kernel takes (int4: output features a
multiple of 16 and input features a multiple of ``group_size``; others stay as they are). The embeddings and
the output head (``lm_head``, Whisper's ``proj_out``) are left in the compute dtype: the fixed-shape decoders
read the head's weight directly (``engine/fixed.py``), and Qwen2.5's and Whisper's heads are tied to their
embedding tables. So is an encoder (Whisper's): it runs once per request over 1,500 frames a window, a product
of thousands of rows, which would take the dense path above and pay a dequantization per call for nothing;
its weights are read once per window, not once per token, so their bytes are not what decoding waits on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..devices import TORCH_WEIGHT_DTYPES

GROUP_SIZES = (32, 64, 128)  # the int4 kernel's group sizes
INT4_N_MULTIPLE = 16  # the int4 packing's output-feature granularity
# rows from which a product runs on dequantized weights (module docstring): where the kernel's time passes
# the dequantization's plus bfloat16's (1 thread, 8960 x 1536: int8 at 32 rows 14 ms against 6 + 4;
# int4 at 64 rows 21 ms against 10 + 14, at 128 rows 42 against 18 + 14)
DENSE_ROWS = {"int8": 32, "int4": 96}
# int4 packings of torch's CPU kernel (aten int4mm_kernel.cpp), by ISA: output features in blocks of BLOCK_N,
# each block stored (K, BLOCK_N / 2) bytes; "lanes": a byte holds features j and j + BLOCK_N / 2 of its block
# (AVX-512: 64, AVX2: 32), "pairs": features 2j and 2j + 1 (a short last block; the scalar build). Which one this
# torch uses is found once by packing a probe (``int4_layout``).
INT4_LAYOUTS = ((64, "lanes"), (32, "lanes"), (32, "pairs"), (64, "pairs"))
_layout_found: list = []
SKIP = ("lm_head", "proj_out", "encoder")  # left in the compute dtype: the heads, an encoder (module docstring)


@dataclass(frozen=True)
class QuantizeOptions:
    """How ``quantize_model`` stores the weights: ``dtype`` int8 or int4; ``group_size`` inputs per int4 scale
    (32, 64 or 128; smaller groups: closer to the bfloat16 weights, slightly more to read); ``skip``: module
    names (any dotted part of a layer's name: the module and everything under it) left unquantized, by default
    the output heads and an encoder (module docstring); ``dense_rows``: products of at least this many rows run
    ``F.linear`` on weights dequantized per call (default ``DENSE_ROWS[dtype]``, 0: always the kernel)."""

    dtype: str = "int4"
    group_size: int = 32
    skip: tuple[str, ...] = SKIP
    dense_rows: int | None = None  # products of this many rows run on dequantized weights (None: DENSE_ROWS's; 0: never)

    def __post_init__(self) -> None:
        if self.dtype not in TORCH_WEIGHT_DTYPES:
            raise ValueError(f"weight dtype {self.dtype!r}: expected one of {', '.join(TORCH_WEIGHT_DTYPES)}")
        if self.dtype == "int4" and self.group_size not in GROUP_SIZES:
            raise ValueError(f"int4 group size {self.group_size}: expected one of {GROUP_SIZES}")
        if self.dense_rows is not None and self.dense_rows < 0:
            raise ValueError(f"dense rows {self.dense_rows}: expected 0 (never) or more")

    @property
    def dense_from(self) -> int:
        """Rows from which a product runs on dequantized weights (0: never)."""
        return DENSE_ROWS[self.dtype] if self.dense_rows is None else self.dense_rows


def supports(linear: nn.Linear, options: QuantizeOptions) -> bool:
    """Whether the kernel of ``options.dtype`` takes ``linear``'s (out, in) shape."""
    if options.dtype == "int8":
        return True
    return linear.out_features % INT4_N_MULTIPLE == 0 and linear.in_features % options.group_size == 0


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_q (N, K) int8 in [-127, 127], s (N,) float32) with W ~ s[:, None] * W_q, for ``weight`` (N, K)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_q (N, K) int32 in [0, 15], sz (K / group_size, N, 2) float32: scale and offset) with
    W[n, k] ~ (W_q[n, k] - 8) * scale + offset over each group of ``group_size`` inputs (module docstring)."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)
    low, high = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((high - low) / 15).clamp(min=1e-12)
    q = torch.round((w - low[..., None]) / scales[..., None]).clamp(0, 15).to(torch.int32).reshape(n, k)
    offsets = low + 8 * scales
    return q, torch.stack([scales, offsets], dim=-1).transpose(0, 1).contiguous()


def unpack_int4(packed: torch.Tensor, n: int, k: int, block: int, kind: str) -> torch.Tensor:
    """The int4 values (K, N) uint8 in [0, 15] of ``packed`` ((N, K / 2) uint8, torch's CPU packing of W_q (N, K)),
    read in the layout ``(block, kind)`` (``INT4_LAYOUTS``): transposed, as the dense product reads them."""
    flat, full = packed.reshape(-1), n // block * block
    parts = []
    if full:
        b = flat[: full * k // 2].view(full // block, k, block // 2)
        low, high = b & 15, b >> 4
        cols = torch.cat([low, high], -1) if kind == "lanes" else torch.stack([low, high], -1).flatten(-2)
        parts.append(cols.permute(1, 0, 2).reshape(k, full))
    if n > full:  # the last, short block: pairs
        b = flat[full * k // 2 :].view(k, (n - full) // 2)
        parts.append(torch.stack([b & 15, b >> 4], -1).reshape(k, n - full))
    return torch.cat(parts, 1) if len(parts) > 1 else parts[0]


def int4_layout() -> tuple[int, str] | None:
    """This torch's int4 packing among ``INT4_LAYOUTS``, found once by packing a probe of 80 x 64 values (two
    blocks of 32 or one of 64, and a short one) and reading it back; None if none reads it back (int4 products
    then always run the kernel)."""
    if not _layout_found:
        n, k = 80, 64
        q = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        expected = q.t().to(torch.uint8)
        found = [lay for lay in INT4_LAYOUTS if torch.equal(unpack_int4(packed, n, k, *lay), expected)]
        _layout_found.append(found[0] if found else None)
    return _layout_found[0]


class WeightOnlyLinear(nn.Module):
    """``y = x W^T + b`` with W stored as int8 or int4 (module docstring), for x (..., K) in the compute dtype
    (the replaced layer's: bfloat16 or float32), y (..., N) in the same dtype. Built from an ``nn.Linear`` on
    the CPU; the bias stays in the compute dtype and is added after the product. A product of at least
    ``options.dense_from`` rows runs on the weights dequantized for it (``dense_weight``)."""

    def __init__(self, linear: nn.Linear, options: QuantizeOptions) -> None:
        super().__init__()
        if linear.weight.device.type != "cpu":
            raise ValueError("weight-only int8/int4 layers run on a CPU only (torch's kernels are CPU kernels)")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.options = options
        dtype = linear.weight.dtype
        if options.dtype == "int8":
            q, scales = quantize_int8(linear.weight)
            self.register_buffer("packed", q)
            self.register_buffer("scales", scales.to(dtype))
        else:
            q, sz = quantize_int4(linear.weight, options.group_size)
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1))
            self.register_buffer("scales", sz.to(dtype))
            # the kernel's scales and offsets as the dense form reads them: (2, K / group_size, N)
            self.register_buffer("dense_sz", self.scales.permute(2, 0, 1).contiguous())
        self.layout = int4_layout() if options.dtype == "int4" else None
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype))

    def dense_weight(self) -> torch.Tensor:
        """The weights dequantized to the compute dtype: W (N, K) for int8, W^T (K, N) for int4 (as unpacked;
        the product reads either). int8: W = s W_q; int4: W^T = (W_q^T - 8) scale + offset per group, the
        kernel's own arithmetic (W_q - 8 is exact in bfloat16): the same weights as the kernel's, bit for bit."""
        if self.options.dtype == "int8":
            return self.packed.to(self.scales.dtype) * self.scales[:, None]
        n, k, g = self.out_features, self.in_features, self.options.group_size
        q = unpack_int4(self.packed, n, k, *self.layout).view(k // g, g, n).to(self.dense_sz.dtype).sub_(8)
        return torch.addcmul(self.dense_sz[1][:, None], q, self.dense_sz[0][:, None]).view(k, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        dense = self.options.dense_from
        if dense and rows.shape[0] >= dense and (self.options.dtype == "int8" or self.layout is not None):
            w = self.dense_weight()
            y = torch.nn.functional.linear(rows, w) if self.options.dtype == "int8" else rows @ w
        elif self.options.dtype == "int8":
            y = torch.ops.aten._weight_int8pack_mm(rows, self.packed, self.scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, self.options.group_size, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        group = f", group_size={self.options.group_size}" if self.options.dtype == "int4" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.options.dtype}{group}"


def quantize_model(model: nn.Module, dtype: str = "int4", group_size: int = 32,
                   skip: tuple[str, ...] = SKIP, dense_rows: int | None = None) -> int:
    """Replace ``model``'s ``nn.Linear`` layers (but those with a part of their name in ``skip``, e.g. under
    ``encoder``, and those whose shape the kernel does not take) by ``WeightOnlyLinear`` in place, layer by
    layer (the float weights of a layer are freed as it is replaced); record the options as
    ``model.tandem_quantized``. Returns the number of layers replaced. The model must be on the CPU, in its
    compute dtype (bfloat16 or float32). A Llama-layout model: its decoder layers' 7 projections each; Whisper
    (``WhisperForConditionalGeneration`` or ``WhisperForCausalLM``): its decoder layers' 10 each."""
    options = QuantizeOptions(dtype, group_size, tuple(skip), dense_rows)
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and not set(name.split(".")) & set(options.skip)
               and supports(module, options)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, WeightOnlyLinear(module, options))
    model.tandem_quantized = options
    return len(targets)


def quantized(model: nn.Module) -> QuantizeOptions | None:
    """The options ``quantize_model`` applied to ``model``, or None for a model it has not quantized."""
    return getattr(model, "tandem_quantized", None)
