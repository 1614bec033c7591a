"""The assisted-decoding loop: encode once, draft, verify in one main-model pass, accept, repeat.

    encode      the main encoder runs once per batch; an assistant sharing it reads the same output
    draft       the drafter proposes k_b tokens for each row b (k_b from the lookahead policy)
    verify      one main-model pass over [tokens the main cache lacks] + drafts, for all rows at once
    accept      greedy: the longest prefix of drafts equal to the main model's argmax, then the main
                model's own next token; sampling: the speculative-sampling rule
    commit      the main cache keeps what was accepted; the emitted tokens join each row
    shrink      finished rows leave the batch once they are a quarter of it (not for a fixed-shape decoder)
    repeat      until every row has emitted EOS or max_new_tokens

``AssistedDecoder.generate`` reads as these verbs (``_draft``, ``_verify``, ``_accept``, ``_commit``,
``_shrink``) over one ``Request``, the loop state of a call; ``verify.py`` holds the acceptance rules.

Nothing here knows about audio, files or UI: inputs are encoder inputs (tensors) and decoder prompts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from . import rows as row_ops, verify
from .calls import Counters, DecodeOptions, DecodeResult, DecodeStats, Start
from .decoders import Decoder, EncoderOutput
from .drafters import DrafterFactory
from .policies import CostMemory, PolicyOptions, make_policy
from .rows import from_host, gather_rows
from .rules import PAD_GEN_LEN, Rules, Sampling, apply_rules, device_rules_from

OnRound = Callable[[dict[int, list[int]]], Iterable[int] | None]  # generate's per-round report: rows to stop


def seeded_policy(options: DecodeOptions) -> PolicyOptions:
    """The lookahead policy of a request. A seeded sample is a function of its random draws, and how many draws
    a round takes follows the lookahead, so the adaptive policy (which reads wall-clock costs) would make one
    seed give other samples from run to run: a seeded sampled request takes the heuristic policy instead
    (+2 / -1 by acceptance, itself a function of the draws). The distribution is the main model's either way."""
    if options.do_sample and options.seed is not None and options.policy.name == "adaptive":
        return replace(options.policy, name="heuristic")
    return options.policy


@dataclass(kw_only=True)
class Request(Counters):
    """What one ``generate`` call carries from round to round, rows in batch order (``alive[b]``: the original
    index of batch row b; finished rows leave the batch unless the main decoder keeps its shape). Mutable:
    the loop state of one call, never shared."""

    seqs: list[list[int]]  # per row: prompt + tokens emitted so far
    prompt_lens: list[int]
    pending: list[list[int]]  # per row: tokens the main cache lacks
    alive: list[int]
    done: list[bool]
    out: list[list[int]]  # per original row: tokens emitted
    logprobs: list[float]  # per original row: sum of log p of the emitted tokens
    fresh: list[bool]  # per batch row: its prompt is still pending (its first verify pass is to come)

    @classmethod
    def start(cls, prompts: list[list[int]]) -> Request:
        rows = len(prompts)
        return cls(seqs=[list(p) for p in prompts], prompt_lens=[len(p) for p in prompts],
                   pending=[list(p) for p in prompts], alive=list(range(rows)), done=[False] * rows,
                   out=[[] for _ in range(rows)], logprobs=[0.0] * rows, fresh=[True] * rows)

    def gen_lens(self) -> list[int]:
        """Tokens generated so far, per batch row."""
        return [len(s) - pl for s, pl in zip(self.seqs, self.prompt_lens)]


@dataclass(frozen=True)
class Verified:
    """A verify pass: ``logits`` (B, n, V) as the main decoder returned them, ``sel`` (B, width, V) each live
    row's logits from its last pending token on after the rules (-inf past its drafts), ``counts`` the
    positions of each row in ``sel`` (drafts + 1; 0 for a finished row). Or, greedy where the main decoder's
    graph chose (``choice``: ``verify.greedy_choice`` (2, B, >= width) of the pass, the rules applied, row b's
    positions from column ``offsets[b]`` on), ``sel`` None."""

    logits: torch.Tensor
    sel: torch.Tensor | None
    counts: list[int]
    choice: torch.Tensor | None = None
    offsets: list[int] | None = None  # with ``choice``: each row's first column there

    @property
    def width(self) -> int:
        """Positions a row holds in ``sel``: the most drafts this round + 1."""
        return max(self.counts, default=0) or 1


