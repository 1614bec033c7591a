"""Continuous batching: rows join a running decode at its round boundaries and leave the moment they finish.

``AssistedDecoder.generate`` decodes a set of rows to the end. A server's requests arrive one by one, and a
row that finished early would wait, as padding, for the longest row of its call. ``ContinuousBatch`` keeps one
main-model cache of ``slots`` rows (a fixed-shape decoder: every pass has the same shape whatever its rows
hold) and runs the engine's round (``AssistedDecoder``'s draft, verify, accept, commit) one ``step`` at a time:

    leave      a row that finished this round is returned at once, with its own ``DecodeResult``, and its
               slot is free
    join       between rounds, ``join`` gives free slots to new rows: the slot's positions start again from 0
               (slot = position: its old keys and values are written over before a query of the new row
               reads them), its cross-attention keys and values are computed from the new row's encoder output
               alone (``FixedShapeDecoder.join_row``), and its prompt is pending: its first verify pass feeds
               it, through the prompt pass as in ``generate``'s first round, beside the other rows' drafts
    assistant  the joining row's slot reset in the assistant too (``Drafter.join_row``: its cache row, its
               cross-attention from the new encoder output alone); where a drafter cannot (a static draft cache
               on CUDA), it starts afresh on every row's tokens so far and catches up in its next drafting
               round, which the adaptive policy does not time (``Policy.catch_up``)
    grow       the caller may add slots (``grow``) when more rows come than the batch has room for; and drop
    compact    the empty ones (``compact``) when few rows are left, so that the last long row does not pay for
               every slot a pass (the passes' width stays the one the batch started with)

Exactness: each row's tokens are decided as in ``generate``, by the main model's logits at that row's positions
under the same rules, so greedy output is the main model's own greedy decoding. What the row's neighbours
change is only the shape of the products it takes part in (the rows of a pass), as between two batch sizes of
``generate``; the tests check on real Whisper weights that rows joining mid-call, and rows after a
``grow`` and ``compact``, equal the same rows decoded alone. Greedy only: a sampled row's draws would depend on its
neighbours (one generator serves a call). Per-row statistics share each round's seconds among its live rows.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from .calls import Counters, DecodeOptions, DecodeResult, DecodeStats
from .core import AssistedDecoder, Request, seeded_policy
from .decoders import EncoderOutput
from .fixed import FixedShapeDecoder
from .policies import make_policy
from .rows import from_host
from .rules import Rules


@dataclass(frozen=True)
class Joiner:
    """A row to decode: the caller's ``key`` for it, its decoder ``prompt`` and, for an encoder-decoder main model,
    its ``encoder_output`` (1, S, D) from the main encoder."""

    key: Hashable
    prompt: tuple[int, ...]
    encoder_output: EncoderOutput | None = None


@dataclass(kw_only=True)
class _Row(Counters):
    """What one slot's row has cost so far: its share of each round it took part in (``draft_calls``, the
    seconds), its own drafts, acceptances and rounds (the main passes it was in), and with
    ``DecodeOptions.logits_at`` its prompt logits (1, V)."""

    key: Hashable


class ContinuousBatch:
    """A running greedy decode whose rows join and leave at round boundaries (module docstring).

    ``engine``'s main decoder must keep fixed shapes (``FixedShapeDecoder``); every row shares ``rules`` and
    ``options`` (``do_sample`` and ``compare_plain`` are refused: ValueError). ``slots``: rows a pass carries;
    ``first``: the rows it starts with (1 to ``slots``); ``max_prompt``: the longest prompt a row may bring
    (sizes a causal decoder's cache; a Whisper decoder always has its 448 positions); ``shape_rows``: the rows
    whose pass width the batch takes (default ``slots``; a server's ``--max-batch``, so that its batches have
    one width whatever rows they start with). Not thread-safe: one caller drives it (``step``, ``join``,
    ``grow``, ``compact``, ``cancel``, ``close``)."""

    @torch.inference_mode()
    def __init__(self, engine: AssistedDecoder, rules: Rules, options: DecodeOptions, slots: int,
                 first: Sequence[Joiner], max_prompt: int | None = None, shape_rows: int | None = None) -> None:
        main = engine.main
        if not isinstance(main, FixedShapeDecoder):
            raise ValueError("continuous batching needs a fixed-shape main decoder (a Whisper or causal main model)")
        if options.do_sample or options.compare_plain:
            raise ValueError("continuous batching decodes greedily, without compare_plain")
        if not 1 <= len(first) <= slots:
            raise ValueError(f"a continuous batch starts with 1 to {slots} rows, not {len(first)}")
        self.engine, self.rules, self.options, self.slots = engine, rules, options, slots
        self.max_prompt = max(max_prompt or 0, *(len(j.prompt) for j in first))
        self._check(first)
        self.cache = main.new_cache(slots, capacity=self.max_prompt + options.max_new_tokens + 1,
                                    shape_rows=shape_rows or slots)
        rows = [list(j.prompt) for j in first] + [[] for _ in range(slots - len(first))]
        self.req = Request.start(rows)
        self.rows: list[_Row | None] = [_Row(key=j.key) for j in first] + [None] * (slots - len(first))
        for b in range(len(first), slots):
            self._free(b)
        self.enc: EncoderOutput | None = None
        if main.reads_encoder:  # empty slots hold a copy of the first row's (their cross-attention is never read)
            outputs = [j.encoder_output for j in first] + [first[0].encoder_output] * (slots - len(first))
            self.enc = EncoderOutput(torch.cat([o.hidden for o in outputs]), None)
        self.policy = make_policy(seeded_policy(options), engine.costs)
        self.drafter = None
        self._start_drafter()

    def _check(self, joiners: Sequence[Joiner]) -> None:
        """ValueError for a row this batch cannot take (a prompt past ``max_prompt``, no encoder output where
        the main model reads one)."""
        for j in joiners:
            if len(j.prompt) > self.max_prompt or not j.prompt:
                raise ValueError(f"a joining row's prompt must have 1 to {self.max_prompt} tokens, not {len(j.prompt)}")
            if self.engine.main.reads_encoder and j.encoder_output is None:
                raise ValueError("a joining row needs its encoder output (1, S, D)")

    @property
    def free(self) -> int:
        """Slots without a row."""
        return sum(r is None for r in self.rows)

    @property
    def live(self) -> int:
        """Rows still decoding."""
        return self.slots - self.free

    @torch.inference_mode()
    def join(self, joiners: Sequence[Joiner]) -> None:
        """Give free slots to ``joiners`` (at most ``free``: ValueError) before the next ``step``."""
        empty = [b for b, r in enumerate(self.rows) if r is None]
        if len(joiners) > len(empty):
            raise ValueError(f"{len(joiners)} rows cannot join {len(empty)} free slots")
        self._check(joiners)
        req, main = self.req, self.engine.main
        for b, j in zip(empty, joiners):
            if self.enc is not None:
                self.enc.hidden[b : b + 1].copy_(j.encoder_output.hidden)
            main.join_row(self.cache, b, j.encoder_output)
            req.seqs[b], req.prompt_lens[b], req.pending[b] = list(j.prompt), len(j.prompt), list(j.prompt)
            req.done[b], req.fresh[b] = False, True
            req.out[req.alive[b]], req.logprobs[req.alive[b]] = [], 0.0
            self.rows[b] = _Row(key=j.key)
        drafter = self.drafter
        if drafter is not None and not all([drafter.join_row(b, list(j.prompt), j.encoder_output)
                                            for b, j in zip(empty, joiners)]):
            self._start_drafter()

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, DecodeResult]]:
        """One round over the live rows: draft, verify, accept, commit. Returns the rows that finished in it, as
        (key, one-row DecodeResult), their slots now free."""
        req, engine, options, rows = self.req, self.engine, self.options, self.rows
        if all(req.done):
            return []
        req.rounds += 1
        gen_lens = req.gen_lens()
        fresh = [b for b, f in enumerate(req.fresh) if f]
        calls_before = req.draft_calls
        drafts, _, d_s = engine._draft(req, self.drafter, self.policy, gen_lens, options, None, None)
        t1 = time.perf_counter()
        verified = engine._verify(req, self.cache, self.enc, drafts, gen_lens, self.rules, options)
        if options.logits_at is not None:
            for b in fresh:
                rows[b].prompt_logits = req.prompt_logits[b : b + 1].clone()
        accepted, emitted = engine._accept(req, verified, drafts, None, gen_lens, self.rules, options, None, None)
        engine._commit(req, self.cache, verified, accepted, emitted)
        v_s = time.perf_counter() - t1
        if self.drafter is not None:
            self.drafter.update(drafts, accepted, emitted)
            self.policy.observe([len(dr) for dr in drafts], accepted, d_s, v_s, verified.width)
        live = [b for b, c in enumerate(verified.counts) if c]
        for b in live:  # each live row's share of the round
            row = rows[b]
            row.rounds += 1
            row.drafted += len(drafts[b])
            row.accepted += accepted[b]
            row.hist[accepted[b]] += 1
            row.draft_calls += (req.draft_calls - calls_before) / len(live)
            row.draft_s += d_s / len(live)
            row.verify_s += v_s / len(live)
        return [self._leave(b) for b in live if req.done[b]]

    def _leave(self, b: int) -> tuple[Hashable, DecodeResult]:
        """Row ``b``'s result; its slot freed."""
        req, row = self.req, self.rows[b]
        tokens = tuple(req.out[req.alive[b]])
        stats = DecodeStats(rows=1, new_tokens=len(tokens), rounds=row.rounds, main_calls=row.rounds,
                            draft_calls=round(row.draft_calls), encoder_calls=0, drafted=row.drafted,
                            accepted=row.accepted, accepted_hist=dict(sorted(row.hist.items())),
                            draft_s=row.draft_s, verify_s=row.verify_s, total_s=row.draft_s + row.verify_s,
                            row_calls=row.rounds)
        result = DecodeResult((tokens,), stats, sum_logprobs=(req.logprobs[req.alive[b]],),
                              prompt_logits=row.prompt_logits)
        self._free(b)
        return row.key, result

    @torch.inference_mode()
    def cancel(self, key: Hashable) -> bool:
        """Stop the row of ``key`` (its caller went away): its slot is free for the next ``join`` and the other
        rows decode as they would have (a finished row is fed padding). False when no row has that key."""
        for b, row in enumerate(self.rows):
            if row is not None and row.key == key:
                self._free(b)
                return True
        return False

    def _free(self, b: int) -> None:
        """Slot ``b`` without a row: a finished row with nothing pending (fed padding until a row joins)."""
        req = self.req
        req.seqs[b], req.prompt_lens[b], req.pending[b], req.fresh[b], req.done[b] = [], 0, [], False, True
        self.rows[b] = None

    @torch.inference_mode()
    def compact(self) -> None:
        """Drop the empty slots: later passes carry only the live rows (fewer rows, cheaper passes), and no row can
        join any more (``free`` is 0). Rows keep their caches; the assistant starts afresh."""
        keep = [b for b, r in enumerate(self.rows) if r is not None]
        if not keep or len(keep) == self.slots:
            return
        req = self.req
        index = from_host(keep, torch.long, self.engine.main.device)
        self.cache.select(index, keep)
        if self.enc is not None:
            self.enc = self.enc.select(index)
        req.out = [req.out[req.alive[b]] for b in keep]
        req.logprobs = [req.logprobs[req.alive[b]] for b in keep]
        for name in ("seqs", "prompt_lens", "pending", "done", "fresh"):
            setattr(req, name, [getattr(req, name)[b] for b in keep])
        req.alive = list(range(len(keep)))
        self.rows = [self.rows[b] for b in keep]
        self.slots = len(keep)
        self.policy.select(keep)
        self._start_drafter()

    @torch.inference_mode()
    def grow(self, slots: int) -> None:
        """``slots`` more empty slots, after the others (rows keep their caches; the assistant starts afresh)."""
        if slots <= 0:
            return
        req, old = self.req, self.slots
        self.cache.grow(slots)
        if self.enc is not None:
            self.enc = EncoderOutput(torch.cat([self.enc.hidden] + [self.enc.hidden[:1]] * slots), None)
        req.alive += range(len(req.out), len(req.out) + slots)
        req.out += [[] for _ in range(slots)]
        req.logprobs += [0.0] * slots
        req.seqs += [[] for _ in range(slots)]
        req.pending += [[] for _ in range(slots)]
        req.prompt_lens += [0] * slots
        req.done += [True] * slots
        req.fresh += [False] * slots
        self.rows += [None] * slots
        self.slots += slots
        self.policy.select(list(range(old)) + [0] * slots)
        self._start_drafter()

    def _start_drafter(self) -> None:
        """A fresh assistant on every row's tokens so far (none where the options or engine have none)."""
        if self.drafter is not None:
            self.drafter.finish()
        self.drafter = None
        if self.options.use_drafter and self.engine.make_drafter is not None:
            self.drafter = self.engine.make_drafter(self.rules, self.options.max_new_tokens)
            self.drafter.start(self.req.seqs, self.enc, None)
            self.policy.catch_up()

    def close(self) -> None:
        """Give the caches back (a pooled static cache to its pool); the batch is not used afterwards."""
        self.cache.release()
        if self.drafter is not None:
            self.drafter.finish()
            self.drafter = None
