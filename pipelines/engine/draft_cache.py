"""The drafters' static KV cache: the draft steps of the GPU fast path.

A lean drafter (``lean.LeanDecoder``) keeps its keys and values in the ragged cache on a CPU: each step
appends a column (``torch.cat``) and rejected drafts become holes, so every step has another shape. That
cannot be captured into a CUDA graph, and on a GPU an eager 2-layer draft step is mostly launches and host
work (~3.5 ms against 0.16 ms of kernels at Whisper base's shapes, ``../shared/notes/gpu.md``), which is
why speculation did not pay there. As gpt-fast does for its draft model, ``StaticDraftCache`` holds them in
buffers of a fixed size instead:

    keys[l], values[l]: (B, heads, capacity + 1, head_dim), slot = the token's true position;
    next_pos: (B,) on the device, the next true position of each row (updated in place).

A chunk of n tokens per row writes its real tokens to slots next_pos .. next_pos + n - 1 and its padding
to the scratch slot (index ``capacity``), and a query at position p attends slots 0 .. p:

    allowed[b, 0, q, s] = s <= position[b, q]        (the scratch slot is past every position)

Slots after a row's position hold rejected drafts or nothing; no query sees them before the row writes
them again, so a rollback only steps ``next_pos`` back (no holes, no compaction). A one-token step is then a
pure function of (ids (B, 1), real (B, 1)) over buffers whose addresses never change during a request:
``step`` replays it from a ``graphs.PassGraph`` captured once per pooled cache. So is a round's first feed
(the tokens emitted since the drafter last ran, 1 to k + 1 a row): padded to the next of ``FEED_WIDTHS``
(padding writes the scratch slot, the logits read are each row's last real column), it replays a graph of
that width, captured once per pooled cache too; a longer feed runs eagerly. The drafts' numerics may
differ in their last bits from the ragged cache's (attention over another length); drafts only propose,
the main model's verification decides every output token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .cache import LeanCache, chunk_tensors
from .graphs import GraphPool, PassGraph, Pooled
from .rows import from_host

FEED_WIDTHS = (1, 2, 4, 8)  # the chunk widths a static draft cache replays from graphs (a feed is padded up)


def feed_width(n: int) -> int:
    """The columns a chunk of at most ``n`` tokens a row takes on a static draft cache: the next of
    ``FEED_WIDTHS``, or ``n`` itself past the last (run eagerly)."""
    return next((w for w in FEED_WIDTHS if w >= n), n)


class StaticDraftCache(Pooled):
    """A lean drafter's keys and values in fixed buffers (module docstring), its cross-attention keys and
    values (Whisper: computed once per request), and on the device the next true position of each row.
    The interface is ``RaggedCache``'s as drafters use it."""

    def __init__(self, layers: int, batch: int, capacity: int, heads: int, head_dim: int, device: torch.device,
                 reads_encoder: bool, dtype: torch.dtype = torch.float32) -> None:
        shape = (batch, heads, capacity + 1, head_dim)  # + the scratch slot
        self.cache = LeanCache(layers)
        for layer in self.cache.layers:
            layer.keys = torch.zeros(shape, dtype=dtype, device=device)
            layer.values = torch.zeros(shape, dtype=dtype, device=device)
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=device)
        self.capacity, self.scratch, self.device = capacity, capacity, torch.device(device)
        self._rows = torch.arange(batch, device=device)[:, None]
        self._slots: torch.Tensor | None = None  # the chunk being fed: the slot each column writes (plan -> write)
        self.graph: PassGraph | None = None  # the captured one-token step over these buffers
        self.feeds: dict[int, PassGraph] = {}  # the captured wider chunks (a round's first feed), by width
        self.fused: dict[tuple, PassGraph] = {}  # steps with the draft loop's epilogue (lean.LeanDecoder.fused_step)
        self.loop = None  # the draft loop's buffers, which the fused graphs read (draft_loop.DraftLoop)
        self.cross_graph: PassGraph | None = None  # a request's cross-attention keys and values into the buffers
        self.reads_encoder = reads_encoder  # a Whisper drafter's cross-attention keys and values live here too

    def lend(self, pool: GraphPool, key: tuple) -> StaticDraftCache:
        """Start a request on this (pooled) cache: positions from 0, cross-attention to be set again."""
        self.next_pos.zero_()
        return self.lent(pool, key, self.cache.cross is not None)

    def needs_cross(self) -> bool:
        """Whether the drafter must still set this request's cross-attention keys and values."""
        return self.reads_encoder and (self.cache.cross is None or self._stale_cross)

    def set_cross(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The request's cross-attention keys and values; a pooled cache copies them into its buffers (its
        graph reads those)."""
        self.cache.cross = self.refill_cross(self.cache.cross, [(k.contiguous(), v.contiguous()) for k, v in pairs])

    def tensors_of(self, chunks: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids and real-token flags (B, w) of ``chunks``, w = ``feed_width`` of the longest (padding after)."""
        return chunk_tensors(chunks, pad_id, self.device, feed_width(max(1, max(len(c) for c in chunks))))

    def plan(self, real: torch.Tensor, max_pos: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions (B, n) and the mask (B, 1, n, capacity + 1) for a chunk whose real tokens are ``real``
        (B, n) (real tokens first in each row), and the slots ``write`` will fill; all on the device."""
        n = real.shape[1]
        positions = (self.next_pos[:, None] + torch.arange(n, device=self.device)[None, :]).clamp(max=self.capacity - 1)
        self._slots = torch.where(real, positions, self.scratch)
        slots = torch.arange(self.capacity + 1, device=self.device)
        allowed = (slots[None, None, :] <= positions[:, :, None])[:, None]
        return positions, allowed

    def write(self, kv, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The chunk's keys and values (B, heads, n, Dh) into the layer's buffers at the planned slots."""
        kv.keys[self._rows, :, self._slots] = keys.transpose(1, 2)  # (B, n, H, Dh) at [b, :, slots[b, c]]
        kv.values[self._rows, :, self._slots] = values.transpose(1, 2)

    def commit(self, keep: torch.Tensor, counts: list[int] | None = None) -> None:
        """After a forward call: ``keep`` (B, n) marks the chunk's accepted tokens (a prefix of each row)."""
        self.next_pos.add_(keep.sum(dim=1))

    def add_counts(self, counts: list[int]) -> None:
        """Nothing to count: a static cache has no holes."""

    def rollback_rows(self, counts: list[int]) -> None:
        """Forget the last ``counts[b]`` tokens of row b (their slots are written again by the next ones)."""
        if any(c > 0 for c in counts):
            self.next_pos.sub_(from_host(counts, torch.long, self.device))

    def maybe_compact(self, threshold: float = 0.5) -> None:
        """Nothing to compact: a static cache has no holes."""

    def select(self, rows: torch.Tensor, host_rows: list[int] | None = None, cross: bool = True) -> None:
        """Keep only ``rows``: new buffers, so a graph of the old ones no longer applies (nor the pool);
        ``cross=False``: the cross-attention keys and values stay (``RaggedCache.select``)."""
        self.cache.reorder_cache(rows, cross=cross)
        self.next_pos = self.next_pos.index_select(0, rows)
        self._rows = torch.arange(len(rows), device=self.device)[:, None]
        self.graph, self.feeds, self.fused, self.loop, self._pool = None, {}, {}, None, None
        self.cross_graph = None

    def step(self, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], capture: bool, width: int = 1) -> PassGraph:
        """The step of ``width`` columns (one of ``FEED_WIDTHS``) over these buffers, ``run(ids (B, width),
        real (B, width)) -> logits``, captured on first use (``capture=False``: the same buffers, run eagerly).
        Its warm-up feeds padding only: it writes the scratch slot alone and moves no position."""
        graph = self.graph if width == 1 else self.feeds.get(width)
        if graph is None:
            graph = self.new_graph(run, capture, width)
            if width == 1:
                self.graph = graph
            else:
                self.feeds[width] = graph
        return graph

    def new_graph(self, run: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], capture: bool, width: int,
                  inputs: tuple[torch.Tensor, torch.Tensor] | None = None) -> PassGraph:
        """``run(ids (B, width), real (B, width))`` over these buffers as a ``PassGraph`` whose inputs are
        ``inputs`` or new ones of padding only (its warm-up then writes the scratch slot alone)."""
        if inputs is None:
            batch = self.next_pos.shape[0]
            inputs = (torch.zeros(batch, width, dtype=torch.long, device=self.device),
                      torch.zeros(batch, width, dtype=torch.bool, device=self.device))
        return PassGraph(run, inputs, self.device, capture=capture)
