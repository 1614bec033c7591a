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

What is quantized: every ``nn.Linear`` of the decoder whose shape the kernel takes (int4: output features a
multiple of 16 and input features a multiple of ``group_size``; others stay as they are). The embeddings and
the output head are left in the compute dtype: the fixed-shape decoders read the head's weight directly
(``engine/fixed.py``), and Qwen2.5's head is tied to its embedding table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..devices import WEIGHT_DTYPES

GROUP_SIZES = (32, 64, 128)  # the int4 kernel's group sizes
INT4_N_MULTIPLE = 16  # the int4 packing's output-feature granularity


@dataclass(frozen=True)
class QuantizeOptions:
    """How ``quantize_model`` stores the weights: ``dtype`` int8 or int4; ``group_size`` inputs per int4 scale
    (32, 64 or 128; smaller groups: closer to the bfloat16 weights, slightly more to read); ``skip``: module
    names (the last dotted part) left unquantized."""

    dtype: str = "int4"
    group_size: int = 32
    skip: tuple[str, ...] = ("lm_head",)

    def __post_init__(self) -> None:
        if self.dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight dtype {self.dtype!r}: expected one of {', '.join(WEIGHT_DTYPES)}")
        if self.dtype == "int4" and self.group_size not in GROUP_SIZES:
            raise ValueError(f"int4 group size {self.group_size}: expected one of {GROUP_SIZES}")


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


class WeightOnlyLinear(nn.Module):
    """``y = x W^T + b`` with W stored as int8 or int4 (module docstring), for x (..., K) in the compute dtype
    (the replaced layer's: bfloat16 or float32), y (..., N) in the same dtype. Built from an ``nn.Linear`` on
    the CPU; the bias stays in the compute dtype and is added after the product."""

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
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.options.dtype == "int8":
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
                   skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace ``model``'s ``nn.Linear`` layers (but those named in ``skip`` and those whose shape the kernel
    does not take) by ``WeightOnlyLinear`` in place, layer by layer (the float weights of a layer are freed as
    it is replaced); record the options as ``model.tandem_quantized``. Returns the number of layers replaced.
    The model must be on the CPU, in its compute dtype (bfloat16 or float32)."""
    options = QuantizeOptions(dtype, group_size, tuple(skip))
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] not in options.skip and supports(module, options)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, WeightOnlyLinear(module, options))
    model.tandem_quantized = options
    return len(targets)


def quantized(model: nn.Module) -> QuantizeOptions | None:
    """The options ``quantize_model`` applied to ``model``, or None for a model it has not quantized."""
    return getattr(model, "tandem_quantized", None)
