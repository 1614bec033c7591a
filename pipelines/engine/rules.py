"""Logits rules applied identically to the main model and the drafts, and sampling warpers.

The rules are the greedy-decoding constraints that ``generate`` would apply for the same generation
config: suppressed tokens, tokens suppressed at the first step, a minimum length (no EOS before it),
forced first and last tokens, and any other transformers ``LogitsProcessor`` (no-repeat n-grams,
Whisper's timestamp rules, repetition penalty), which are called row by row on the exact prefix each
position would have. Cheap rules are applied to the whole (rows, positions, vocab) tensor at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

NEG_INF = float("-inf")
PAD_GEN_LEN = 1 << 30  # gen_len given to padding positions: no rule applies there


@dataclass(frozen=True)
class Rules:
    """What constrains the next token. ``gen_len`` below is the number of tokens generated so far."""

    eos: tuple[int, ...] = ()  # end-of-sequence ids: the row stops after emitting one
    suppress: tuple[int, ...] = ()  # never emitted
    begin_suppress: tuple[int, ...] = ()  # not emitted as the first generated token
    min_new_tokens: int = 0  # EOS is suppressed while gen_len < min_new_tokens
    forced_first: int | None = None  # when set, the first generated token is this one
    forced_last: int | None = None  # when set, the token at gen_len == max_new_tokens - 1 is this one
    processors: tuple = field(default_factory=tuple)  # transformers LogitsProcessors, called per row

    @property
    def needs_prefix(self) -> bool:
        return bool(self.processors)


def rules_from_generation_config(gen, prompt_len: int, max_new_tokens: int) -> Rules:
    """The rules ``generate(do_sample=False, num_beams=1)`` applies for this generation config."""
    from transformers.generation.logits_process import (
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    eos = gen.eos_token_id
    eos = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    processors = []
    if getattr(gen, "repetition_penalty", None) not in (None, 1.0):
        processors.append(RepetitionPenaltyLogitsProcessor(gen.repetition_penalty))
    if getattr(gen, "no_repeat_ngram_size", None):
        processors.append(NoRepeatNGramLogitsProcessor(gen.no_repeat_ngram_size))
    # generate() counts min_length over the whole decoder sequence, min_new_tokens over new tokens only.
    min_new = max(getattr(gen, "min_new_tokens", None) or 0, (getattr(gen, "min_length", None) or 0) - prompt_len)
    forced_last = None
    if getattr(gen, "forced_eos_token_id", None) is not None:
        forced_last = gen.forced_eos_token_id if isinstance(gen.forced_eos_token_id, int) else gen.forced_eos_token_id[0]
    return Rules(
        eos=eos,
        suppress=tuple(gen.suppress_tokens or ()),
        begin_suppress=tuple(gen.begin_suppress_tokens or ()),
        min_new_tokens=min_new,
        forced_first=getattr(gen, "forced_bos_token_id", None) if prompt_len == 1 else None,
        forced_last=forced_last,
        processors=tuple(processors),
    )


def _force(scores: torch.Tensor, token: int) -> None:
    """Every token but ``token`` gets -inf (in place, one row)."""
    keep = scores[token].clone()
    scores.fill_(NEG_INF)
    scores[token] = keep if torch.isfinite(keep) else 0.0


def apply_rules(rules: Rules, logits: torch.Tensor, gen_lens: torch.Tensor, max_new_tokens: int,
                prefixes: list[list[list[int]]] | None = None) -> torch.Tensor:
    """Constrain ``logits`` (B, n, V) in place; ``gen_lens`` (B, n) is each position's gen_len.
    ``prefixes[b][j]`` is the whole decoder sequence before position j (needed only by processors)."""
    if rules.suppress:
        logits[..., list(rules.suppress)] = NEG_INF
    if rules.begin_suppress:
        first = gen_lens == 0
        if first.any():
            sub = logits[first]
            sub[:, list(rules.begin_suppress)] = NEG_INF
            logits[first] = sub
    if rules.min_new_tokens and rules.eos:
        early = gen_lens < rules.min_new_tokens
        if early.any():
            sub = logits[early]
            sub[:, list(rules.eos)] = NEG_INF
            logits[early] = sub
    if rules.forced_first is None and rules.forced_last is None and not rules.processors:
        return logits
    for b, j in torch.nonzero(gen_lens < PAD_GEN_LEN).tolist():
        g = int(gen_lens[b, j])
        if rules.forced_first is not None and g == 0:
            _force(logits[b, j], rules.forced_first)
        if rules.forced_last is not None and g == max_new_tokens - 1:
            _force(logits[b, j], rules.forced_last)
        if rules.processors and prefixes is not None and j < len(prefixes[b]):
            ids = torch.tensor([prefixes[b][j]], dtype=torch.long)
            scores = logits[b, j][None]
            for proc in rules.processors:
                scores = proc(ids, scores)
            logits[b, j] = scores[0]
    return logits


@dataclass(frozen=True)
class Sampling:
    """Sampling settings, applied identically to the main model's and the draft's distributions."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off


def to_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """softmax(logits / T) restricted to the top-k tokens and to the smallest top-p nucleus, renormalised."""
    x = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < x.shape[-1]:
        kth = torch.topk(x, sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, NEG_INF)
    if sampling.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(dim=-1)
        # keep a token while the mass before it is below top_p (the first token is always kept)
        drop_sorted = (cum - torch.softmax(sorted_x, dim=-1)) >= sampling.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, NEG_INF)
    return torch.softmax(x, dim=-1)
