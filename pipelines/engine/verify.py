"""Verification and acceptance: what a verify pass's logits decide.

    greedy      accepted = the longest prefix of drafts equal to the main model's argmax at their positions,
                then the main model's own next token (``accepted_prefix``)
    sampling    speculative sampling (``accept_sampling``): draft d_j kept with probability
                min(1, p_j(d_j) / q_j(d_j)), the first rejected one replaced by a draw from norm(max(p_j - q_j, 0))
    log-probs   Whisper's sum_logprobs: log softmax of the main model's logits at each emitted token, one
                position at a time, so a token verified among others adds the same float as one decoded alone
"""

from __future__ import annotations

import torch

from .rows import aligned_rows, from_host
from .rules import Sampling, to_probs


def truncate(tokens: list[int], eos: tuple[int, ...], room: int) -> tuple[list[int], bool]:
    """Cut after the first EOS and to ``room`` tokens; True when the row is finished."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1], True
    if len(tokens) >= room:
        return tokens[:room], True
    return tokens, False


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
    return read_choice(greedy_choice(logits))


def greedy_choice(logits: torch.Tensor) -> torch.Tensor:
    """(2, B, n) float64 for ``logits`` (B, n, V), on their device: [0] the argmax ids, [1] log softmax(logits)
    at them (``argmax_logprobs`` before its read; also the epilogue of a main pass's graph,
    ``fixed.FixedShapeDecoder.fused_choice``, so both give the same bits)."""
    best = torch.argmax(logits, dim=-1)
    values = torch.log_softmax(aligned_rows(logits), dim=-1).gather(-1, best[..., None])[..., 0]
    return torch.stack([best.double(), values.double()])


def read_choice(choice: torch.Tensor, width: int | None = None,
                offsets: list[int] | None = None) -> tuple[list[list[int]], list[list[float]]]:
    """``greedy_choice``'s ids and log-probabilities per row, of its first ``width`` positions (default all), in
    one read; ``offsets[b]``: row b's positions start at that column."""
    ids, lps = choice.tolist()
    end = width or choice.shape[-1]
    starts = offsets or [0] * len(ids)
    return [[int(t) for t in r[o : o + end]] for r, o in zip(ids, starts)], [r[o : o + end] for r, o in zip(lps, starts)]


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
