"""Whisper's timestamp rules as one mask over the columns, from four numbers per row.

Before each token a row is summed up by its state (``TimestampRules.state``), four integers:

    last_ts    1 when the last generated token is a timestamp (id >= begin)
    pen_ts     1 when the token before it is one, or fewer than two tokens were generated
    latest     the latest generated timestamp id, -1 when there is none
    n          the tokens generated

and the rules (transformers' ``WhisperTimeStampLogitsProcessor``) leave a row the ids c in [lo, hi) but
<|notimestamps|> and the timestamps in [begin, low) (``timestamp_bounds``, ``timestamp_mask``):

    lo   = eos where last_ts and not pen_ts (a lone timestamp: no text token), begin where n == 0, else 0
    hi   = begin where last_ts and pen_ts (after a pair no timestamp), begin + max_initial + 1 where n == 0
    low  = max(begin, latest + 1 - [a lone timestamp])      timestamps never decrease

then, from the log-probabilities: text columns -inf where logsumexp(log p[timestamps]) > max(log p[text]).
Every rule is a comparison of the column ids with the row's numbers, so all rows and positions take the
same few operations (no Python loop over rows), on the host's states (``apply_rules``, verification) or on
states a device loop keeps itself (``advance``: the greedy draft loop, ``draft_loop.py``, inside its graphs).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .rows import aligned_rows, from_host, per_vocabulary, rowwise_logsumexp, to_device

NEG_INF = float("-inf")
ANY = 1 << 40  # an upper bound past every id


@dataclass(frozen=True)
class TimestampRules:
    """Whisper's timestamp rules, exactly as transformers' ``WhisperTimeStampLogitsProcessor`` applies them,
    but for every (row, position) at once. With ``seq`` the tokens generated before a position and
    ``ts(t) = t >= begin``:
      - ``<|notimestamps|>`` is never emitted;
      - timestamps come in pairs: after a lone timestamp (ts(seq[-1]) and not ts(seq[-2])) no text token
        (id < eos) may follow; after a pair (or a timestamp at the start) no timestamp may follow;
      - timestamps never decrease: ids in [begin, last) are forbidden, last = the latest timestamp (+1 unless
        it is a lone one), or begin when there is none;
      - the first token is a timestamp, at most ``begin + max_initial``;
      - when logsumexp(log p over timestamps) > max(log p over text), every text token is forbidden."""

    no_timestamps: int
    begin: int  # id of <|0.00|>, the first timestamp token
    eos: int
    prompt_len: int  # generated tokens start here
    max_initial: int | None = None
    from_logprob: bool = True

    @classmethod
    def from_generation_config(cls, gen, prompt_len: int) -> TimestampRules:
        return cls(no_timestamps=gen.no_timestamps_token_id, begin=gen.no_timestamps_token_id + 1,
                   eos=gen.eos_token_id or gen.bos_token_id, prompt_len=prompt_len,
                   max_initial=getattr(gen, "max_initial_timestamp_index", None),
                   from_logprob=getattr(gen, "_detect_timestamp_from_logprob", True))

    def state(self, prefix: list[int]) -> tuple[int, int, int, int]:
        """(last_ts, pen_ts, latest, n) before the token after ``prefix`` (the whole decoder sequence; module
        docstring)."""
        n = len(prefix) - self.prompt_len
        last_ts = int(n >= 1 and prefix[-1] >= self.begin)
        pen_ts = int(n < 2 or prefix[-2] >= self.begin)
        latest = next((t for t in reversed(prefix[self.prompt_len :]) if t >= self.begin), -1)
        return last_ts, pen_ts, latest, n

    def states_along(self, prefix: list[int], tokens: list[int], count: int) -> list[tuple[int, int, int, int]]:
        """``state(prefix + tokens[:j])`` for j < ``count``: the first from ``prefix``, each next moved on by one
        token as ``advance`` moves it on the device (no prefix copied or scanned again)."""
        out = [self.state(prefix)] if count else []
        for t in tokens[: count - 1]:
            last_ts, _, latest, n = out[-1]
            is_ts = int(t >= self.begin)
            out.append((is_ts, int(last_ts or n == 0), t if is_ts else latest, n + 1))
        return out

    def advance(self, state: torch.Tensor, tokens: torch.Tensor) -> None:
        """``state`` (4, N) long (module docstring) after row i emitted ``tokens[i]`` (N,), in place on the
        device: what ``state`` of the prefix with the token appended gives."""
        is_ts = (tokens >= self.begin).long()
        state[1].copy_(state[0] | (state[3] == 0).long())  # the one before the next: the last, or fewer than two
        state[0].copy_(is_ts)
        state[2].copy_(torch.where(is_ts.bool(), tokens, state[2]))
        state[3].add_(1)


def timestamp_bounds(ts: TimestampRules, state: torch.Tensor) -> torch.Tensor:
    """(3, N) long per row from ``state`` (4, N) (module docstring), on its device: a row may take the ids in
    [lo, hi) but <|notimestamps|> and the timestamps in [begin, low); rows [0] lo, [1] hi, [2] low."""
    last_ts, pen_ts, latest, n = state
    pair, lone, first = last_ts & pen_ts, last_ts & (1 - pen_ts), (n == 0).long()  # (pair and first exclude each other)
    low = (latest + 1 - lone).clamp(min=ts.begin)  # timestamps never decrease (no latest: begin)
    lo = lone * ts.eos + first * ts.begin  # after a lone timestamp no text token; the first is a timestamp
    top = ts.begin + ts.max_initial + 1 if ts.max_initial is not None else ANY
    hi = ANY - pair * (ANY - ts.begin) - first * (ANY - top)  # after a pair no timestamp; the first an early one
    return torch.stack([lo, hi, low])


def timestamp_mask(ts: TimestampRules, ids: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """(N, V') bool, the columns the rules forbid: ``ids`` (V',) long the token id of each column, ``bounds``
    (3, N) long (``timestamp_bounds``), on the logits' device."""
    lo, hi, low = (b[:, None] for b in bounds)
    forbid = (ids < lo) | (ids >= hi) | ((ids >= ts.begin) & (ids < low)) | (ids == ts.no_timestamps)
    return forbid


