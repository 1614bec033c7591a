"""Pieces of the lean draft decoders (``whisper.WhisperDraftDecoder``, ``causal_draft.CausalDraftDecoder``):
linear layers with optional int8 weights. Drafts only: the main model's verification never runs them."""

from __future__ import annotations

import torch

from .cache import LeanCache, RaggedCache
from .decoders import Decoder


class LeanDecoder(Decoder):
    """A draft decoder that runs its own layers (``self.layers``, one entry per layer) over a ``LeanCache``
    inside the ragged cache: rejected drafts become holes, finished rows leave the batch."""

    layers: list

    def new_cache(self, batch: int, capacity: int | None = None) -> RaggedCache:
        return RaggedCache(LeanCache(len(self.layers)), batch, self.device)

    @staticmethod
    def append(kv, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add a chunk's keys and values (B, heads, n, Dh) after the layer's cached ones."""
        kv.keys = keys if kv.keys is None else torch.cat([kv.keys, keys], dim=2)
        kv.values = values if kv.values is None else torch.cat([kv.values, values], dim=2)


class Linear:
    """y = x W^T + b, with W kept in float32 or, for an assistant, as int8 per output channel
    (W ~ s_o * Q_o, Q_o in [-127, 127], dynamic quantization of x per call, to 7 bits as torch's own dynamic
    ``Linear`` does (``reduce_range``): fbgemm's u8 x s8 kernels add pairs of products in int16, which saturates
    with 8-bit activations on processors without VNNI dot products, e.g. these AMD EPYCs: logits' cosine to
    float32 0.57-0.76 on a random Llama there, 0.99 with it): about 2.5 times less time per
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
            return torch.ops.quantized.linear_dynamic(x, self.packed, reduce_range=True)
        return torch.nn.functional.linear(x, self.weight, self.bias)


def int8_available(device: torch.device | str = "cpu") -> bool:
    """Whether int8 dynamic-quantized linear layers can run on ``device``: a CPU (the kernels are CPU-only)
    and a torch build with the x86 (fbgemm/onednn) engine. Elsewhere drafters keep their float weights."""
    if torch.device(device).type != "cpu":
        return False
    return any(e in torch.backends.quantized.supported_engines for e in ("x86", "fbgemm"))
