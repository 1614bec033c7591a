"""Beam search through the engine, plain or assisted, with the same output either way.

Each beam is a row of the main decoder (rows = inputs x beam_size, the encoder output repeated per beam), so
with a fixed-shape main decoder a beam's logits have the same bits whatever the other rows hold. Each input's
beams are a group with a search of its own (``beam.py``, one group each) and its own generated length. A round:

    draft       the assistant drafts a continuation d_r for every beam row r of a group that steps this
                round (k from the lookahead policy)
    verify      one main pass over [pending token] + d_r for those rows (nothing for the others): each row's
                logits at positions 0 .. len(d_r), position j scoring the prefix beam_r + d_r[:j]
    steps       for j = 0, 1, ...: for every group still stepping, gather its current beams' logits at their
                position j, apply the rules, take the log-probabilities (one (rows stepping, V) tensor) and run
                one step of the group's beam search on its N rows. The group's step is *drafted* when the
                beams it keeps are exactly its drafted extensions: every row of the group the source of one new
                beam, which appends that row's own d_r[j] (a permutation of the rows is allowed: the beams are
                relabelled). Then every new beam's next logits are already in the pass (position j + 1 of its
                row) and the group steps again on them. The first step of a group that is not drafted (or
                position min_r len(d_r) over its rows, past which some row has no logits) is still an exact
                step, from logits already computed; the group's round ends after it, the other groups go on.
    commit      each row's cache keeps its pending token and the drafts its group took; rows are copied to
                their new beams within their group (in place: a static cache keeps its buffers), each new beam's
                token pending for the next pass; the assistant's rows follow the same way

A group's steps are its own search's steps on its own rows' logits, computed by the same operations whatever
the other rows do (a row's log-softmax, rules and top-k read that row alone), so assisted beam search takes, per
input, the steps plain beam search takes, token for token and score for score; a batch of several files takes
drafted steps for each file whose beams agree with their drafts, whatever the others' do.

How far each group steps (``_limits``) keeps plain beam search's batch semantics: plain beam search steps every
search until all are done (whisper's ``DecodingTask`` over a batch), so a search done early is stepped on to the
batch's final length T, which whisper's ``finalize`` reads when fewer than N sequences finished (patience below
1). An open group steps until its search is done (or max_new_tokens); a done group no further than an open
group will surely get (its length now + 1), which is at most T; once all are done, T is the longest length and
the others catch up to it. A settled search (``Beams.settled``: its result no longer depends on its beams)
takes no more steps at all, plain or assisted. The assistant only decides how many steps a main pass covers;
where few steps are drafted, the adaptive policy (its acceptance counts the steps each group took) stops
drafting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .beam import BeamOptions, Beams, make_beams
from .calls import Counters, DecodeOptions, DecodeResult
from .core import AssistedDecoder
from .decoders import EncoderOutput
from .fixed import FixedCache
from .rows import aligned_rows, from_host
from .rules import Rules, apply_rules


@dataclass(kw_only=True)
class BeamRound(Counters):
    """The loop state of one ``beam_generate`` call, per physical row r and per input g (mutable, never
    shared); ``hist`` counts (input, round) pairs by the drafted steps the input took in the round."""

    seqs: list[list[int]]  # prompt + the beam's tokens so far
    pending: list[list[int]]  # tokens the main cache lacks
    gen: list[int]  # per input: tokens generated so far (its beams alike)
    input_calls: int = 0  # main passes summed over the inputs that stepped in them


@torch.inference_mode()
def beam_generate(engine: AssistedDecoder, prompts: list[list[int]], rules: Rules, options: DecodeOptions,
                  beam: BeamOptions, encoder_inputs: dict | None = None,
                  encoder_output: EncoderOutput | None = None) -> DecodeResult:
    """Beam search (``beam``) of ``prompts`` (one list of ids per input) under ``rules``, assisted when
    ``options.use_drafter`` and the engine has a drafter (module docstring): per input the winning tokens
    (EOS included where it ended so), their summed log-probability, and the statistics (a row of the
    statistics is an input; drafted and accepted count beam rows' tokens). ``encoder_output`` (inputs, S, D)
    or ``encoder_inputs`` as ``AssistedDecoder.generate`` takes them; ``options.logits_at`` and
    ``options.compare_plain`` as there. Raises ValueError for sampling options (beam search is greedy's)."""
    if options.do_sample:
        raise ValueError("beam search does not sample: do_sample must be False")
    groups, n = len(prompts), beam.beam_size
    begun = engine.start(prompts, rules, options, encoder_inputs, encoder_output, engine.beam_costs, beams=n)
    row_prompts = [list(p) for p in prompts for _ in range(n)]
    searches = [make_beams(beam, 1, rules.eos) for _ in range(groups)]
    state = BeamRound(seqs=[list(p) for p in row_prompts], pending=[list(p) for p in row_prompts], gen=[0] * groups)
    cache = engine.main.new_cache(groups * n, capacity=max(len(p) for p in prompts) + options.max_new_tokens + 1)
    try:
        while True:
            limits = _limits(searches, state.gen, options.max_new_tokens)
            if all(g >= m for g, m in zip(state.gen, limits)):
                break
            _round(engine, state, searches, limits, cache, begun.enc, begun.drafter, begun.policy, rules, options, n)
    finally:
        cache.release()
        if begun.drafter is not None:
            begun.drafter.finish()
    best = [s.finalize()[0] for s in searches]
    tokens = tuple(t for t, _ in best)
    stats = state.stats(begun, groups, sum(len(t) for t in tokens), state.input_calls)
    return engine.compared(tokens, stats, tuple(s for _, s in best), state.prompt_logits, options,
                           lambda plain: beam_generate(engine, prompts, rules, plain, beam, encoder_output=begun.encoded))


def _limits(searches: list[Beams], gen: list[int], max_new: int) -> list[int]:
    """Per input, the generated length its search may reach this round (module docstring): max_new while open;
    once done, no further than an open search will surely get (min(length + 1, max_new) of the longest open
    one; with none open, the longest length: plain beam search's final length); a settled one stays."""
    open_lens = [min(g + 1, max_new) for g, s in zip(gen, searches) if not s.done]
    horizon = max(open_lens) if open_lens else max(gen)
    return [g if s.settled else max_new if not s.done else min(horizon, max_new) for g, s in zip(gen, searches)]


def _round(engine: AssistedDecoder, state: BeamRound, searches: list[Beams], limits: list[int], cache,
           enc: EncoderOutput | None, drafter, policy, rules: Rules, options: DecodeOptions, n: int) -> None:
    """One round (module docstring): draft, one verify pass, the steps each group's drafts cover, commit."""
    rows = len(state.seqs)
    state.rounds += 1
    stepping = [g for g, (m, lim) in enumerate(zip(state.gen, limits)) if m < lim]
    state.input_calls += len(stepping)
    ks = [0] * rows
    # no drafts before a group's first step: it expands one prompt into N beams, never each row's own extension
    drafting = [g for g in stepping if state.gen[g]] if drafter is not None else []
    if drafting:
        wanted = policy.next_k(rows)
        for g in drafting:
            for r in range(g * n, (g + 1) * n):
                ks[r] = max(0, min(wanted[r], limits[g] - state.gen[g] - 1))
    drafts, d_s = [[] for _ in range(rows)], 0.0
    if any(ks):
        d = drafter.draft(ks, state.seqs, [state.gen[r // n] for r in range(rows)], None, None, policy.stop_below)
        drafts, d_s = d.tokens, d.seconds
        state.draft_calls += d.steps
        state.draft_s += d_s
    t1 = time.perf_counter()
    first = state.rounds == 1 and options.logits_at is not None
    fed = set(stepping)
    chunks = [p + dr if r // n in fed else [] for r, (p, dr) in enumerate(zip(state.pending, drafts))]
    need = [len(p) - 1 for p in state.pending]
    if first:
        need = [min(m, options.logits_at) for m in need]
    logits, _ = engine.main.forward(chunks, cache, enc, engine.pad_id, need_from=need)
    state.main_calls += 1
    if first:
        state.prompt_logits = logits[::n, options.logits_at].clone()
    taken, sources, tokens = _steps(state, searches, limits, stepping, logits, drafts, rules, options, n)
    v_s = time.perf_counter() - t1
    state.verify_s += v_s
    state.drafted += sum(len(dr) for dr in drafts)
    accepted = [taken.get(r // n, 0) for r in range(rows)]
    state.accepted += sum(accepted)
    for g in stepping:
        state.hist[taken[g]] += 1
    _commit(state, cache, chunks, drafts, accepted, sources, tokens, engine.main.device)
    if drafter is not None:
        drafter.update(drafts, accepted, [dr[:a] for dr, a in zip(drafts, accepted)])
        drafter.select(sources, same_encoder=True)  # beams stay within their input
        drafter.update([[] for _ in range(rows)], [0] * rows, [[] if t is None else [t] for t in tokens])
        policy.observe([len(dr) for dr in drafts], accepted, d_s, v_s, max(len(dr) for dr in drafts) + 1)


def _steps(state: BeamRound, searches: list[Beams], limits: list[int], stepping: list[int], logits: torch.Tensor,
           drafts: list[list[int]], rules: Rules, options: DecodeOptions,
           n: int) -> tuple[dict[int, int], list[int], list[int | None]]:
    """The steps of one verify pass (module docstring), each stepping group's search advanced and
    ``state.gen`` with it. Returns per stepping group the drafted steps it took, and per row the row its new
    beam copies (itself for a group that did not step) and the beam's new token (None there)."""
    offsets = [len(p) - 1 for p in state.pending]
    last = {g: min(len(dr) for dr in drafts[g * n : (g + 1) * n]) for g in stepping}
    was_done = {g: searches[g].done for g in stepping}
    phys = list(range(len(state.seqs)))  # the row holding each current beam
    sources, tokens = list(phys), [None] * len(phys)
    taken: dict[int, int] = {}
    active, j = list(stepping), 0
    while active:
        cur = [phys[r] for g in active for r in range(g * n, (g + 1) * n)]
        lp = _logprobs(logits, cur, [offsets[r] + j for r in cur], rules, [state.gen[r // n] for r in cur],
                       options.max_new_tokens, [state.seqs[r] + drafts[r][:j] for r in cur], searches[0].options.style)
        going = []
        for i, g in enumerate(active):
            step = searches[g].step(lp[i * n : (i + 1) * n], state.gen[g], options.max_new_tokens)
            state.gen[g] += 1
            base = g * n
            drafted = j < last[g] and sorted(step.sources) == list(range(n)) and all(
                t == drafts[phys[base + s]][j] for s, t in zip(step.sources, step.tokens))
            if drafted and searches[g].done == was_done[g] and state.gen[g] < limits[g]:
                phys[base : base + n] = [phys[base + s] for s in step.sources]
                going.append(g)
                continue
            taken[g] = j
            sources[base : base + n] = [phys[base + s] for s in step.sources]
            tokens[base : base + n] = step.tokens
        active, j = going, j + 1
    return taken, sources, tokens


def _logprobs(logits: torch.Tensor, rows: list[int], cols: list[int], rules: Rules, gen_lens: list[int], max_new: int,
              prefixes: list[list[int]], style: str) -> torch.Tensor:
    """(len(rows), V) float32 log-probabilities of ``logits[rows[i], cols[i]]`` (a new tensor, each row's values
    computed from that row alone, plain or assisted): whisper's log_softmax(rules(x)), or transformers'
    rules(log_softmax(x)); row i's rules at generated length ``gen_lens[i]`` after ``prefixes[i]`` (its beam's
    whole sequence)."""
    device = logits.device
    x = logits[from_host(rows, torch.long, device), from_host(cols, torch.long, device)]
    vocab = x.shape[-1]
    lens = torch.tensor([[g] for g in gen_lens], dtype=torch.long, device="cpu")  # the rules decide on the host
    if style == "transformers":
        x = torch.log_softmax(aligned_rows(x), dim=-1)[:, :vocab].contiguous()
    apply_rules(rules, x[:, None, :], lens, max_new, [[p] for p in prefixes] if rules.needs_prefix else None)
    if style == "transformers":
        return x
    return torch.log_softmax(aligned_rows(x), dim=-1)[:, :vocab]


def _commit(state: BeamRound, cache, chunks: list[list[int]], drafts: list[list[int]], accepted: list[int],
            sources: list[int], tokens: list[int | None], device: torch.device) -> None:
    """Each fed row's cache keeps its pending tokens and the ``accepted[r]`` drafts its group took (a row fed
    nothing keeps nothing); new beam i is a copy of row ``sources[i]`` (in its own group) with ``tokens[i]``
    pending (a static cache's rows are copied in place, its buffers kept); a row whose group did not step
    (``tokens[i]`` None, ``sources[i]`` i) stays as it is."""
    width = max(len(c) for c in chunks)
    cache.commit_prefix([len(p) + a if c else 0 for p, a, c in zip(state.pending, accepted, chunks)], width)
    if sources != list(range(len(sources))):
        host = list(sources)
        index = from_host(host, torch.long, device)
        if isinstance(cache, FixedCache):
            for buffers in (cache.keys, cache.values):
                for b in buffers:
                    b.copy_(b.index_select(0, index))
            cache.next_pos = [cache.next_pos[s] for s in host]
        else:
            cache.select(index, host)
    state.seqs = [state.seqs[s] if t is None else state.seqs[s] + drafts[s][: accepted[s]] + [t]
                  for s, t in zip(sources, tokens)]
    state.pending = [state.pending[s] if t is None else [t] for s, t in zip(sources, tokens)]
