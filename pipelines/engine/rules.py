"""Logits rules applied identically to the main model and the drafts, and sampling warpers.

The rules are the greedy-decoding constraints that ``generate`` would apply for the same generation
config: suppressed tokens, tokens suppressed at the first step, a minimum length (no EOS before it),
forced first and last tokens, Whisper's timestamp rules, and any other transformers ``LogitsProcessor``
(no-repeat n-grams, repetition penalty), which are called row by row on the exact prefix each position
would have. Everything but those processors is applied to the whole (rows, positions, vocab) tensor at once.

Logits may cover a reduced vocabulary (a drafter's head over a subset of ids, ``vocab`` = the sorted ids of
its columns): the rules are then applied to the columns those ids map to. Transformers processors expect the
full vocabulary and are skipped there; a draft they would have forbidden is rejected by verification, which
always applies every rule over the full vocabulary.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .rows import from_host, per_vocabulary, to_device
from .timestamps import TimestampRules, apply_timestamp_rules

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
    timestamps: TimestampRules | None = None  # Whisper's timestamp rules, when decoding with timestamps

    @property
    def needs_prefix(self) -> bool:
        return bool(self.processors) or self.timestamps is not None


def rules_from_generation_config(gen, prompt_len: int, max_new_tokens: int) -> Rules:
    """The rules ``generate(do_sample=False, num_beams=1)`` applies for this generation config."""
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

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


def device_rules_from(rules: Rules) -> int | None:
    """The generated length from which ``apply_rules`` does nothing a device path cannot do from each position's
    generated length and timestamp state alone (no host read): fill the suppressed columns, the first token's
    suppressions and the minimum length's end ids (``apply_length_rules``), Whisper's timestamp rules
    (``timestamps.py``). 0 for Whisper's rules; 1 past a forced first token; None where processors read each
    prefix or a forced last token depends on max_new_tokens. From there on the draft loop's steps and the
    main decoder's choice graph apply the rules on the device."""
    if rules.processors or rules.forced_last is not None:
        return None
    return 1 if rules.forced_first is not None else 0


def length_rules_until(rules: Rules) -> int:
    """The generated length from which ``apply_length_rules`` changes nothing: past the first token where its
    ids are suppressed, and past a minimum length."""
    return max(1 if rules.begin_suppress else 0, rules.min_new_tokens if rules.eos else 0)


def length_columns(rules: Rules, vocab: Sequence[int] | None, device: torch.device) -> tuple[torch.Tensor | None, ...]:
    """What ``apply_length_rules`` fills, as ``column_index`` tensors on ``device`` (made once, before any graph
    captures them): the columns of the first token's suppressed ids, and of the end ids while a minimum length
    holds; None where that rule is off (or none of its ids is among the columns)."""
    first = column_index(vocab, rules.begin_suppress, device) if rules.begin_suppress else None
    ends = column_index(vocab, rules.eos, device) if rules.min_new_tokens and rules.eos else None
    return tuple(None if c is None or not c.numel() else c for c in (first, ends))


def apply_length_rules(rules: Rules, logits: torch.Tensor, gen: torch.Tensor, columns: tuple[torch.Tensor | None, ...]) -> None:
    """Constrain ``logits`` (N, V') in place from ``gen`` (N,) long, each row's generated length, on the logits'
    device: -inf at the first token's suppressed columns where gen == 0 and at the end ids' where
    gen < min_new_tokens (``columns``: ``length_columns``). What ``apply_rules`` does with ``begin_suppress`` and
    ``min_new_tokens``, by device operations only: a row's columns are taken out, filled where the rule holds
    and put back, the rest unchanged to the bit."""
    first, ends = columns
    if first is not None:
        _fill_rows(logits, first, gen == 0)
    if ends is not None:
        _fill_rows(logits, ends, gen < rules.min_new_tokens)


def _fill_rows(logits: torch.Tensor, cols: torch.Tensor, where: torch.Tensor) -> None:
    """logits[i, cols] = -inf where ``where[i]`` (N,) bool holds, on the device: the columns taken out, filled
    and put back."""
    part = logits.index_select(-1, cols)
    part.masked_fill_(where[:, None], NEG_INF)
    logits.index_copy_(-1, cols, part)


def _forbid(logits: torch.Tensor, where: torch.Tensor, vocab: Sequence[int] | None, tokens: tuple[int, ...]) -> None:
    """logits[b, j, columns of ``tokens``] = -inf at the (b, j) where ``where`` (a host mask) holds: integer
    indices, so the device needs no synchronisation to size the selection. The columns are filled with
    ``index_fill_``: a Python number assigned through a tensor index (``t[..., idx] = -inf``) is first copied
    to the device as a tensor, a blocking copy that waits for the stream (on an H200, torch 2.11: one
    synchronisation per rules call, 35 of the 50 of a greedy decode of 4 rows in 7 rounds)."""
    rows, cols = torch.nonzero(where, as_tuple=True)
    if not len(rows):
        return
    columns = column_index(vocab, tokens, logits.device)
    if columns.numel():
        index = (to_device(rows, logits.device), to_device(cols, logits.device))
        sub = logits[index]
        sub.index_fill_(1, columns, NEG_INF)
        logits[index] = sub