def apply_timestamp_masks(ts: TimestampRules, logits: torch.Tensor, ids: torch.Tensor, bounds: torch.Tensor,
                          text_end: int) -> torch.Tensor:
    """Constrain ``logits`` (N, V') in place: ``timestamp_mask``, then the log-probability rule over text
    columns [0, ``text_end``) and timestamp columns [``text_end``, V'). Device operations only (no read)."""
    logits.masked_fill_(timestamp_mask(ts, ids, bounds), NEG_INF)
    if ts.from_logprob:
        # log p = log_softmax(z); the row must emit a timestamp when logsumexp(log p[ts]) > max(log p[text])
        # on CUDA every row at the same alignment, padded with -inf columns (rows.aligned_rows): exp(-inf) = 0
        logprobs = torch.log_softmax(aligned_rows(logits.float()), dim=-1)
        timestamp_lp = rowwise_logsumexp(logprobs[:, text_end:])
        text_lp = logprobs[:, :text_end].max(dim=-1).values
        logits[:, :text_end].masked_fill_((timestamp_lp > text_lp)[:, None], NEG_INF)
    return logits


def apply_timestamp_rules(ts: TimestampRules, logits: torch.Tensor, states: list[tuple[int, int, int, int]],
                          vocab: Sequence[int] | None = None) -> torch.Tensor:
    """Constrain ``logits`` (N, V) in place, row i by ``states[i]`` (``TimestampRules.state``): the bounds
    computed on the host, one copy to the device. ``vocab``: the sorted ids of the columns (None: column = id)."""
    bounds = timestamp_bounds(ts, torch.tensor([list(s) for s in zip(*states)], dtype=torch.long, device="cpu"))
    return apply_timestamp_masks(ts, logits, column_ids(vocab, logits.shape[-1], logits.device),
                                 to_device(bounds, logits.device), text_columns(ts, vocab))


def text_columns(ts: TimestampRules, vocab: Sequence[int] | None) -> int:
    """The columns before the first timestamp's: text ids (columns hold ``vocab``'s sorted ids; None: all)."""
    return ts.begin if vocab is None else bisect.bisect_left(vocab, ts.begin)


_COLUMN_IDS: dict = {}  # rows.per_vocabulary's memo of column_ids


def column_ids(vocab: Sequence[int] | None, columns: int, device: torch.device) -> torch.Tensor:
    """(columns,) long on ``device``: the token id of each column (``vocab``, or the column itself), copied
    once per vocabulary object and device (``rows.per_vocabulary``, at most 16 entries)."""
    return per_vocabulary(_COLUMN_IDS, 16, vocab, (columns,), device, lambda: torch.arange(columns, device=device)
                          if vocab is None else from_host(list(vocab), torch.long, device))
