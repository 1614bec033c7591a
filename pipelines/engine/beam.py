"""Beam search's bookkeeping: which beams a step keeps, which sequences it finishes, which one wins.

Nothing here runs a model: a step takes every beam's log-probabilities (rows = groups x beam_size, float32)
and returns, per new beam, its source row and token (``beam_loop.py`` runs the decoder, plain or assisted).
Two semantics, ``BeamOptions.style``:

whisper (openai/whisper decoding.py: BeamSearchDecoder, MaximumLikelihoodRanker), Tandem's default:
    lp_b       = log_softmax(rules(logits_b))                                  per beam b, float32
    candidates = per beam b its top N + 1 tokens t, score s_b + lp_b[t] in float32, keyed by the sequence
                 (equal beams give one candidate: the first step's N copies of the prompt)
    kept       = candidates by score, highest first (a stable sort): one ending in EOS joins ``finished``,
                 any other becomes a beam, until N beams are kept
    finished   = per group at most M = round(N * patience) sequences (patience None: 1.0)
    done       = every group has M finished sequences (or max_new_tokens steps were taken)
    finalize   = a group with fewer than N finished adds its beams, best score first, until N
    winner     = argmax over the group's sequences of s / P(L), L = its tokens without EOS, P(L) = L
                 (length_penalty None) or ((5 + L) / 6) ** length_penalty (Google NMT's)

transformers (GenerationMixin._beam_search, early_stopping False), the reference of the tests:
    lp_b       = rules(log_softmax(logits_b))  (rules after the softmax: what they remove is not renormalised)
    first step: only beam 0 counts (the others start at -1e9)
    top        = the top K = max(2, 1 + E) N of s_b + lp_b[t] over every (b, t) (E end-of-sequence ids)
    beams      = the top N of ``top`` not ending (EOS, or the length limit reached)
    finished   = N slots, the best by s / L ** length_penalty (L = tokens generated, EOS included), fed by
                 the ending candidates among the first N of ``top``
    done       = every slot finished and the best beam's s / L ** lp no better than the worst slot, or the
                 length limit
    winner     = the best slot
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

STYLES = ("whisper", "transformers")
NEG = -1.0e9  # transformers' "never" score
HOST = torch.device("cpu")  # the bookkeeping's own tensors, whatever the model's device: a few numbers a step,
# read back by Python (each step moves what it combines with them to one device explicitly)


@dataclass(frozen=True)
class BeamOptions:
    """Beam search's settings, whisper's names. Raises ValueError with a sentence for a value out of range."""

    beam_size: int = 5  # beams per input (N)
    patience: float | None = None  # whisper: finished sequences collected = round(N * patience); None: 1.0
    length_penalty: float | None = None  # whisper: None ranks by s / L, alpha by s / ((5 + L) / 6) ** alpha;
    #                                      transformers: s / L ** length_penalty (None: 1.0)
    style: str = "whisper"  # one of STYLES (module docstring)

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"beam style must be one of {', '.join(STYLES)}, not {self.style!r}")
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, not {self.beam_size}")
        if self.patience is not None and self.patience <= 0:
            raise ValueError(f"patience must be above 0, not {self.patience}")
        if self.style == "whisper" and self.length_penalty is not None and not 0 <= self.length_penalty <= 1:
            raise ValueError(f"length_penalty must be from 0 to 1 (whisper's alpha), not {self.length_penalty}")

    @property
    def max_candidates(self) -> int:
        """Finished sequences a group collects before it is done (whisper): round(N * patience)."""
        return round(self.beam_size * (self.patience or 1.0))


@dataclass(frozen=True)
class Step:
    """What one step kept: per new beam row i, the row it extends (``sources[i]``, in its own group) and the
    token it appends (``tokens[i]``, never an end of sequence)."""

    sources: list[int]
    tokens: list[int]


class Beams:
    """One request's beams: ``groups`` inputs x ``beam_size`` rows, row g * N + i the i-th beam of input g.
    ``seqs[r]``: row r's generated tokens; ``scores`` (rows,) float32 their summed log-probabilities. A
    subclass gives the style's ``step`` and ``finalize``."""

    def __init__(self, options: BeamOptions, groups: int, eos: tuple[int, ...]) -> None:
        self.options, self.n, self.groups, self.eos = options, options.beam_size, groups, tuple(eos)
        self.seqs: list[tuple[int, ...]] = [()] * (groups * self.n)
        self.scores = torch.zeros(groups * self.n, dtype=torch.float32, device=HOST)
        self.done = False

    @property
    def settled(self) -> bool:
        """Whether no further step can change what ``finalize`` returns: the search is done and its result is
        read from finished sequences alone (plain beam search steps such a search on while others in its
        batch run; ``beam_loop.py`` need not)."""
        return self.done

    def step(self, logprobs: torch.Tensor, gen_len: int, max_new: int) -> Step:  # pragma: no cover - abstract
        """Extend the beams by one token from ``logprobs`` (rows, V) float32 on any device, each row's
        log-probabilities after the style's rules (``logprobs_of``); ``gen_len``: tokens generated before."""
        raise NotImplementedError

    def finalize(self) -> list[tuple[tuple[int, ...], float]]:  # pragma: no cover - abstract
        """Per group: the winning generated tokens (EOS included where it ended so) and their summed log-p."""
        raise NotImplementedError