_COLUMN_INDEX: dict = {}  # rows.per_vocabulary's memo of column_index


def column_index(vocab: Sequence[int] | None, tokens: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``_columns(vocab, tokens)`` as a long tensor on ``device``, computed and copied once per vocabulary
    object, token tuple and device, then reused (``rows.per_vocabulary``, at most 64 entries). Recomputed at
    every call, they were half of a rules call's host time: Whisper base with the shipped assistant (its
    16,644-token head, Whisper's suppressed tokens), greedy at constant:3 on the CUDA path's choices on this
    2-core Intel Xeon, 111 us a call, 62 us with them kept (four calls a round)."""
    return per_vocabulary(_COLUMN_INDEX, 64, vocab, tuple(tokens), device,
                          lambda: from_host(_columns(vocab, tokens), torch.long, device))


def _force(scores: torch.Tensor, column: int | None) -> None:
    """Every column but ``column`` gets -inf (in place, one row); a token outside a reduced vocabulary
    (column None) leaves the row as it is: the draft may be wrong, verification decides."""
    if column is None:
        return
    keep = scores[column].clone()
    scores.fill_(NEG_INF)
    scores[column] = torch.where(torch.isfinite(keep), keep, torch.zeros_like(keep))


def _column_of(vocab: Sequence[int] | None):
    """x -> the first column whose id is >= x (columns hold ``vocab``'s sorted ids; None: column = id)."""
    if vocab is None:
        return lambda x: x
    return lambda x: bisect.bisect_left(vocab, x)


def _columns(vocab: Sequence[int] | None, tokens) -> list[int]:
    """The columns holding ``tokens`` (those present) in logits over ``vocab`` (sorted ids; None = all)."""
    if vocab is None:
        return list(tokens)
    col = _column_of(vocab)
    return [c for t, c in ((t, col(t)) for t in tokens) if c < len(vocab) and vocab[c] == t]


def _column(vocab: Sequence[int] | None, token: int) -> int | None:
    found = _columns(vocab, [token])
    return found[0] if found else None


def apply_rules(rules: Rules, logits: torch.Tensor, gen_lens: torch.Tensor, max_new_tokens: int,
                prefixes: list[list[list[int]]] | None = None, vocab: Sequence[int] | None = None) -> torch.Tensor:
    """Constrain ``logits`` (B, n, V) in place; ``gen_lens`` (B, n) is each position's gen_len (best a host
    tensor: the rules read it on the host).
    ``prefixes[b][j]`` is the whole decoder sequence before position j (needed by processors and timestamp
    rules). ``vocab``: the sorted ids of the logits' columns when they cover a reduced vocabulary."""
    lens = gen_lens.cpu()  # the callers build it on the host: decisions below read it without a device round trip
    if rules.suppress:  # index_fill_, not an indexed assignment: see _forbid
        logits.index_fill_(-1, column_index(vocab, rules.suppress, logits.device), NEG_INF)
    if rules.begin_suppress:
        _forbid(logits, lens == 0, vocab, rules.begin_suppress)
    if rules.min_new_tokens and rules.eos:
        _forbid(logits, lens < rules.min_new_tokens, vocab, rules.eos)
    processors = rules.processors if vocab is None else ()
    if rules.forced_first is None and rules.forced_last is None and not processors and rules.timestamps is None:
        return logits
    where = torch.nonzero(lens < PAD_GEN_LEN).tolist()
    if rules.timestamps is not None and prefixes is not None and where:
        # (the order of transformers' list: suppressions, then timestamps, then the other processors)
        rows, cols = zip(*where)
        index = (from_host(rows, torch.long, logits.device), from_host(cols, torch.long, logits.device))
        flat = logits[index]
        apply_timestamp_rules(rules.timestamps, flat, [rules.timestamps.state(prefixes[b][j]) for b, j in where], vocab)
        logits[index] = flat
    for b, j in where:
        g = int(lens[b, j])
        if rules.forced_first is not None and g == 0:
            _force(logits[b, j], _column(vocab, rules.forced_first))
        if rules.forced_last is not None and g == max_new_tokens - 1:
            _force(logits[b, j], _column(vocab, rules.forced_last))
        if processors and prefixes is not None and j < len(prefixes[b]):
            ids = torch.tensor([prefixes[b][j]], dtype=torch.long, device=logits.device)
            scores = logits[b, j][None]
            for proc in processors:
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
