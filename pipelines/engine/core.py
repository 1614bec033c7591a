"""The assisted-decoding loop: encode once, draft, verify in one main-model pass, accept, repeat.

    encode      the main encoder runs once per batch; an assistant sharing it reads the same output
    draft       the drafter proposes k_b tokens for each row b (k_b from the lookahead policy)
    verify      one main-model pass over [tokens the main cache lacks] + drafts, for all rows at once
    accept      greedy: the longest prefix of drafts equal to the main model's argmax, then the main
                model's own next token; sampling: the speculative-sampling rule
    repeat      until every row has emitted EOS or max_new_tokens; finished rows leave the batch

Nothing here knows about audio, files or UI: inputs are encoder inputs (tensors) and decoder prompts.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from . import rows as row_ops
from .decoders import Decoder, EncoderOutput
from .drafters import DrafterFactory
from .policies import CostMemory, PolicyOptions, make_policy
from .rows import aligned_rows, from_host, gather_rows
from .rules import PAD_GEN_LEN, Rules, Sampling, apply_rules, to_probs


@dataclass(frozen=True)
class DecodeOptions:
    max_new_tokens: int = 128  # per row, the prompt not counted
    do_sample: bool = False  # False: greedy (lossless); True: speculative sampling (same distribution)
    sampling: Sampling = Sampling()  # temperature / top-k / top-p when do_sample
    seed: int | None = None  # sampling seed (a fresh generator per call)
    policy: PolicyOptions = PolicyOptions()  # how many tokens to draft each round
    use_drafter: bool = True  # False: plain decoding through the same loop
    compare_plain: bool = False  # greedy only: also decode plainly and report, per row, identical outputs
    logits_at: int | None = None  # also return the main model's logits at this prompt index (Whisper's no-speech check)


@dataclass(frozen=True)
class DecodeStats:
    rows: int  # batch size
    new_tokens: int  # tokens emitted, all rows
    rounds: int  # loop iterations
    main_calls: int  # main-model decoder passes (one per round, however many rows it carries)
    draft_calls: int  # drafter forward passes
    encoder_calls: int  # encoder passes, main and assistant together (1 when the encoder output is shared)
    drafted: int  # draft tokens proposed
    accepted: int  # draft tokens accepted
    accepted_hist: dict[int, int] = field(default_factory=dict)  # accepted drafts per (row, round) -> count
    encode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    total_s: float = 0.0
    row_calls: int = 0  # main-model passes summed over rows: the passes each sequence took part in

    @property
    def acceptance(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def calls_per_token(self) -> float:
        """Main-model passes per emitted token, per sequence (1.0 for plain decoding at any batch size; lower
        is better): row_calls / new_tokens."""
        return self.row_calls / self.new_tokens if self.new_tokens else 0.0

    @property
    def tokens_per_call(self) -> float:
        """Tokens a sequence gains per main-model pass: accepted drafts + the main model's own token."""
        return self.new_tokens / self.row_calls if self.row_calls else 0.0

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(acceptance=self.acceptance, calls_per_token=self.calls_per_token, tokens_per_call=self.tokens_per_call)
        return out


@dataclass(frozen=True)
class DecodeResult:
    tokens: tuple[tuple[int, ...], ...]  # per row: the emitted tokens (EOS included when emitted)
    stats: DecodeStats
    identical: tuple[bool, ...] | None = None  # with compare_plain: per row, equal to plain greedy decoding
    plain_stats: DecodeStats | None = None  # with compare_plain: the plain run's statistics
    # per row: sum over the emitted tokens of log p(token), p = softmax of the main model's logits after the
    # rules, without temperature (Whisper's sum_logprobs; avg_logprob = sum / len)
    sum_logprobs: tuple[float, ...] = ()
    prompt_logits: torch.Tensor | None = None  # with logits_at: (rows, V) float32, the logits at that prompt index


def _truncate(tokens: list[int], eos: tuple[int, ...], room: int) -> tuple[list[int], bool]:
    """Cut after the first EOS and to ``room`` tokens; True when the row is finished."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    if len(tokens) >= room:
        return tokens[:room], True
    return tokens, False


def seeded_policy(options: DecodeOptions) -> PolicyOptions:
    """The lookahead policy of a request. A seeded sample is a function of its random draws, and how many draws
    a round takes follows the lookahead, so the adaptive policy (which reads wall-clock costs) would make one
    seed give other samples from run to run: a seeded sampled request takes the heuristic policy instead
    (+2 / -1 by acceptance, itself a function of the draws). The distribution is the main model's either way."""
    if options.do_sample and options.seed is not None and options.policy.name == "adaptive":
        return replace(options.policy, name="heuristic")
    return options.policy


