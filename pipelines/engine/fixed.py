"""Fixed-shape main decoders: assisted output equal to plain output by construction.

Why fixed shapes. A matrix product's bits for one row depend on the product's shape: a one-row product
takes another kernel than a many-row one, kernels pick their blocking from the shape, attention over a
longer key axis sums in another order. A verify pass over k + 1 tokens would then give a token other logits
than a one-token step, and assisted output could depart from plain output (below float32 often, in float32
at rare near-ties), depending on which kernels a machine happens to pick (Intel AMX, AMD AVX-512, cuBLAS).

So a ``FixedShapeDecoder`` computes every token of a request with the same arithmetic, whether it comes
alone (plain decoding) or in a verify pass:
    - every pass feeds a tile of ``width`` (W) columns per row, padded (a plain step is a verify pass of
      one token padded to W; a verify pass over more than W tokens takes several passes);
    - the batch keeps all its rows until the request ends (finished rows are fed padding), so every
      product of a request has the same shape, (B * W, D) x (D, N), whatever the lookahead;
    - keys and values live in a static cache (``FixedCache``) whose slot is the true position, with a
      capacity fixed for the request: a rejected draft's slot is simply written again later, so there
      are no holes;
    - attention scores a query against all slots, sets slots after its position to -inf and takes a
      float32 softmax over that fixed length: the masked terms are exact zeros in the same places
      whatever the slots hold, so a query's probabilities and its weighted sum of values have the same
      bits in every run;
    - position-dependent values (rotary angles) are read from a table, never computed per pass;
    - the prompt tokens whose logits nobody reads (all but the last) go through one pass of their own
      (its shape is the same in the plain and the assisted run of a request: they start alike).
Each token's logits are then computed by the same kernel calls with the same shapes on the same inputs,
in any dtype and on any device with deterministic kernels: no probe decides it. What remains assumed is
that within one product a row's bits do not depend on which row of the tile it occupies (true of every
GEMM tiling: all rows of a product share one algorithm, blocking and reduction order); the exactness tests
check the whole property on real models. The price is the padded columns of a plain step and verify
passes split at W. Subclasses (``whisper.WhisperDecoder``, ``causal.FixedCausalDecoder``) give the layers.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .cache import EncoderOutput
from .decoders import Decoder
from .graphs import GraphPool, PassGraph, Pooled, graphs_enabled
from .rows import from_host, scatter_rows, to_device
from .rules import PAD_GEN_LEN, Rules, apply_length_rules, column_index, length_columns, length_rules_until
from .timestamps import apply_timestamp_masks, column_ids, text_columns, timestamp_bounds
from .verify import greedy_choice

Tile = tuple[torch.Tensor, list[tuple[int, int, int]]]  # ids, positions and slots (3, B, w) on the host; where


class FixedCache(Pooled):
    """A fixed-shape decoder's keys and values, (B, heads, capacity, head_dim) per layer, slot = true
    position; optional cross-attention keys and values (computed once from the encoder output); and per row
    the next true position. Nothing is ever moved or compacted."""

    def __init__(self, layers: int, batch: int, capacity: int, heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, width: int, scratch: bool = False) -> None:
        shape = (batch, heads, capacity + (1 if scratch else 0), head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.next_pos = [0] * batch
        self.capacity, self.device = capacity, device
        self.width = width  # columns per row in every pass of this request (part of its fixed shape)
        # static writes (graphs.py): padding columns write to one slot past the capacity, which no query sees
        self.scratch: int | None = capacity if scratch else None
        self.graph: PassGraph | None = None  # the captured full-width pass over these buffers
        self.choices: dict[tuple, PassGraph] = {}  # greedy choices over that pass's output, by suppressed ids
        self.cross_graph: PassGraph | None = None  # a request's cross-attention keys and values into ``cross``

    @property
    def slot_count(self) -> int:
        """Slots per row in the buffers: the capacity, plus the scratch slot with static writes."""
        return self.keys[0].shape[2]

    def needs_cross(self) -> bool:
        """Whether this request's cross-attention keys and values are still to be set."""
        return self.cross is None or self._stale_cross

    def set_cross(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The request's cross-attention keys and values; a pooled cache copies them into its buffers (its
        graph reads those)."""
        self.cross = self.refill_cross(self.cross, pairs)

    def lend(self, pool: GraphPool, key: tuple) -> FixedCache:
        """Start a request on this (pooled) cache: positions from 0, cross-attention to be set again."""
        self.next_pos = [0] * len(self.next_pos)
        return self.lent(pool, key, self.cross is not None)

    def commit(self, keep: torch.Tensor, counts: list[int] | None = None) -> None:
        """After a forward call: ``keep`` (B, n) marks the chunk's tokens that were accepted (a prefix of each
        row); ``counts``, when the caller knows them, are its rows' sums (no read from the device)."""
        counts = keep.sum(dim=1).tolist() if counts is None else counts
        self.next_pos = [p + n for p, n in zip(self.next_pos, counts)]

    def commit_prefix(self, kept: list[int], n: int) -> None:
        """``commit`` of a chunk whose first ``kept[b]`` tokens were accepted in row b: only the positions move
        (no mask to build)."""
        self.next_pos = [p + k for p, k in zip(self.next_pos, kept)]

    def rollback(self, row: int, n: int) -> None:
        """Forget the last ``n`` tokens of ``row`` (their slots are written again by the next tokens)."""
        self.next_pos[row] -= max(0, n)

    def rollback_rows(self, counts: list[int]) -> None:
        """``rollback`` for every row at once: the last ``counts[b]`` tokens of row b."""
        self.next_pos = [p - max(0, n) for p, n in zip(self.next_pos, counts)]

    def select(self, rows: torch.Tensor, host_rows: list[int] | None = None) -> None:
        """Keep only ``rows`` (an assistant's cache; a fixed-shape main decoder keeps its batch whole)."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.graph, self.choices, self.cross_graph, self._pool = None, {}, None, None  # new buffers: old graphs no longer apply
        if self.cross is not None:
            self.cross = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross]
        self.next_pos = [self.next_pos[i] for i in (rows.tolist() if host_rows is None else host_rows)]

    def grow(self, rows: int) -> None:
        """``rows`` more rows after the others, empty (a continuous batch's new slots); the width stays."""
        def more(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t.new_zeros((rows,) + tuple(t.shape[1:]))])

        self.keys, self.values = [more(k) for k in self.keys], [more(v) for v in self.values]
        self.graph, self.choices, self.cross_graph, self._pool = None, {}, None, None  # new buffers (``select``)
        if self.cross is not None:
            self.cross = [(more(k), more(v)) for k, v in self.cross]
        self.next_pos = self.next_pos + [0] * rows

    def maybe_compact(self, threshold: float = 0.5) -> None:
        """Nothing to compact: a static cache has no holes."""


