"""CUDA graphs for the fixed-shape main decoder's passes and the drafters' one-token steps: the GPU fast path.

On a GPU an eager decoder step is mostly kernel launches and host work (``../shared/notes/gpu.md``: 80-95%
of a Whisper base step), so a draft step costs nearly a main step and speculation cannot pay. A
``FixedShapeDecoder`` pass is already a pure function of three (rows, width) tensors (token ids, true
positions, the cache slot each column writes) over buffers whose shapes are fixed for a request (the static
key/value cache, the cross-attention keys and values): what a CUDA graph needs. As gpt-fast does with
``torch.compile(mode="reduce-overhead")``, each (rows, width, capacity) shape is captured once into a
``torch.cuda.CUDAGraph`` over buffers that stay allocated (``GraphPool``) and every full-width pass replays
it: one launch for the whole decoder and head.

Exactness. Every full-width pass of every request on a pooled cache replays the same graph (the same
kernels, shapes and inputs as an eager pass of that shape would run, whatever the lookahead), so plain
and assisted decoding keep their common bits; the eager warm-up runs before capture write only the
scratch slot. Padding columns write their keys and values to that scratch slot (one slot past the
capacity, which no query is allowed to see), so the writes have a fixed shape too.

The drafters' steps (``draft_cache.StaticDraftCache``) take the same way: a one-token step over a static
cache, captured once per pooled cache; their drafts only propose, so their bits need not match anything.
Smaller graphs ride along on the same caches: greedy verification's choice over a pass's output (the
suppressed ids, Whisper's timestamp rules, the argmax and its log-probability: ``FixedShapeDecoder.fused_choice``),
and a request's cross-attention keys and values into the caches' buffers (Whisper's decoders), run through
a graph for every request of a cache, its first too, so that every request computes them with the same kernels.

Used only on CUDA, unless ``TANDEM_CUDA_GRAPHS=0``. ``capture=False`` runs the same buffers eagerly
(the CPU tests of everything but the capture itself).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch


def graphs_enabled(device: torch.device) -> bool:
    """Whether fixed-shape decoders on ``device`` replay CUDA graphs: CUDA devices, unless $TANDEM_CUDA_GRAPHS is 0."""
    return device.type == "cuda" and os.environ.get("TANDEM_CUDA_GRAPHS", "1") != "0"


class PassGraph:
    """One pass shape, captured: static input buffers (``inputs``, made by the caller with the pass's shapes
    and contents that write nothing but scratch) and the output the graph writes; ``__call__`` copies the
    inputs in and replays. The output is overwritten by the next call: read it before. ``capture=False``:
    the same buffers, run eagerly."""

    def __init__(self, run: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], device: torch.device,
                 capture: bool = True) -> None:
        self.run, self.capture, self.inputs = run, capture, inputs
        self.graph = None
        self.output: torch.Tensor | None = None
        self.device = torch.device(device)
        if capture:
            # on the decoder's device (torch.cuda.graph captures on the current one): warm-up on a side stream
            # (cuBLAS handles, the allocator's pools), then capture (PyTorch's recipe)
            with torch.cuda.device(self.device):
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        run(*self.inputs)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph, stream=torch.cuda.Stream(self.device)):
                    self.output = run(*self.inputs)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        for buffer, value in zip(self.inputs, args):
            if value is not buffer:  # (a graph reading another's output is given that buffer itself)
                buffer.copy_(value, non_blocking=True)
        if self.graph is None:
            self.output = self.run(*self.inputs)
        else:
            with torch.cuda.device(self.device):
                self.graph.replay()
        return self.output


def cross_graph(projections: list[tuple[Callable, Callable]], heads: int, hidden_shape: tuple[int, int, int],
                dtype: torch.dtype, device: torch.device,
                capture: bool) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], PassGraph]:
    """Buffers for a request's cross-attention keys and values, (B, H, T, D/H) a layer, and the graph that
    computes them in place from an encoder output (B, T, D) copied into its input (cast to ``dtype``):
    k = k_proj(h), v = v_proj(h) for each layer's (k_proj, v_proj) of ``projections``. Every request of a
    static cache goes through it, its first too, so that each computes them with the same kernels."""
    batch, frames, d = hidden_shape
    shape = (batch, heads, frames, d // heads)
    buffers = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
               for _ in projections]

    def split(t: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, H, T, D/H), a view
        return t.view(batch, frames, heads, -1).transpose(1, 2)

    def run(hidden: torch.Tensor) -> torch.Tensor:
        for (k_proj, v_proj), (k, v) in zip(projections, buffers):
            k.copy_(split(k_proj(hidden)))
            v.copy_(split(v_proj(hidden)))
        return buffers[0][0]

    inputs = (torch.zeros(hidden_shape, dtype=dtype, device=device),)
    return buffers, PassGraph(run, inputs, device, capture=capture)


class GraphPool:
    """Static caches with their captured pass, kept per (rows, capacity, width) and lent to one request at
    a time (``take``/``give``): a graph reads and writes its cache's buffers, so a cache in use is never lent
    twice; a request that finds none free gets a new one (captured too: every request of a shape runs the
    same kernels). At most ``max_free`` caches are kept; the least recently given back goes first."""

    def __init__(self, max_free: int = 8) -> None:
        self.free: dict[tuple, list] = {}
        self.order: list[tuple] = []  # the keys of the free caches, least recently given back first
        self.max_free = max_free
        self.lock = threading.Lock()

    def take(self, key: tuple, make: Callable[[], object]):
        with self.lock:
            entries = self.free.get(key)
            if entries:
                self.order.remove(key)
                cache = entries.pop()
                if not entries:
                    del self.free[key]
                return cache
        return make()

    def lend(self, key: tuple, make: Callable[[], object]):
        """A cache of ``key``'s shape for one request (``take``), marked lent so that its ``release`` gives it
        back here (the cache's own ``lend``: positions from 0, then ``Pooled.lent``)."""
        return self.take(key, make).lend(self, key)

    def give(self, key: tuple, cache) -> None:
        with self.lock:
            self.free.setdefault(key, []).append(cache)
            self.order.append(key)
            while len(self.order) > self.max_free:  # drop the least recently given back (its buffers and graph)
                old = self.order.pop(0)
                self.free[old].pop(0)
                if not self.free[old]:
                    del self.free[old]


class Pooled:
    """What a static cache that a ``GraphPool`` lends keeps: the pool and key it goes back to (``release``)
    and whether its cross-attention buffers still hold the last request's (``refill_cross``)."""

    _pool: tuple[GraphPool, tuple] | None = None
    _stale_cross = False  # lent again by a pool: the cross-attention buffers hold the last request's

    def lent(self, pool: GraphPool, key: tuple, has_cross: bool):
        """Mark the start of a request on this cache, lent by ``pool`` under ``key``."""
        self._stale_cross = has_cross
        self._pool = (pool, key)
        return self

    def release(self) -> None:
        """The request is over: a pooled cache goes back to its pool."""
        if self._pool is not None:
            pool, key = self._pool
            self._pool = None
            pool.give(key, self)

    def cross_filled(self) -> None:
        """The cross-attention buffers now hold this request's keys and values (written in place)."""
        self._stale_cross = False

    def refill_cross(self, current: list | None, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list:
        """The cross-attention keys and values to keep for this request: ``current`` (the buffers a captured
        graph reads) with ``pairs`` copied in, when lent again; else ``pairs`` themselves."""
        if current is not None and self._stale_cross:
            for (k, v), (new_k, new_v) in zip(current, pairs):
                k.copy_(new_k)
                v.copy_(new_v)
            pairs = current
        self._stale_cross = False
        return pairs
