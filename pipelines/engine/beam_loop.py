"""Beam search through the engine, plain or assisted, with the same output either way.

Each beam is a row of the main decoder (rows = inputs x beam_size, the encoder output repeated per beam), so
with a fixed-shape main decoder a beam's logits have the same bits whatever the other rows hold. A round:

    draft       the assistant drafts a continuation d_r for every beam row r (k from the lookahead policy)
    verify      one main pass over [pending token] + d_r for every row: each row's logits at positions
                0 .. len(d_r), position j scoring the prefix beam_r + d_r[:j]
    steps       for j = 0, 1, ...: gather each current beam's logits at its position j (rows, V), apply the
                rules, take the log-probabilities and run one step of beam search (``beam.py``) on them.
                The step is *drafted* when the beams it keeps are exactly the drafted extensions: every row
                the source of one new beam, which appends that row's own d_r[j] (a permutation of the rows is
                allowed: the beams are relabelled). Then every new beam's next logits are already in the
                pass (position j + 1 of its row) and the next step runs on them. The first step that is not
                drafted (or position min_r len(d_r), past which some row has no logits) is still an exact
                step, from logits already computed; the round ends after it.
    commit      each row's cache keeps its pending token and the j drafts its beam took; rows are copied
                to their new beams (in place: a static cache keeps its buffers), each new beam's token
                pending for the next pass; the assistant's rows follow the same way

Every step runs ``beam.py`` on log-probabilities computed from the same logits by the same operations on a
(rows, V) tensor of the same shape as a plain step's, so assisted beam search takes the steps plain beam
search takes, token for token and score for score. The assistant only decides how many steps a main pass
covers; where few steps are drafted, the adaptive policy (its acceptance counts steps every beam took)
stops drafting.
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
    """The loop state of one ``beam_generate`` call, per physical row r (mutable, never shared); ``hist`` counts
    rounds by the drafted steps they took."""

    seqs: list[list[int]]  # prompt + the beam's tokens so far
    pending: list[list[int]]  # tokens the main cache lacks
    gen: int = 0  # tokens generated so far (every beam alike)


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
    beams = make_beams(beam, groups, rules.eos)
    state = BeamRound(seqs=[list(p) for p in row_prompts], pending=[list(p) for p in row_prompts])
    cache = engine.main.new_cache(groups * n, capacity=max(len(p) for p in prompts) + options.max_new_tokens + 1)
    try:
        while not beams.done and state.gen < options.max_new_tokens:
            _round(engine, state, beams, cache, begun.enc, begun.drafter, begun.policy, rules, options, beam)
    finally:
        cache.release()
        if begun.drafter is not None:
            begun.drafter.finish()
    best = beams.finalize()
    tokens = tuple(t for t, _ in best)
    stats = state.stats(begun, groups, sum(len(t) for t in tokens), state.main_calls * groups)
    return engine.compared(tokens, stats, tuple(s for _, s in best), state.prompt_logits, options,
                           lambda plain: beam_generate(engine, prompts, rules, plain, beam, encoder_output=begun.encoded))


def _round(engine: AssistedDecoder, state: BeamRound, beams: Beams, cache, enc: EncoderOutput | None, drafter,
           policy, rules: Rules, options: DecodeOptions, beam: BeamOptions) -> None:
    """One round (module docstring): draft, one verify pass, the steps it covers, commit."""
    rows = len(state.seqs)
    state.rounds += 1
    room = options.max_new_tokens - state.gen - 1
    # no drafts before the first step: it expands one prompt into N beams, never each row's own extension
    ks = [max(0, min(k, room)) for k in policy.next_k(rows)] if drafter is not None and state.gen else [0] * rows
    drafts, d_s = [[] for _ in range(rows)], 0.0
    if any(ks):
        d = drafter.draft(ks, state.seqs, [state.gen] * rows, None, None, policy.stop_below)
        drafts, d_s = d.tokens, d.seconds
        state.draft_calls += d.steps
        state.draft_s += d_s
    t1 = time.perf_counter()
    first = state.rounds == 1 and options.logits_at is not None
    need = [len(p) - 1 for p in state.pending]
    if first:
        need = [min(m, options.logits_at) for m in need]
    logits, _ = engine.main.forward([p + dr for p, dr in zip(state.pending, drafts)], cache, enc, engine.pad_id,
                                    need_from=need)
    state.main_calls += 1
    if first:
        state.prompt_logits = logits[:: beam.beam_size, options.logits_at].clone()
    offsets = [len(p) - 1 for p in state.pending]
    last = min(len(dr) for dr in drafts)
    phys = list(range(rows))  # the row holding each current beam
    for j in range(last + 1):
        lp = _logprobs(logits, phys, [offsets[r] + j for r in phys], rules, state.gen, options.max_new_tokens,
                       [state.seqs[r] + drafts[r][:j] for r in phys], beam.style)
        step = beams.step(lp, state.gen, options.max_new_tokens)
        state.gen += 1
        drafted = j < last and sorted(step.sources) == list(range(rows)) and all(
            t == drafts[phys[s]][j] for s, t in zip(step.sources, step.tokens))
        if drafted and not beams.done and state.gen < options.max_new_tokens:
            phys = [phys[s] for s in step.sources]
            continue
        break
    v_s = time.perf_counter() - t1
    state.verify_s += v_s
    state.drafted += sum(len(dr) for dr in drafts)
    state.accepted += j * rows
    state.hist[j] += rows // beam.beam_size
    sources = [phys[s] for s in step.sources]
    _commit(state, cache, drafts, j, sources, step.tokens, engine.main.device)
    if drafter is not None:
        drafter.update(drafts, [j] * rows, [dr[:j] for dr in drafts])
        drafter.select(sources)
        drafter.update([[] for _ in range(rows)], [0] * rows, [[t] for t in step.tokens])
        policy.observe([len(dr) for dr in drafts], [j] * rows, d_s, v_s, max(len(dr) for dr in drafts) + 1)


def _logprobs(logits: torch.Tensor, rows: list[int], cols: list[int], rules: Rules, gen_len: int, max_new: int,
              prefixes: list[list[int]], style: str) -> torch.Tensor:
    """(len(rows), V) float32 log-probabilities of ``logits[rows[i], cols[i]]`` (a new tensor of one shape,
    plain or assisted): whisper's log_softmax(rules(x)), or transformers' rules(log_softmax(x)); the rules at
    generated length ``gen_len`` after ``prefixes`` (each beam's whole sequence)."""
    device = logits.device
    x = logits[from_host(rows, torch.long, device), from_host(cols, torch.long, device)]
    vocab = x.shape[-1]
    lens = torch.full((len(rows), 1), gen_len, dtype=torch.long, device=device)
    if style == "transformers":
        x = torch.log_softmax(aligned_rows(x), dim=-1)[:, :vocab].contiguous()
    apply_rules(rules, x[:, None, :], lens, max_new, [[p] for p in prefixes] if rules.needs_prefix else None)
    if style == "transformers":
        return x
    return torch.log_softmax(aligned_rows(x), dim=-1)[:, :vocab]


def _commit(state: BeamRound, cache, drafts: list[list[int]], taken: int, sources: list[int],
            tokens: list[int], device: torch.device) -> None:
    """Each row's cache keeps its pending tokens and ``taken`` drafts; new beam i is a copy of row
    ``sources[i]`` with ``tokens[i]`` pending (a static cache's rows are copied in place, its buffers kept)."""
    n = max(len(p) + len(dr) for p, dr in zip(state.pending, drafts))
    cache.commit_prefix([len(p) + taken for p in state.pending], n)
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
    state.seqs = [state.seqs[s] + drafts[s][:taken] + [t] for s, t in zip(sources, tokens)]
    state.pending = [[t] for t in tokens]