class FixedShapeDecoder(Decoder):
    """The tiling shared by fixed-shape main decoders. A subclass sets ``head_weight`` (V, D), ``head_transposed``
    and ``max_positions``, and implements ``new_cache`` (which fixes the request's width) and ``_layers`` (one
    tile through the decoder layers, writing the real tokens' keys and values to their slots first); ``_begin``
    may prepare the cache."""

    fixed_batch = True  # the engine keeps finished rows in the batch (shapes stay fixed for the request)
    device_steps = False  # tiles are built from host lists (``forward``)
    head_weight: torch.Tensor
    head_transposed: bool  # the head as (W h^T)^T rather than h W^T (set by the subclass)

    def __init__(self, model) -> None:
        super().__init__(model)
        # "capture": pooled static caches whose full-width passes replay a CUDA graph (graphs.py); "eager": the
        # same static buffers and writes without capture (tests on a CPU); None: a fresh cache per request
        self.graphs: str | None = "capture" if graphs_enabled(self.device) else None
        self._graph_pool = GraphPool()

    def make_cache(self, layers: int, batch: int, capacity: int, heads: int, head_dim: int, width: int) -> FixedCache:
        """The request's static cache (``new_cache`` of the subclasses): fresh, or with graphs one lent by
        the pool of this shape (given back by ``FixedCache.release``)."""
        if self.graphs is None:
            return FixedCache(layers, batch, capacity, heads, head_dim, self.dtype, self.device, width)
        key = (batch, capacity, width)
        return self._graph_pool.lend(key, lambda: FixedCache(layers, batch, capacity, heads, head_dim, self.dtype,
                                                             self.device, width, scratch=True))

    def forward(self, chunks: list[list[int]], cache: FixedCache, enc: EncoderOutput | None, pad_id: int,
                need_from: list[int] | None = None):
        """Logits (B, n, V) float32 on the model's device for ``chunks`` (one list of new tokens per row, n the
        longest), and the real-token flags (B, n) on the host. ``need_from[b]``: the first chunk token whose logits the caller reads;
        tokens before it go through the prompt pass, without the head. A row's columns past its chunk and before
        its ``need_from`` hold no logits of its tokens (zeros; or, where one pass covers every row's chunk from
        column 0, that pass's output for the padding, returned as it is: read it before the next call)."""
        batch, n = len(chunks), max(1, max(len(c) for c in chunks))
        device = self.head_weight.device
        real = torch.tensor([[j < len(c) for j in range(n)] for c in chunks], dtype=torch.bool, device="cpu")
        need = [min(max(0, f), len(c)) for f, c in zip(need_from or [0] * batch, chunks)]
        self._begin(cache, enc)
        if max(need):  # the prompt pass: tokens 0 .. need[b] - 1 of every row, width max(need)
            tile, where = self._tile(chunks, [0] * batch, need, max(need), cache.next_pos, pad_id, cache.scratch)
            tile = to_device(tile, device)
            self._layers(tile[0], tile[1], where, cache)
        width = cache.width
        passes = max(-(-(len(c) - m) // width) for c, m in zip(chunks, need))
        # one pass from column 0 (a plain step, a verify pass of up to width - 1 drafts): a token's column is its
        # chunk index, so the pass's output is the logits, without a copy
        whole = passes == 1 and not max(need)
        logits = None if whole else torch.zeros(batch, n, self.head_weight.shape[0], device=device)
        for i in range(passes):  # pass i: tokens need + i W ... need + (i + 1) W - 1 of every row
            first = [m + i * width for m in need]
            count = [max(0, min(width, len(c) - f)) for c, f in zip(chunks, first)]
            tile, where = self._tile(chunks, first, count, width, cache.next_pos, pad_id, cache.scratch)
            if cache.scratch is None:
                tile = to_device(tile, device)  # one copy
                out = self._head(self._layers(tile[0], tile[1], where, cache)).float()
            else:  # static writes: every column writes a slot (padding the scratch one); replayed with graphs
                out = self._graph_of(cache, batch)(tile)
            out = out.view(batch, width, -1)
            if whole:
                return out[:, :n], real
            scatter_rows(logits, out, where)  # each real token's logits to its chunk index
        return logits, real

    def _tile(self, chunks: list[list[int]], first: list[int], count: list[int], width: int, next_pos: list[int],
              pad_id: int, scratch: int | None) -> Tile:
        """One pass of ``width`` columns, built on the host from lists (one tensor, one copy to the device):
        row b holds its chunk tokens first[b] ... first[b] + count[b] - 1 from column 0 at their true positions,
        padding after. ``tile`` (3, B, w) long: [0] the ids, [1] the positions, [2] the slot each column writes
        (static writes: its position for a real token, ``scratch`` for padding; else unused, the positions).
        ``where`` lists (row, column, chunk index) of the real tokens (only they write keys and values)."""
        ids, positions, slots, where = [], [], [], []
        last = self.max_positions - 1
        for b, (c, f, m, start) in enumerate(zip(chunks, first, count, next_pos)):
            m = max(0, m)
            ids.append(c[f : f + m] + [pad_id] * (width - m))
            positions.append([min(start + f + j, last) for j in range(width)] if m else list(range(width)))
            slots.append(positions[-1] if scratch is None else positions[-1][:m] + [scratch] * (width - m))
            where += [(b, col, f + col) for col in range(m)]
        return torch.tensor([ids, positions, slots], dtype=torch.long), where

    def _graph_of(self, cache: FixedCache, batch: int) -> PassGraph:
        """The cache's full-width pass over a ``_tile`` (3, B, w) on the device, captured on first use (before
        any real pass of that width)."""
        if cache.graph is None:
            def run(tile: torch.Tensor) -> torch.Tensor:
                return self._head(self._layers(tile[0], tile[1], tile[2], cache)).float()

            tile = torch.zeros(3, batch, cache.width, dtype=torch.long, device=self.device)
            tile[2] = cache.scratch  # ids, positions, slots: warm-up writes scratch only
            cache.graph = PassGraph(run, (tile,), self.device, capture=self.graphs == "capture")
        return cache.graph

    def fused_choice(self, cache: FixedCache, logits: torch.Tensor, rules: Rules, offsets: list[int],
                     states: list[list[tuple[int, ...]]]) -> torch.Tensor | None:
        """Greedy verification of the pass that returned ``logits`` in a graph of its own over the pass graph's
        output (captured on CUDA, one per cache and rules): ``verify.greedy_choice`` (2, B, W) of every column
        after the rules the device applies (``rules.device_rules_from``: the suppressed columns, the first
        token's and the minimum length's by each position's generated length, and with Whisper's timestamp rules
        their mask). Row b's positions are its columns ``offsets[b]`` on; ``states[b][j]`` is position j's
        (generated length,) or, with timestamp rules, (generated length, *``TimestampRules.state``), copied in
        once. What the engine otherwise does eagerly with ``apply_rules`` and ``verify.argmax_logprobs`` (the
        same operations on each row). None where ``logits`` are not that output itself (no static cache, a
        prompt pass or several passes before) or a row's positions do not fit in it."""
        graph = cache.graph
        if graph is None or graph.output is None or logits.data_ptr() != graph.output.data_ptr():
            return None
        batch, width = len(cache.next_pos), cache.width
        if any(o + len(s) > width for o, s in zip(offsets, states)):
            return None
        timestamps = rules.timestamps
        lengths = length_columns(rules, None, self.device)  # made before any capture
        # (past the length rules' last length at every position: a graph without them)
        by_length = any(c is not None for c in lengths) and min(
            (s[0] for row in states for s in row), default=PAD_GEN_LEN) < length_rules_until(rules)
        key = (rules.suppress, by_length and (rules.begin_suppress, rules.min_new_tokens, rules.eos),
               None if timestamps is None else replace(timestamps, prompt_len=0))  # (never read here)
        choice = cache.choices.get(key)
        if choice is None:
            columns = column_index(None, rules.suppress, self.device) if rules.suppress else None
            ids = None if timestamps is None else column_ids(None, self.head_weight.shape[0], self.device)

            def run(out: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
                out = out.view(batch * width, -1)
                if columns is not None:
                    out = out.index_fill(-1, columns, float("-inf"))
                elif state is not None:
                    out = out.clone()  # (the pass's output stays as it is)
                if by_length:
                    apply_length_rules(rules, out, state[0], lengths)
                if timestamps is not None:
                    apply_timestamp_masks(timestamps, out, ids, timestamp_bounds(timestamps, state[1:]),
                                          text_columns(timestamps, None))
                return greedy_choice(out.view(batch, width, -1))

            inputs = (graph.output,)  # and, where rules read them, the columns' lengths and timestamp states
            if by_length or timestamps is not None:
                inputs += (torch.zeros(5, batch * width, dtype=torch.long, device=self.device),)
            choice = cache.choices[key] = PassGraph(run, inputs, self.device, capture=self.graphs == "capture")
        if not by_length and timestamps is None:
            return choice(graph.output)
        pad = [PAD_GEN_LEN, 0, 1, -1, 1]  # a column outside a row's positions (its choice is not read)
        rows = []
        for o, row in zip(offsets, states):
            cells = [pad] * width
            cells[o : o + len(row)] = [list(s) + pad[len(s):] for s in row]
            rows.extend(cells)
        return choice(graph.output, torch.tensor(rows, dtype=torch.long, device="cpu").T.contiguous())

    def writer(self, positions: torch.Tensor, write):
        """``store(buffer, new)``: writes a tile's keys or values ``new`` (B, H, w, Dh) into ``buffer`` (B, H, S, Dh).
        ``write``: the tile's ``where`` (only real tokens write, at their positions) or a (B, w) slot per column
        on the device (static writes: a fixed shape, padding columns to the scratch slot)."""
        if isinstance(write, torch.Tensor):
            slots = write
            rows = torch.arange(slots.shape[0], device=positions.device)[:, None]

            def store(buffer: torch.Tensor, new: torch.Tensor) -> None:
                buffer[rows, :, slots] = new.transpose(1, 2)  # (B, w, H, Dh) at [b, :, slots[b, c]]
        else:
            rows, cols, slots = self.slots_of(positions, write)

            def store(buffer: torch.Tensor, new: torch.Tensor) -> None:
                buffer[rows, :, slots] = new[rows, :, cols]
        return store

    def join_row(self, cache: FixedCache, row: int, enc: EncoderOutput | None) -> None:
        """Give slot ``row`` of a running request's cache to a new sequence (a continuous batch's join,
        ``continuous.py``): its positions start again from 0 (the old keys and values are written over before any
        query of the new sequence reads them) and, once the request's cross-attention is set, that slot's keys and
        values come from ``enc`` (1, S, D), the new sequence's encoder output (``_join_cross``)."""
        cache.next_pos[row] = 0
        if enc is not None and not cache.needs_cross():
            self._join_cross(cache, row, enc)

    def _join_cross(self, cache: FixedCache, row: int, enc: EncoderOutput) -> None:
        """Write one slot's cross-attention keys and values from ``enc`` (1, S, D) (a decoder that reads an encoder)."""

    def _begin(self, cache: FixedCache, enc: EncoderOutput | None) -> None:
        """Per-request preparation before the first pass (e.g. cross-attention keys and values)."""

    def _layers(self, ids: torch.Tensor, positions: torch.Tensor, write, cache: FixedCache) -> torch.Tensor:  # pragma: no cover - abstract
        """The decoder layers over one tile; ``write`` as ``writer`` takes it."""
        raise NotImplementedError

    @staticmethod
    def slots_of(positions: torch.Tensor, where: list[tuple[int, int, int]]):
        """(rows, cols, slots) index tensors of the real tokens of a tile: their cache slot is their position."""
        device = positions.device
        rows = from_host([b for b, _, _ in where], torch.long, device)
        cols = from_host([c for _, c, _ in where], torch.long, device)
        return rows, cols, positions[rows, cols]

    @staticmethod
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """softmax(q k^T) v per head over every slot (q already scaled), slots not ``allowed`` at -inf, the
        softmax in float32: q (B, H, w, Dh), k and v (B, H, S, Dh) -> (B, H, w, Dh)."""
        scores = torch.matmul(q, k.transpose(-1, -2)).float()
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)

    @staticmethod
    def merge_heads(t: torch.Tensor) -> torch.Tensor:
        """(B, H, w, Dh) -> (B, w, H * Dh)."""
        batch, heads, w, dim = t.shape
        return t.transpose(1, 2).reshape(batch, w, heads * dim)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (B * w, V) = h W^T (the main model always scores the whole vocabulary), computed as (W h^T)^T
        where ``head_transposed`` says so (some BLAS run it 2-4 times faster at 2-8 rows, others slower); either
        way each row's bits depend only on it, and every pass of a request uses the same form."""
        h = hidden.reshape(-1, hidden.shape[-1])
        if self.head_transposed:
            return torch.mm(self.head_weight, h.t()).t()
        return torch.nn.functional.linear(h, self.head_weight)