class WhisperBeams(Beams):
    """openai/whisper's BeamSearchDecoder.update / finalize and MaximumLikelihoodRanker (module docstring)."""

    def __init__(self, options: BeamOptions, groups: int, eos: tuple[int, ...]) -> None:
        super().__init__(options, groups, eos)
        self.finished: list[dict[tuple[int, ...], float]] = [{} for _ in range(groups)]

    @property
    def settled(self) -> bool:
        """Done, with at least N finished sequences a group: ``finalize`` reads no beam. Never with patience
        below 1 (round(N * patience) < N finished), where it adds the beams of the last step taken."""
        return self.done and all(len(f) >= self.n for f in self.finished)

    def step(self, logprobs: torch.Tensor, gen_len: int, max_new: int) -> Step:
        n, cap = self.n, self.options.max_candidates
        top_values, top_ids = logprobs.float().topk(n + 1, dim=-1)
        # s_b + lp_b[t] in float32, as whisper's sum_logprobs[idx] + logprob
        cand_scores = (self.scores.to(top_values.device)[:, None] + top_values).tolist()
        cand_ids = top_ids.tolist()
        seqs, scores, sources, tokens = [], [], [], []
        for g in range(self.groups):
            scored: dict[tuple[int, ...], float] = {}
            source: dict[tuple[int, ...], int] = {}
            for r in range(g * n, (g + 1) * n):
                for s, t in zip(cand_scores[r], cand_ids[r]):
                    seq = self.seqs[r] + (t,)
                    scored[seq], source[seq] = s, r
            newly: dict[tuple[int, ...], float] = {}
            saved = 0
            for seq in sorted(scored, key=scored.get, reverse=True):
                if seq[-1] in self.eos:
                    newly[seq] = scored[seq]
                    continue
                seqs.append(seq)
                scores.append(scored[seq])
                sources.append(source[seq])
                tokens.append(seq[-1])
                saved += 1
                if saved == n:
                    break
            kept = self.finished[g]
            for seq in sorted(newly, key=newly.get, reverse=True):
                if len(kept) >= cap:
                    break
                kept[seq] = newly[seq]
        self.seqs, self.scores = seqs, torch.tensor(scores, dtype=torch.float32, device=HOST)
        self.done = all(len(f) >= cap for f in self.finished)
        return Step(sources, tokens)

    def finalize(self) -> list[tuple[tuple[int, ...], float]]:
        out = []
        eot = self.eos[0] if self.eos else -1
        for g, finished in enumerate(self.finished):
            candidates = dict(finished)
            cut = set()  # sequences still open at the length limit: whisper appends EOT, we leave it out
            if len(candidates) < self.n:
                group = self.scores[g * self.n : (g + 1) * self.n].numpy()
                for j in list(np.argsort(group))[::-1]:
                    key = self.seqs[g * self.n + int(j)] + (eot,)
                    candidates[key] = float(group[j])
                    cut.add(key)
                    if len(candidates) >= self.n:
                        break
            keys = list(candidates)
            ranked = [rank_score(candidates[k], len(k) - 1, self.options.length_penalty) for k in keys]
            best = keys[int(np.argmax(ranked))]
            out.append((best[:-1] if best in cut else best, candidates[best]))
        return out


def rank_score(sum_logprob: float, length: int, length_penalty: float | None) -> float:
    """whisper's MaximumLikelihoodRanker: sum_logprob / length (length_penalty None) or
    / ((5 + length) / 6) ** length_penalty; ``length``: tokens without EOS (0 counts as 1, where whisper
    would divide by zero: an empty text, which its rules never let the first step end)."""
    penalty = max(length, 1) if length_penalty is None else ((5 + length) / 6) ** length_penalty
    return sum_logprob / penalty


