"""Pieces of the lean draft decoders (``whisper.WhisperDraftDecoder``, ``causal_draft.CausalDraftDecoder``):
their base class (a ragged cache on a CPU, a static one with CUDA graphs on CUDA) and linear layers with
optional int8 weights. Drafts only: the main model's verification never runs them."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .cache import EncoderOutput, LeanCache, RaggedCache
from .decoders import Decoder
from .draft_cache import FEED_WIDTHS, StaticDraftCache
from .graphs import GraphPool, graphs_enabled

# The attention kernels a draft step may take on CUDA: not cuDNN's, torch's first choice in half precision on
# recent GPUs, which builds an execution plan for every new shape. A draft's eager steps meet a new key length
# at every call (a ragged cache, a prompt, a round's first feed): on an H200 (torch 2.11, bfloat16, Whisper
# base's shapes) an eager draft step over a cache growing a token a call took 76.8 ms, against 1.6 ms in
# float32 (which cuDNN's attention does not take) and 0.16 ms of kernels; in a real transcription two such
# steps took 0.27 s. Flash and memory-efficient attention need no plan. (``sdpa_kernel`` sets torch's
# process-wide switches for the step's duration: a main pass run at the same time from another thread would
# see them too; the engine decodes a request's rounds in one thread.)
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class LeanDecoder(Decoder):
    """A draft decoder that runs its own layers (``self.layers``, one entry per layer; ``kv_heads`` key/value
    heads of ``head_dim``) through ``_step``. On a CPU over a ``LeanCache`` inside the ragged cache (rejected drafts
    become holes, finished rows leave the batch); on CUDA over a pooled ``StaticDraftCache`` whose one-token
    steps replay a captured CUDA graph (``graphs`` as ``FixedShapeDecoder``'s: "capture", "eager" for the
    same buffers without capture, None for the ragged cache)."""

    layers: list
    kv_heads: int
    head_dim: int
    static_granule = 128  # static capacities are rounded up to a multiple of this (fewer shapes to capture)

    def __init__(self, model) -> None:
        super().__init__(model)
        self.graphs: str | None = "capture" if graphs_enabled(self.device) else None
        self._graph_pool = GraphPool()

    def new_cache(self, batch: int, capacity: int | None = None) -> RaggedCache | StaticDraftCache:
        """The ragged cache, or with graphs a static one of ``capacity`` positions (rounded up; at most the
        model's ``max_positions``) lent by the pool of its shape (given back by ``release``)."""
        if self.graphs is None:
            return RaggedCache(LeanCache(len(self.layers)), batch, self.device)
        size = self.max_positions if capacity is None else -(-capacity // self.static_granule) * self.static_granule
        if self.max_positions is not None:
            size = min(size, self.max_positions)
        if size is None:
            raise ValueError("a static draft cache needs a capacity")
        key = (batch, size)
        return self._graph_pool.lend(key, lambda: StaticDraftCache(len(self.layers), batch, size, self.kv_heads,
                                                                   self.head_dim, self.device, self.reads_encoder,
                                                                   self.dtype))

    def forward_ids(self, ids: torch.Tensor, real: torch.Tensor, cache, enc: EncoderOutput | None):
        """Float32 logits (B, n, V') for the token ids (B, n) on the device and their real-token flags (B, n)
        (``Decoder.forward_ids``). On a static cache a chunk of one of ``FEED_WIDTHS`` columns (a draft step,
        a round's padded first feed) whose cross-attention is in place replays the cache's captured step."""
        if self.fuses(ids, cache, enc):
            step = cache.step(lambda i, r: self._run_step(i, r, cache, None)[0], capture=self.graphs == "capture",
                              width=ids.shape[1])
            return step(ids, real), real
        return self._run_step(ids, real, cache, enc)

    def fuses(self, ids: torch.Tensor, cache, enc: EncoderOutput | None) -> bool:
        """Whether a step over ``ids`` replays a graph, alone (``forward_ids``) or with its epilogue
        (``fused_step``): a chunk of one of ``FEED_WIDTHS`` columns on a static cache whose cross-attention
        is in place."""
        return (isinstance(cache, StaticDraftCache) and ids.shape[1] in FEED_WIDTHS and not cache.needs_cross()
                and (enc is None or enc.mask is None))

    def fused_step(self, cache: StaticDraftCache, key: tuple, then, inputs: tuple[torch.Tensor, torch.Tensor] | None = None):
        """The step over ``cache`` followed by ``then(logits (B, n, V'), real (B, n)) -> output`` as one
        ``graphs.PassGraph`` (captured on CUDA; "eager": the same buffers, run eagerly), kept with the cache
        under ``key`` = (kind, width, ...): the key names everything ``then`` bakes in that may change between
        requests (the decoder's own, e.g. its draft vocabulary, is the same for every cache of its pool). ``inputs``: the
        (ids, real) buffers it reads (default new ones of the key's width, copied into at each call); the
        caller makes sure its warm-up runs change nothing (``draft_loop.DraftLoop.resting``)."""
        graph = cache.fused.get(key)
        if graph is None:
            run = lambda i, r: then(self._run_step(i, r, cache, None)[0], r)  # noqa: E731
            graph = cache.fused[key] = cache.new_graph(run, self.graphs == "capture", key[1], inputs)
        return graph

    def _run_step(self, ids: torch.Tensor, real: torch.Tensor, cache, enc: EncoderOutput | None):
        """``_step``, on CUDA with torch's attention kernels other than cuDNN's (``ATTENTION_BACKENDS``)."""
        if self.device.type != "cuda":
            return self._step(ids, real, cache, enc)
        with sdpa_kernel(ATTENTION_BACKENDS):
            return self._step(ids, real, cache, enc)

    def _step(self, ids: torch.Tensor, real: torch.Tensor, cache, enc: EncoderOutput | None):  # pragma: no cover - abstract
        """The layers and head over one chunk: (logits (B, n, V') float32, real)."""
        raise NotImplementedError


class Linear:
    """y = x W^T + b, with W kept in ``dtype`` (float32 by default) or, for an assistant, as int8 per output channel
    (W ~ s_o * Q_o, Q_o in [-127, 127], dynamic quantization of x per call, to 7 bits as torch's own dynamic
    ``Linear`` does (``reduce_range``): fbgemm's u8 x s8 kernels add pairs of products in int16, which saturates
    with 8-bit activations on processors without VNNI dot products, e.g. these AMD EPYCs: logits' cosine to
    float32 0.57-0.76 on a random Llama there, 0.99 with it): about 2.5 times less time per
    draft-sized product on these CPUs, at ~1% relative error in the drafts' logits. Only drafts use it;
    verification never does."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, int8: bool,
                 dtype: torch.dtype = torch.float32) -> None:
        dtype = torch.float32 if int8 else dtype  # the int8 kernels take float32 inputs and biases
        weight = weight.detach().to(dtype).contiguous()
        self.bias = None if bias is None else bias.detach().to(dtype).contiguous()
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