class AssistedDecoder:
    """A main model and (optionally) a drafter. Holds no per-request state (only measured costs, which
    the adaptive lookahead policy reads): call ``generate`` freely."""

    def __init__(self, main: Decoder, make_drafter: DrafterFactory | None = None,
                 pad_id: int = 0) -> None:
        if main.vocab_ids is not None:
            raise ValueError("the main model must score the whole vocabulary (this one has a reduced draft head)")
        self.main, self.make_drafter, self.pad_id = main, make_drafter, pad_id
        self.costs = CostMemory()
        self.beam_costs = CostMemory()  # beam search's (beam_loop.py): its acceptance is every beam's at once

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], rules: Rules, options: DecodeOptions = DecodeOptions(),
                 encoder_inputs: dict | None = None, encoder_output: EncoderOutput | None = None,
                 on_round: OnRound | None = None) -> DecodeResult:
        """Decode ``prompts`` (one list of ids a row) under ``rules``: encode once, then round after round
        draft, verify, accept and shrink the batch (module docstring) until every row has finished.
        ``encoder_inputs`` (e.g. ``input_features`` (B, 80, 3000)) or an ``encoder_output`` already computed
        (B, S, D) for an encoder-decoder main model. Greedy output equals the main model's own greedy decoding;
        sampled output follows its distribution. ``on_round(new)``, when given, is told after each round the
        tokens each row emitted in it (``{prompt index: tokens}``, rows that emitted any) and may name rows
        to stop there: they finish as a row that emits EOS does (their output so far is returned), and the
        other rows go on as they would after such a finish (``_stop``)."""
        begun = self.start(prompts, rules, options, encoder_inputs, encoder_output, self.costs)
        # the seeded generator lives on the model's device, as the distributions it samples from
        generator = torch.Generator(self.main.device).manual_seed(options.seed) if options.seed is not None else None
        sampling = options.sampling if options.do_sample else None
        drafter, policy, enc = begun.drafter, begun.policy, begun.enc
        cache = self.main.new_cache(len(prompts), capacity=max(len(p) for p in prompts) + options.max_new_tokens + 1)
        req = Request.start(prompts)
        try:
            while not all(req.done):
                req.rounds += 1
                gen_lens = req.gen_lens()
                drafts, qs, d_s = self._draft(req, drafter, policy, gen_lens, options, sampling, generator)
                t1 = time.perf_counter()
                verified = self._verify(req, cache, enc, drafts, gen_lens, rules, options)
                accepted, emitted = self._accept(req, verified, drafts, qs, gen_lens, rules, options, sampling, generator)
                self._commit(req, cache, verified, accepted, emitted)
                if on_round is not None:
                    self._stop(req, on_round({req.alive[b]: e for b, e in enumerate(emitted) if e}))
                v_s = time.perf_counter() - t1
                req.verify_s += v_s
                if drafter is not None:
                    drafter.update(drafts, accepted, emitted)
                    policy.observe([len(dr) for dr in drafts], accepted, d_s, v_s, verified.width)
                enc = self._shrink(req, cache, enc, drafter, policy)
                cache.maybe_compact(self.main.compact_at)
        finally:  # a pooled static cache goes back to its pool, whatever happened
            cache.release()
            if drafter is not None:
                drafter.finish()
        stats = req.stats(begun, len(prompts), sum(len(o) for o in req.out), sum(req.hist.values()))
        return self.compared(tuple(tuple(o) for o in req.out), stats, tuple(req.logprobs), req.prompt_logits, options,
                             lambda plain: self.generate(prompts, rules, plain, encoder_inputs, begun.encoded))

    def start(self, prompts: list[list[int]], rules: Rules, options: DecodeOptions, encoder_inputs: dict | None,
              encoder_output: EncoderOutput | None, costs: CostMemory, beams: int | None = None) -> Start:
        """A decode's prelude, ``generate``'s and beam search's: the main encoder once (unless ``encoder_output``
        is given), the drafter made (``options.use_drafter`` and a factory) and started on the rows, the lookahead
        policy (measured ``costs``). ``beams``: beam search's rows, each input's encoder output repeated that
        many times (input g's beams are rows g * beams ...), the drafter started on those rows from the encoder
        output alone (``encoder_inputs`` hold one row an input)."""
        t0 = time.perf_counter()
        enc, calls = encoder_output, 0
        if self.main.reads_encoder and enc is None:
            enc = self.main.encode(**encoder_inputs)
            calls += 1
        rows, enc_rows = prompts, enc
        if beams is not None:
            rows = [list(p) for p in prompts for _ in range(beams)]
            if enc is not None:
                enc_rows = enc.select(from_host([g for g in range(len(prompts)) for _ in range(beams)], torch.long,
                                                self.main.device))
        use = options.use_drafter and self.make_drafter is not None
        drafter = self.make_drafter(rules, options.max_new_tokens) if use else None
        if drafter is not None:
            calls += drafter.start(rows, enc_rows, encoder_inputs if beams is None else None)
        return Start(t0, enc, enc_rows, drafter, make_policy(seeded_policy(options), costs), calls,
                     time.perf_counter() - t0)

    @staticmethod
    def compared(tokens: tuple[tuple[int, ...], ...], stats: DecodeStats, sums: tuple[float, ...],
                 prompt_logits: torch.Tensor | None, options: DecodeOptions,
                 plain: Callable[[DecodeOptions], DecodeResult]) -> DecodeResult:
        """A decode's result; with ``options.compare_plain`` (greedy or beam search) also the plain decode's
        (``plain(options)``, the same call without the drafter), per row whether its tokens are the same."""
        if options.compare_plain and not options.do_sample:
            other = plain(replace(options, use_drafter=False, compare_plain=False))
            same = tuple(a == b for a, b in zip(tokens, other.tokens))
            return DecodeResult(tokens, stats, same, other.stats, sums, prompt_logits)
        return DecodeResult(tokens, stats, sum_logprobs=sums, prompt_logits=prompt_logits)

    def _draft(self, req: Request, drafter, policy, gen_lens: list[int], options: DecodeOptions,
               sampling: Sampling | None, generator) -> tuple[list[list[int]], list | None, float]:
        """Each row's drafts this round (k from the policy, none for a finished row or past max_new_tokens),
        their draft distributions when sampling, and the seconds drafting took."""
        rows = len(req.alive)
        ks = policy.next_k(rows) if drafter is not None else [0] * rows
        ks = [0 if d else min(k, options.max_new_tokens - g - 1) for k, g, d in zip(ks, gen_lens, req.done)]
        if drafter is None or not any(k > 0 for k in ks):
            return [[] for _ in range(rows)], None, 0.0
        d = drafter.draft(ks, req.seqs, gen_lens, sampling, generator, policy.stop_below)
        req.draft_calls += d.steps
        req.draft_s += d.seconds
        return d.tokens, d.probs, d.seconds

    def _verify(self, req: Request, cache, enc: EncoderOutput | None, drafts: list[list[int]], gen_lens: list[int],
                rules: Rules, options: DecodeOptions) -> Verified:
        """One main pass over each row's pending tokens + drafts; the logits from each row's last pending
        token on, with the rules applied (the same rules as plain decoding, position by position)."""
        # the fresh rows' prompt logits from ``logits_at`` on (rows joining a continuous batch come fresh later)
        first = options.logits_at is not None and any(req.fresh)
        chunks = [p + dr for p, dr in zip(req.pending, drafts)]
        need = [len(p) - 1 for p in req.pending]
        if first:
            need = [min(n, options.logits_at) if f else n for n, f in zip(need, req.fresh)]
        logits, _ = self.main.forward(chunks, cache, enc, self.pad_id, need_from=need)
        if first:  # (B, V): read only at the rows that were fresh in this pass
            req.prompt_logits = logits[:, options.logits_at].clone()
        req.fresh = [False] * len(req.fresh)
        req.main_calls += 1
        width = max(len(dr) for dr in drafts) + 1
        # each live row's logits from its last pending token on: (B, width, V), -inf past its drafts
        counts = [0 if req.done[b] else len(dr) + 1 for b, dr in enumerate(drafts)]
        # each row's positions from its last pending token on: its column len(pending) - 1 in the pass's output (a
        # token's logits sit at its chunk index; in the first round with the no-speech check's logits, the prompt's
        # last; later, column 0)
        offsets = [max(len(p) - 1, 0) for p in req.pending]
        if not options.do_sample and self._rules_fixed(rules, gen_lens, counts):
            ts = rules.timestamps  # each position's generated length, and its timestamp state with timestamp rules
            states = []
            for b, (g, dr, c) in enumerate(zip(gen_lens, drafts, counts)):
                stamps = ts.states_along(req.seqs[b], dr, c) if ts is not None else [()] * c
                states.append([(g + j,) + stamps[j] for j in range(c)])
            choice = self.main.fused_choice(cache, logits, rules, offsets, states)
            if choice is not None:  # the pass's graph applied the rules and chose
                return Verified(logits, None, counts, choice, offsets)
        sel = gather_rows(logits, offsets, counts, width)
        # gen_len per position, a host tensor: the rules decide on the host (apply_rules)
        lens = torch.tensor([[g + j if j < c else PAD_GEN_LEN for j in range(width)] for g, c in zip(gen_lens, counts)],
                            device="cpu")
        prefixes = None
        if rules.needs_prefix:
            prefixes = [[req.seqs[b] + dr[:j] for j in range(len(dr) + 1)] for b, dr in enumerate(drafts)]
        apply_rules(rules, sel, lens, options.max_new_tokens, prefixes)
        return Verified(logits, sel, counts)

    @staticmethod
    def _rules_fixed(rules: Rules, gen_lens: list[int], counts: list[int]) -> bool:
        """Whether a ``fused_choice`` can apply the rules (from each position's generated length and timestamp
        state) at every position this pass verifies (from each live row's generated length on:
        ``rules.device_rules_from``)."""
        start = device_rules_from(rules)
        return start is not None and min((g for g, c in zip(gen_lens, counts) if c), default=0) >= start

    def _accept(self, req: Request, verified: Verified, drafts: list[list[int]], qs: list | None, gen_lens: list[int],
                rules: Rules, options: DecodeOptions, sampling: Sampling | None,
                generator) -> tuple[list[int], list[list[int]]]:
        """Per row: the drafts accepted and the tokens emitted (accepted drafts + the main model's own next
        token, cut at an end of sequence or max_new_tokens; ``verify.py``'s rules), the rows that finished
        marked, the tokens' log-probabilities added."""
        sel, rows = verified.sel, len(req.alive)
        accepted, emitted = [0] * rows, [[] for _ in range(rows)]
        best_lp = None
        if verified.choice is not None:  # chosen by the pass's graph: one read
            best, best_lp = verify.read_choice(verified.choice, verified.width, verified.offsets)
        elif sampling is None and row_ops.indexed(sel.device):  # the argmax and its log-probability everywhere: one read
            best, best_lp = verify.argmax_logprobs(sel)
        elif sampling is None:  # a CPU (reads cost nothing): the argmax now, log-probabilities of emitted tokens below
            best = torch.argmax(sel, dim=-1).tolist()
        for b, dr in enumerate(drafts):
            if req.done[b]:
                continue
            room = options.max_new_tokens - gen_lens[b]
            if sampling is None:
                n = verify.accepted_prefix(dr, best[b])
                emitted[b], req.done[b] = verify.truncate(dr[:n] + [best[b][n]], rules.eos, room)
            else:
                row_logits = sel[b, : len(dr) + 1]
                n, nxt = verify.accept_sampling(dr, qs[b] if qs else [None] * len(dr), row_logits, sampling, generator)
                emitted[b], req.done[b] = verify.truncate(dr[:n] + [nxt], rules.eos, room)
                req.logprobs[req.alive[b]] = verify.add_logprobs(req.logprobs[req.alive[b]], row_logits, emitted[b])
            accepted[b] = n
            req.hist[n] += 1
            req.drafted += len(dr)
            req.accepted += n
        if sampling is None:
            if best_lp is None:
                best_lp = verify.logprobs_at(sel, best, [len(e) for e in emitted])
            for b, e in enumerate(emitted):
                for value in best_lp[b][: len(e)]:  # in order, one token at a time (add_logprobs)
                    req.logprobs[req.alive[b]] += value
        return accepted, emitted

    def _commit(self, req: Request, cache, verified: Verified, accepted: list[int], emitted: list[list[int]]) -> None:
        """The main cache keeps each row's pending tokens and accepted drafts (the rest become holes or are
        written again); the emitted tokens join the rows' sequences, the last one pending for the next pass."""
        n = verified.logits.shape[1]
        kept = [0 if verified.counts[b] == 0 else len(p) + accepted[b] for b, p in enumerate(req.pending)]
        cache.commit_prefix(kept, n)
        for b, new in enumerate(emitted):
            req.seqs[b].extend(new)
            req.out[req.alive[b]].extend(new)
            req.pending[b] = [] if req.done[b] else [new[-1]]

    @staticmethod
    def _stop(req: Request, rows) -> None:
        """Rows (prompt indices) that the caller stops: marked finished with nothing pending, exactly as a row
        that emitted EOS is after ``_commit`` (its cache holds what it accepted; it drafts and verifies no
        more, and ``_shrink`` may drop it), so the other rows decode as they would have."""
        stop = set(rows or ())
        for b, row in enumerate(req.alive):
            if row in stop:
                req.done[b], req.pending[b] = True, []

    def _shrink(self, req: Request, cache, enc: EncoderOutput | None, drafter, policy) -> EncoderOutput | None:
        """Finished rows leave the batch once they are a quarter of it (each removal copies the caches),
        unless the main decoder keeps its shapes fixed for the whole request (whisper.WhisperDecoder).
        Returns the encoder output of the rows kept."""
        n_done = sum(req.done)
        if not n_done or all(req.done) or 4 * n_done < len(req.alive) or self.main.fixed_batch:
            return enc
        keep_rows = [b for b, f in enumerate(req.done) if not f]
        req.alive, req.seqs = [req.alive[b] for b in keep_rows], [req.seqs[b] for b in keep_rows]
        req.done = [False] * len(keep_rows)
        req.prompt_lens = [req.prompt_lens[b] for b in keep_rows]
        req.pending = [req.pending[b] for b in keep_rows]
        req.fresh = [req.fresh[b] for b in keep_rows]
        index = from_host(keep_rows, torch.long, self.main.device)
        cache.select(index, keep_rows)
        if drafter is not None:
            drafter.select(keep_rows)
        policy.select(keep_rows)
        return enc.select(index) if enc is not None else None