class TransformersBeams(Beams):
    """transformers' vectorised beam search (``GenerationMixin._beam_search``, early_stopping False): the
    same tensor operations on the same float32 values (module docstring)."""

    def __init__(self, options: BeamOptions, groups: int, eos: tuple[int, ...]) -> None:
        super().__init__(options, groups, eos)
        n = self.n
        self.alpha = 1.0 if options.length_penalty is None else options.length_penalty
        self.scores = self.scores.view(groups, n)
        self.scores[:, 1:] = NEG  # the first step expands beam 0 alone
        self.slot_seqs: list[list[tuple[int, ...]]] = [[()] * n for _ in range(groups)]
        self.slot_scores = torch.full((groups, n), NEG, dtype=torch.float32, device=HOST)
        self.slot_sums = torch.zeros(groups, n, dtype=torch.float32, device=HOST)  # the slots' unnormalised sums
        self.slot_done = torch.zeros(groups, n, dtype=torch.bool, device=HOST)
        self.improvable = torch.ones(groups, 1, dtype=torch.bool, device=HOST)
        self.keep = max(2, 1 + len(self.eos)) * n  # transformers' beams_to_keep
        self.top_mask = torch.arange(self.keep, device=HOST) < n

    def step(self, logprobs: torch.Tensor, gen_len: int, max_new: int) -> Step:
        n, groups = self.n, self.groups
        lp = logprobs.float().cpu()
        vocab = lp.shape[-1]
        acc = (lp.view(groups, n, vocab) + self.scores[:, :, None]).view(groups, n * vocab)
        top_values, top_index = torch.topk(acc, k=self.keep)
        top_rows, top_ids = top_index // vocab, top_index % vocab
        ending = torch.isin(top_ids, torch.tensor(self.eos, dtype=torch.long, device=HOST)) | (gen_len + 1 >= max_new)
        running = top_values + ending.to(torch.float32) * NEG
        chosen = torch.topk(running, k=n)[1]
        rows, ids = top_rows.gather(1, chosen).tolist(), top_ids.gather(1, chosen).tolist()
        new_scores = running.gather(1, chosen)
        # the finished slots: length-normalised, only the ending candidates among the first N of the top
        normalised = top_values / ((gen_len + 1) ** self.alpha)
        normalised += (~self.improvable).to(torch.float32) * NEG
        just = ending & self.top_mask[None, :]
        normalised += (~just) * NEG
        merged = torch.cat([self.slot_scores, normalised], dim=1)
        keep = torch.topk(merged, k=n)[1]
        merged_sums = torch.cat([self.slot_sums, top_values], dim=1)
        flat_rows, flat_ids = top_rows.tolist(), top_ids.tolist()
        slot_seqs = []
        for g in range(groups):
            pool = self.slot_seqs[g] + [self.seqs[g * n + r] + (t,) for r, t in zip(flat_rows[g], flat_ids[g])]
            slot_seqs.append([pool[k] for k in keep[g].tolist()])
        self.slot_seqs = slot_seqs
        self.slot_scores, self.slot_sums = merged.gather(1, keep), merged_sums.gather(1, keep)
        self.slot_done = torch.cat([self.slot_done, just], dim=1).gather(1, keep)
        sources = [g * n + r for g in range(groups) for r in rows[g]]
        tokens = [t for g in range(groups) for t in ids[g]]
        self.seqs = [self.seqs[s] + (t,) for s, t in zip(sources, tokens)]
        self.scores = new_scores
        # could a running beam still beat the worst finished slot? (the heuristic at length gen_len + 1)
        best = new_scores[:, :1] / ((gen_len + 1) ** self.alpha)
        worst = torch.where(self.slot_done, torch.min(self.slot_scores, dim=1, keepdim=True)[0], NEG)
        self.improvable = self.improvable & torch.any(best > worst, dim=-1, keepdim=True)
        self.done = not bool(self.improvable.any()) or bool(ending.all())
        return Step(sources, tokens)

    def finalize(self) -> list[tuple[tuple[int, ...], float]]:
        return [(self.slot_seqs[g][0], self.slot_sums[g, 0].item()) for g in range(self.groups)]


def make_beams(options: BeamOptions, groups: int, eos: tuple[int, ...]) -> Beams:
    """The bookkeeping of ``options.style`` for ``groups`` inputs."""
    return (WhisperBeams if options.style == "whisper" else TransformersBeams)(options, groups, eos)