def add_logprobs(total: float, logits: torch.Tensor, tokens: list[int]) -> float:
    """total + sum_j log softmax(logits[j])[tokens[j]], one position at a time and in order, so a token
    verified in a pass of several adds the same float as one decoded alone."""
    logits = aligned_rows(logits)  # on CUDA every row at the same alignment (rows.aligned_rows)
    for j, token in enumerate(tokens):
        total += float(torch.log_softmax(logits[j], dim=-1)[token])
    return total


def argmax_logprobs(logits: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
    """Per row and position of ``logits`` (B, n, V): the argmax id and log softmax(logits)[argmax], read to the
    host together (one synchronisation). The log-probabilities have the bits of ``add_logprobs``' one-row
    log_softmax (a row's log_softmax does not depend on the other rows)."""
    best = torch.argmax(logits, dim=-1)
    values = torch.log_softmax(aligned_rows(logits), dim=-1).gather(-1, best[..., None])[..., 0]
    ids, lps = torch.stack([best.double(), values.double()]).tolist()
    return [[int(t) for t in row] for row in ids], lps


def logprobs_at(logits: torch.Tensor, best: list[list[int]], counts: list[int]) -> list[list[float]]:
    """log softmax(logits[b, j])[best[b][j]] for j < counts[b], per row (one read), computing the softmax
    only at those positions: ``argmax_logprobs``' values where the argmax was read first (a CPU)."""
    batch, width, vocab = logits.shape
    where = [(b, j) for b, c in enumerate(counts) for j in range(c)]
    if not where:
        return [[] for _ in range(batch)]
    flat = logits.reshape(batch * width, vocab).index_select(0, from_host([b * width + j for b, j in where], torch.long, logits.device))
    tokens = from_host([[best[b][j]] for b, j in where], torch.long, logits.device)
    values = torch.log_softmax(aligned_rows(flat), dim=-1).gather(-1, tokens)[:, 0].double().tolist()
    out: list[list[float]] = [[] for _ in range(batch)]
    for (b, _), value in zip(where, values):
        out[b].append(value)
    return out


def accepted_prefix(drafts: list[int], best: list[int]) -> int:
    """The number of leading drafts equal to the main model's argmax at their positions (``best``)."""
    n = 0
    while n < len(drafts) and drafts[n] == best[n]:
        n += 1
    return n


def accept_sampling(drafts: list[int], qs: list[torch.Tensor | None], logits: torch.Tensor, sampling: Sampling,
                    generator: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling. p_j = main distribution at position j, q_j = the draft's.
    Accept d_j with probability min(1, p_j(d_j) / q_j(d_j)); on the first rejection draw from
    norm(max(p_j - q_j, 0)); if every draft is accepted draw the bonus token from p_k.
    A deterministic draft (prompt lookup) has q_j = one-hot(d_j)."""
    p = to_probs(logits, sampling)
    for j, (d, q) in enumerate(zip(drafts, qs)):
        if q is None:
            q = torch.zeros_like(p[j])
            q[d] = 1.0
        ratio = float(p[j, d] / q[d]) if q[d] > 0 else 0.0
        u = float(torch.rand((), generator=generator, device=p.device))
        if u < min(1.0, ratio):
            continue
        residual = torch.clamp(p[j] - q, min=0.0)
        total = residual.sum()
        residual = residual / total if total > 0 else p[j]
        return j, int(torch.multinomial(residual, 1, generator=generator))
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))


class AssistedDecoder:
    """A main model and (optionally) a drafter. Holds no per-request state (only measured costs, which
    the adaptive lookahead policy reads): call ``generate`` freely."""

    def __init__(self, main: Decoder, make_drafter: DrafterFactory | None = None,
                 pad_id: int = 0) -> None:
        if main.vocab_ids is not None:
            raise ValueError("the main model must score the whole vocabulary (this one has a reduced draft head)")
        self.main, self.make_drafter, self.pad_id = main, make_drafter, pad_id
        self.costs = CostMemory()

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], rules: Rules, options: DecodeOptions = DecodeOptions(),
                 encoder_inputs: dict | None = None, encoder_output: EncoderOutput | None = None) -> DecodeResult:
        t_start = time.perf_counter()
        rows = len(prompts)
        # the seeded generator lives on the model's device, as the distributions it samples from
        generator = torch.Generator(self.main.device).manual_seed(options.seed) if options.seed is not None else None
        sampling = options.sampling if options.do_sample else None
        use = options.use_drafter and self.make_drafter is not None
        drafter = self.make_drafter(rules, options.max_new_tokens) if use else None
        policy = make_policy(seeded_policy(options), self.costs)

        t0 = time.perf_counter()
        encoder_calls = 0
        enc = encoder_output
        if self.main.reads_encoder and enc is None:
            enc = self.main.encode(**encoder_inputs)
            encoder_calls += 1
        if drafter is not None:
            encoder_calls += drafter.start(prompts, enc, encoder_inputs)
        encode_s = time.perf_counter() - t0
        enc_all = enc

        cache = self.main.new_cache(rows, capacity=max(len(p) for p in prompts) + options.max_new_tokens + 1)
        seqs = [list(p) for p in prompts]
        prompt_lens = [len(p) for p in prompts]
        pending = [list(p) for p in prompts]  # tokens the main cache lacks
        out: list[list[int]] = [[] for _ in range(rows)]
        alive = list(range(rows))  # original row index of each batch row
        done = [False] * rows  # finished rows stay in the batch (fed nothing) until enough have finished
        hist: Counter[int] = Counter()
        logprobs = [0.0] * rows
        prompt_logits = None
        n_rounds = main_calls = draft_calls = drafted_total = accepted_total = 0
        draft_s = verify_s = 0.0

        try:
            while not all(done):
                n_rounds += 1
                gen_lens = [len(s) - pl for s, pl in zip(seqs, prompt_lens)]
                ks = policy.next_k(len(alive)) if drafter is not None else [0] * len(alive)
                ks = [0 if d else min(k, options.max_new_tokens - g - 1) for k, g, d in zip(ks, gen_lens, done)]
                if drafter is not None and any(k > 0 for k in ks):
                    d = drafter.draft(ks, seqs, gen_lens, sampling, generator, policy.stop_below)
                    drafts, qs, draft_calls, draft_s = d.tokens, d.probs, draft_calls + d.steps, draft_s + d.seconds
                    d_s = d.seconds
                else:
                    drafts, qs, d_s = [[] for _ in alive], None, 0.0

                # verify: one main pass over pending + drafts; logits from the last pending token on
                t1 = time.perf_counter()
                chunks = [p + dr for p, dr in zip(pending, drafts)]
                need = [len(p) - 1 for p in pending]
                if n_rounds == 1 and options.logits_at is not None:  # the prompt's own logits from that index on
                    need = [min(n, options.logits_at) for n in need]
                logits, _ = self.main.forward(chunks, cache, enc, self.pad_id, need_from=need)
                if n_rounds == 1 and options.logits_at is not None:
                    prompt_logits = logits[:, options.logits_at].clone()
                main_calls += 1
                width = max(len(dr) for dr in drafts) + 1
                # each live row's logits from its last pending token on: (B, width, V), -inf past its drafts
                counts = [0 if done[b] else len(dr) + 1 for b, dr in enumerate(drafts)]
                sel = gather_rows(logits, [max(len(p) - 1, 0) for p in pending], counts, width)
                # gen_len per position, a host tensor: the rules decide on the host (apply_rules)
                lens = torch.tensor([[g + j if j < c else PAD_GEN_LEN for j in range(width)] for g, c in zip(gen_lens, counts)],
                                    device="cpu")
                prefixes = None
                if rules.needs_prefix:
                    prefixes = [[seqs[b] + dr[:j] for j in range(len(dr) + 1)] for b, dr in enumerate(drafts)]
                apply_rules(rules, sel, lens, options.max_new_tokens, prefixes)

                accepted, emitted = [0] * len(alive), [[] for _ in alive]
                best_lp = None
                if sampling is None and row_ops.indexed(logits.device):  # the argmax and its log-probability everywhere: one read
                    best, best_lp = argmax_logprobs(sel)
                elif sampling is None:  # a CPU (reads cost nothing): the argmax now, log-probabilities of emitted tokens below
                    best = torch.argmax(sel, dim=-1).tolist()
                for b, (p, dr) in enumerate(zip(pending, drafts)):
                    if done[b]:
                        continue
                    row_logits = sel[b, : len(dr) + 1]
                    if sampling is None:
                        n = accepted_prefix(dr, best[b])
                        emitted[b], done[b] = _truncate(dr[:n] + [best[b][n]], rules.eos, options.max_new_tokens - gen_lens[b])
                    else:
                        n, nxt = accept_sampling(dr, qs[b] if qs else [None] * len(dr), row_logits, sampling, generator)
                        emitted[b], done[b] = _truncate(dr[:n] + [nxt], rules.eos, options.max_new_tokens - gen_lens[b])
                        logprobs[alive[b]] = add_logprobs(logprobs[alive[b]], row_logits, emitted[b])
                    accepted[b] = n
                    hist[n] += 1
                    drafted_total += len(dr)
                    accepted_total += n
                if sampling is None:
                    if best_lp is None:
                        best_lp = logprobs_at(sel, best, [len(e) for e in emitted])
                    for b, e in enumerate(emitted):
                        for value in best_lp[b][: len(e)]:  # in order, one token at a time (add_logprobs)
                            logprobs[alive[b]] += value
                kept = [0 if counts[b] == 0 else len(p) + accepted[b] for b, p in enumerate(pending)]
                keep = from_host([[j < k for j in range(logits.shape[1])] for k in kept], torch.bool, logits.device)
                cache.commit(keep, kept)
                v_s = time.perf_counter() - t1
                verify_s += v_s

                for b, new in enumerate(emitted):
                    seqs[b].extend(new)
                    out[alive[b]].extend(new)
                    pending[b] = [] if done[b] else [new[-1]]
                if drafter is not None:
                    drafter.update(drafts, accepted, emitted)
                    policy.observe([len(dr) for dr in drafts], accepted, d_s, v_s, width)

                # Finished rows leave the batch once they are a quarter of it (each removal copies the caches),
                # unless the main decoder keeps its shapes fixed for the whole request (whisper.WhisperDecoder).
                n_done = sum(done)
                if n_done and not all(done) and 4 * n_done >= len(alive) and not self.main.fixed_batch:
                    keep_rows = [b for b, f in enumerate(done) if not f]
                    alive, seqs, done = [alive[b] for b in keep_rows], [seqs[b] for b in keep_rows], [False] * len(keep_rows)
                    prompt_lens = [prompt_lens[b] for b in keep_rows]
                    pending = [pending[b] for b in keep_rows]
                    index = from_host(keep_rows, torch.long, self.main.device)
                    cache.select(index, keep_rows)
                    if enc is not None:
                        enc = enc.select(index)
                    if drafter is not None:
                        drafter.select(keep_rows)
                    policy.select(keep_rows)
                cache.maybe_compact(self.main.compact_at)

        finally:  # a pooled static cache goes back to its pool, whatever happened
            cache.release()
            if drafter is not None:
                drafter.finish()
        total_s = time.perf_counter() - t_start
        stats = DecodeStats(
            rows=rows, new_tokens=sum(len(o) for o in out), rounds=n_rounds, main_calls=main_calls,
            draft_calls=draft_calls, encoder_calls=encoder_calls, drafted=drafted_total, accepted=accepted_total,
            accepted_hist=dict(sorted(hist.items())), row_calls=sum(hist.values()), encode_s=encode_s, draft_s=draft_s, verify_s=verify_s,
            other_s=max(0.0, total_s - encode_s - draft_s - verify_s), total_s=total_s,
        )
        tokens = tuple(tuple(o) for o in out)
        if options.compare_plain and not options.do_sample:
            plain = self.generate(prompts, rules, replace(options, use_drafter=False, compare_plain=False),
                                  encoder_inputs, enc_all)
            same = tuple(a == b for a, b in zip(tokens, plain.tokens))
            return DecodeResult(tokens, stats, same, plain.stats, tuple(logprobs), prompt_logits)
        return DecodeResult(tokens, stats, sum_logprobs=tuple(logprobs), prompt_logits=prompt_logits)
