"""The device draft loop: greedy drafting whose steps never wait on the host.

A round drafts up to ``room[b]`` tokens for row b (its lookahead, bounded by the room left before
max_new_tokens). Step 0 feeds each row the tokens the drafter has not seen yet (a round's first feed, 1 to
k + 1 a row); every later step feeds each row its own last draft. After step j, on the device:

    nxt[b]         = logits[b, last real column of row b]        (B, V'): the next-token logits
    nxt            = rules(nxt)                                   suppressed columns -inf; the first token's and
                                                                  the minimum length's by gen[b] + j
    tok[b]         = vocab[argmax nxt[b]]                         (vocab: the draft head's column -> id)
    chosen[:, j]   = tok, alive                                   alive: rows whose step-j token is a draft
    alive[b]      &= (j + 1 < room[b]) & (tok[b] != eos)  [& softmax(nxt[b])[tok] >= stop_below]

and step j + 1 feeds (tok, alive). The host learns that no row is alive from a flag read behind an event
(``rows.StillRunning``: a step late at most) and reads every step's tokens once, at the end of the round.

On a static draft cache (``draft_cache.StaticDraftCache``, the CUDA path) a step and the lines above are
one graph (``LeanDecoder.fused_step``): the cache's commit, the rules, the argmax, the vocabulary map, the
stop flags and the next step's inputs replay with the layers, where they were about twenty launches and
host work each (the H200 probe of 2026-12-04: 5.3 ms a round against 1.4 ms of kernels). A later step reads
its inputs from the loop's own buffers: its replay copies nothing in; so does a round's first step, whose feed
comes from the host with the round's other numbers, in one copy. Rules that read a step's generated
length (the first token's suppressions, a minimum length) are applied from each row's generated length
before the round (``gen``) plus the step, on the device (``rules.apply_length_rules``), so a request's first
round replays too; rules the device cannot apply (a forced token, transformers processors) are applied by
``apply_rules`` from host lengths, outside the graph, at the steps where they can bite. Whisper's
timestamp rules read the row's prefix: the loop keeps what they read, four numbers a row (``stamps``,
``timestamps.py``), and moves them on after every step's token, on the device and inside the graph.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from .cache import EncoderOutput
from .draft_cache import FEED_WIDTHS, StaticDraftCache, feed_width
from .rows import StillRunning, from_host
from .rules import (
    PAD_GEN_LEN,
    Rules,
    apply_length_rules,
    apply_rules,
    column_index,
    device_rules_from,
    length_columns,
    length_rules_until,
)
from .timestamps import TimestampRules, apply_timestamp_masks, column_ids, text_columns, timestamp_bounds

NEG_INF = float("-inf")
MIN_STEPS = 16  # the draft steps a loop's buffers hold at least (a longer round makes larger ones)


class DraftLoop:
    """A round's state on the device for ``rows`` rows and up to ``steps`` draft steps (module docstring):

        ids (B, 1) long, alive (B,) bool: the next one-token step's input (each row's last draft; whether it drafts;
                ``real``: alive as (B, 1), a view, the step's real-token flags)
        room (B,) long: the drafts each row may take this round;  step (1,) long: the step being run (j)
        gen (B,) long: each row's generated length before the round (step j's token is its gen + j-th)
        chosen (2, B, steps) long: [0] the token of every step, [1] whether it is a draft (1) or not (0),
                together so that the round's end reads them in one copy
        running (1,) bool: whether any row is alive;  threshold (1,) float64: stop_below, when drafting by confidence
        stamps (4, B) long: each row's timestamp state before the next step (``timestamps.py``), with
                Whisper's timestamp rules
        feed ids (B, F) long, feed real (B, F) bool: the round's first feed on a static draft cache (the tokens
                each row's drafter has not seen, padding after; F the widest fused feed): step 0's input,
                whose graph reads them where they are (``feed_of``)

    Each round's numbers (room, gen, the feed, stamps) come from the host in one copy (``staged``).
    A static draft cache keeps one (its graphs read these addresses); a ragged cache's round makes its own."""

    def __init__(self, rows: int, device: torch.device, steps: int) -> None:
        self.steps = steps
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.alive = torch.zeros(rows, dtype=torch.bool, device=device)
        self.real = self.alive.view(rows, 1)
        widest = FEED_WIDTHS[-1]
        # room, gen (B each), the feed's ids and flags (B * F each), stamps (4 * B): one copy a round
        self.staged = torch.zeros((6 + 2 * widest) * rows, dtype=torch.long, device=device)
        self.room, self.gen = self.staged[:rows], self.staged[rows : 2 * rows]
        self.feed_ids = self.staged[2 * rows : (2 + widest) * rows].view(rows, widest)
        self.feed_flags = self.staged[(2 + widest) * rows : (2 + 2 * widest) * rows].view(rows, widest)
        self.feed_real = torch.zeros(rows, widest, dtype=torch.bool, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        self.chosen = torch.zeros(2, rows, steps, dtype=torch.long, device=device)
        self.running = torch.zeros(1, dtype=torch.bool, device=device)
        self.threshold = torch.zeros(1, dtype=torch.float64, device=device)
        self.stamps = self.staged[(2 + 2 * widest) * rows :].view(4, rows)
        self.rows = torch.arange(rows, device=device)

    def begin(self, room: list[int], gen_lens: list[int], stop_below: float | None,
              stamps: list[tuple[int, ...]] | None = None, feeds: list[list[int]] | None = None, pad_id: int = 0) -> None:
        """A new round: ``room[b]`` drafts for row b, from step 0, ``gen_lens[b]`` tokens generated before them;
        ``stamps[b]``: row b's timestamp state (``TimestampRules.state``) with Whisper's timestamp rules;
        ``feeds[b]``: the tokens row b's drafter has not seen, at most F (``feed_of``; None: fed otherwise)."""
        widest = self.feed_ids.shape[1]
        host = room + gen_lens
        if feeds is not None or stamps:
            feeds = feeds or [[] for _ in room]
            host += [t for f in feeds for t in f + [pad_id] * (widest - len(f))]
            host += [int(j < len(f)) for f in feeds for j in range(widest)]
        if stamps:
            host += [v for s in zip(*stamps) for v in s]
        self.staged[: len(host)].copy_(torch.tensor(host, dtype=torch.long, device="cpu"), non_blocking=True)  # staged by CUDA
        if feeds is not None:
            torch.ne(self.feed_flags, 0, out=self.feed_real)
        torch.gt(self.room, 0, out=self.alive)
        self.step.zero_()
        if stop_below is not None:
            self.threshold.fill_(stop_below)

    def feed_of(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The round's first feed as ids and real-token flags (B, ``width``), views of the loop's buffers (a
        graph over them reads each round's feed without a copy)."""
        return self.feed_ids[:, :width], self.feed_real[:, :width]

    @contextlib.contextmanager
    def resting(self):
        """No row alive meanwhile, then the state as it was: a graph's warm-up runs (``graphs.PassGraph``)
        over the loop's buffers then write the scratch slot only and commit nothing."""
        buffers = (self.ids, self.alive, self.room, self.step, self.chosen, self.running, self.stamps, self.feed_real)
        saved = [t.clone() for t in buffers]
        self.alive.zero_()
        self.feed_real.zero_()  # (a first feed's warm-up too)
        self.step.zero_()  # warm-ups write the first columns (the state is put back after)
        try:
            yield
        finally:
            for t, s in zip(buffers, saved):
                t.copy_(s)

    def choose(self, logits: torch.Tensor, real: torch.Tensor, constrain, vocab: torch.Tensor | None,
               eos: int | torch.Tensor, confidence: bool, stamps: TimestampRules | None = None) -> torch.Tensor:
        """After step j over ``logits`` (B, n, V') float32 with real-token flags ``real`` (B, n) (real tokens
        first): the rules (``constrain(nxt)``, in place on (B, 1, V')), the argmax, the step's tokens and
        flags kept, the stop flags, the timestamp state moved on (``stamps``: Whisper's timestamp rules) and
        the next step's inputs (module docstring); returns ``running`` (1,)."""
        if logits.shape[1] == 1:
            nxt = logits  # a one-token step's own logits (a graph's output: read before its next replay)
        else:  # a row's last real token; column 0 for a row fed nothing (its logits are unused)
            nxt = logits[self.rows, real.sum(dim=1).clamp(min=1) - 1][:, None, :]
        constrain(nxt)
        col = torch.argmax(nxt[:, 0], dim=-1)
        tok = col if vocab is None else vocab[col]
        self.chosen.index_copy_(2, self.step, torch.stack([tok, self.alive.long()])[:, :, None])
        # a row stops after its last allowed draft, an end of sequence or (confidence) an unlikely token (several
        # end ids: a broadcast comparison, where torch.isin may sort and synchronise inside a graph)
        going = (self.step + 1 < self.room) & (tok != eos if isinstance(eos, int) else (tok[:, None] != eos).all(dim=-1))
        if confidence:  # compared in float64, as the host loop compares its Python float
            p = torch.softmax(nxt[:, 0], dim=-1).gather(-1, col[:, None])[:, 0].double()
            going = going & ~(p < self.threshold)
        self.alive.logical_and_(going)
        if stamps is not None:
            stamps.advance(self.stamps, tok)
        self.ids.copy_(tok[:, None])
        self.step.add_(1)
        torch.any(self.alive, dim=0, keepdim=True, out=self.running)
        return self.running

    def read(self, steps: int) -> list[list[int]]:
        """The drafts of each row over the round's first ``steps`` steps (one read)."""
        values, flags = self.chosen[:, :, :steps].tolist()
        return [[t for t, f in zip(v, g) if f] for v, g in zip(values, flags)]


def loop_for(cache, rows: int, device: torch.device, steps: int) -> DraftLoop:
    """The loop state for a round of ``steps`` steps: a static cache's own (made larger when a round needs
    more steps: its fused graphs go with the old buffers), else a new one."""
    if not isinstance(cache, StaticDraftCache):
        return DraftLoop(rows, device, steps)
    if cache.loop is None or cache.loop.steps < steps:
        cache.loop = DraftLoop(rows, device, max(steps, MIN_STEPS))
        cache.fused = {}
    return cache.loop


def draft_on_device(decoder, cache, enc: EncoderOutput | None, rules: Rules, max_new: int, feeds: list[list[int]],
                    room: list[int], gen_lens: list[int], pad_id: int, stop_below: float | None,
                    vocab: torch.Tensor | None, stamps: list[tuple[int, ...]] | None = None) -> tuple[list[list[int]], int]:
    """Greedy drafts for each row (module docstring): ``feeds[b]`` the tokens row b's drafter has not seen (fed
    at step 0; [] where ``room[b]`` is 0), at most ``room[b]`` drafts, ``gen_lens[b]`` tokens generated
    before them; with Whisper's timestamp rules ``stamps[b]`` row b's timestamp state before them
    (``TimestampRules.state`` of its sequence: the loop moves it on, step by step, on the device). Returns the drafts per row and the forward passes run. The drafts equal the host loop's
    (``ModelDrafter.draft``): the same logits, rules and argmax; only where and when they are read differs."""
    rows, device, steps = len(room), decoder.device, max(room, default=0)
    if steps == 0:
        return [[] for _ in range(rows)], 0
    eos = rules.eos[0] if len(rules.eos) == 1 else from_host(rules.eos or (-1,), torch.long, device)
    loop = loop_for(cache, rows, device, steps)
    ts = rules.timestamps
    ts_key = None if ts is None else replace(ts, prompt_len=0)  # (the graphs never read the prompt's length)
    # a static draft cache's first feed goes with the round's numbers and is read where it lies
    staged = isinstance(cache, StaticDraftCache) and max(len(f) for f in feeds) <= FEED_WIDTHS[-1]
    loop.begin(room, gen_lens, stop_below, stamps if ts is not None else None, feeds if staged else None, pad_id)
    fixed_from = device_rules_from(rules)  # (the loop applies them from its own lengths and timestamp state)
    suppress = column_index(decoder.vocab_ids, rules.suppress, device) if rules.suppress else None
    lengths = length_columns(rules, decoder.vocab_ids, device)
    # (a round whose every draft comes at or past the length rules' last length skips them)
    by_length = any(c is not None for c in lengths) and min(g for g, r in zip(gen_lens, room) if r) < length_rules_until(rules)
    text_end = text_columns(ts, decoder.vocab_ids) if ts is not None else 0

    stamp_ids: list[torch.Tensor] = []  # the columns' ids, made at the first step (before any capture) and held
    # here, by the closures a captured graph keeps: it reads them at their address

    def timestamp_rules(nxt: torch.Tensor) -> None:  # from the loop's own timestamp state (timestamps.py)
        if ts is not None:
            if not stamp_ids:
                stamp_ids.append(column_ids(decoder.vocab_ids, nxt.shape[-1], device))
            apply_timestamp_masks(ts, nxt[:, 0], stamp_ids[0], timestamp_bounds(ts, loop.stamps), text_end)

    def fixed_rules(nxt: torch.Tensor) -> None:  # what apply_rules does from the fixed_from-th token on
        if suppress is not None:
            nxt.index_fill_(-1, suppress, NEG_INF)
        if by_length:  # step j's token is each row's gen + j-th
            apply_length_rules(rules, nxt[:, 0], loop.gen + loop.step, lengths)
        timestamp_rules(nxt)

    def host_rules(j: int):  # apply_rules with step j's generated lengths (read on the host), then the timestamps'
        lens = torch.tensor([[gen_lens[b] + j if j < room[b] else PAD_GEN_LEN] for b in range(rows)], device="cpu")
        return lambda nxt: timestamp_rules(apply_rules(rules, nxt, lens, max_new, None, decoder.vocab_ids))

    def finish(logits: torch.Tensor, real: torch.Tensor, constrain) -> torch.Tensor:
        return loop.choose(logits, real, constrain, vocab, eos, stop_below is not None, ts)

    def commit_and_finish(logits: torch.Tensor, real: torch.Tensor) -> torch.Tensor:  # a fused graph's epilogue
        cache.commit(real)
        return finish(logits, real, fixed_rules)

    decoder.ready(cache, enc)  # (a request's first round: its cross-attention, so that step 0 can replay too)
    probe = StillRunning(device)
    ids, real = loop.feed_of(feed_width(max(len(f) for f in feeds))) if staged else cache.tensors_of(feeds, pad_id)
    counts = [len(f) for f in feeds]
    taken = 0
    for j in range(steps):
        if j and probe.stopped(loop.running):  # every row has stopped (end of sequence, confidence)
            break
        fixed = fixed_from is not None and min(g + j for g, r in zip(gen_lens, room) if j < r) >= fixed_from
        if fixed and decoder.fuses(ids, cache, enc):
            key = ("feed" if j == 0 else "step", ids.shape[1], rules.suppress, rules.eos,
                   by_length and (rules.begin_suppress, rules.min_new_tokens), stop_below is not None, ts_key)
            # (a fused first step is a static cache's feed of at most F tokens: staged, read where it lies)
            inputs = (ids, real) if j == 0 else (loop.ids, loop.real)
            with contextlib.nullcontext() if key in cache.fused else loop.resting():
                step = decoder.fused_step(cache, key, commit_and_finish, inputs)
            running = step()  # (its inputs are the loop's buffers: nothing copied in)
        else:
            logits, _ = decoder.forward_ids(ids, real, cache, enc)
            cache.commit(real, counts)
            running = finish(logits, real, fixed_rules if fixed else host_rules(j))
        taken += 1
        probe.post(running)
        ids, real = loop.ids, loop.real  # the next step feeds each row its own token
        counts = [0] * rows  # fed on the device: counted by the caller, once read
    return loop.read(taken), taken
