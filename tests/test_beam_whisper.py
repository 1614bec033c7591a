"""``engine.beam.WhisperBeams`` against openai/whisper's own beam search, step for step, on random logits.

``_WhisperBeamSearch`` below is openai/whisper's ``BeamSearchDecoder.update`` / ``finalize`` and
``MaximumLikelihoodRanker.rank`` (whisper/decoding.py at commit c0d2f62, MIT licence), cut to what a step
needs (no KV cache to rearrange) and otherwise unchanged, so a step that differs from whisper's fails here.
No model: a few hundred small cases in about a second.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipelines.engine.beam import BeamOptions, WhisperBeams

VOCAB, EOT = 12, 11
PROMPT = [100, 101]  # whisper's rows hold the prompt too; Tandem's hold the generated tokens only


class _WhisperBeamSearch:
    """openai/whisper's BeamSearchDecoder (update, finalize) and MaximumLikelihoodRanker, verbatim in substance."""

    def __init__(self, beam_size: int, eot: int, patience: float | None, length_penalty: float | None) -> None:
        self.beam_size, self.eot, self.length_penalty = beam_size, eot, length_penalty
        self.max_candidates = round(beam_size * (patience or 1.0))
        self.finished_sequences = None

    def update(self, tokens: torch.Tensor, logits: torch.Tensor, sum_logprobs: torch.Tensor):
        n_audio = tokens.shape[0] // self.beam_size
        if self.finished_sequences is None:
            self.finished_sequences = [{} for _ in range(n_audio)]
        logprobs = F.log_softmax(logits.float(), dim=-1)
        next_tokens, finished_sequences = [], []
        for i in range(n_audio):
            scores, finished = {}, {}
            for j in range(self.beam_size):
                idx = i * self.beam_size + j
                prefix = tokens[idx].tolist()
                for logprob, token in zip(*logprobs[idx].topk(self.beam_size + 1)):
                    scores[tuple(prefix + [token.item()])] = (sum_logprobs[idx] + logprob).item()
            saved = 0
            for sequence in sorted(scores, key=scores.get, reverse=True):
                if sequence[-1] == self.eot:
                    finished[sequence] = scores[sequence]
                else:
                    sum_logprobs[len(next_tokens)] = scores[sequence]
                    next_tokens.append(sequence)
                    saved += 1
                    if saved == self.beam_size:
                        break
            finished_sequences.append(finished)
        for previously_finished, newly_finished in zip(self.finished_sequences, finished_sequences):
            for seq in sorted(newly_finished, key=newly_finished.get, reverse=True):
                if len(previously_finished) >= self.max_candidates:
                    break
                previously_finished[seq] = newly_finished[seq]
        completed = all(len(sequences) >= self.max_candidates for sequences in self.finished_sequences)
        return torch.tensor(next_tokens), completed

    def finalize_and_rank(self, preceding_tokens: torch.Tensor, sum_logprobs: torch.Tensor, sample_begin: int):
        """finalize, the slice DecodingTask.run makes (tokens before the first EOT), then the ranker's pick."""
        for i, sequences in enumerate(self.finished_sequences):
            if len(sequences) < self.beam_size:
                for j in list(np.argsort(sum_logprobs[i]))[::-1]:
                    sequences[tuple(preceding_tokens[i, j].tolist() + [self.eot])] = sum_logprobs[i][j].item()
                    if len(sequences) >= self.beam_size:
                        break
        picks = []
        for sequences in self.finished_sequences:
            texts = [torch.tensor(s) for s in sequences]
            texts = [t[sample_begin : (t == self.eot).nonzero()[0, 0]] for t in texts]
            sums = list(sequences.values())
            penalties = [len(t) if self.length_penalty is None else ((5 + len(t)) / 6) ** self.length_penalty
                         for t in texts]
            best = int(np.argmax([s / p for s, p in zip(sums, penalties)]))
            picks.append((tuple(texts[best].tolist()), sums[best]))
        return picks


def _compare(seed: int, n: int, groups: int, patience: float | None, length_penalty: float | None,
             max_new: int) -> bool:
    """Run both on the same random logits (EOT likelier each step, never first: whisper's SuppressBlank);
    assert every step's beams and float32 scores and the final pick agree. True when it ended by patience."""
    gen = torch.Generator().manual_seed(seed)
    ref = _WhisperBeamSearch(n, EOT, patience, length_penalty)
    ours = WhisperBeams(BeamOptions(n, patience, length_penalty), groups, (EOT,))
    tokens, sums = torch.tensor([PROMPT] * (groups * n)), torch.zeros(groups * n)
    done = False
    for step in range(max_new):
        logits = torch.randn(groups * n, VOCAB, generator=gen) * 2
        logits[:, EOT] += (step - 3) * 0.7
        if step == 0:  # every beam holds the prompt: equal rows
            logits = logits[::n].repeat_interleave(n, 0)
            logits[:, EOT] = -float("inf")
        tokens, done = ref.update(tokens, logits, sums)
        ours.step(torch.log_softmax(logits.float(), dim=-1), step, max_new)
        assert [tuple(t[len(PROMPT):]) for t in tokens.tolist()] == ours.seqs, f"seed {seed} step {step}"
        assert torch.equal(sums, ours.scores), f"seed {seed} step {step}"
        assert done == ours.done
        if done:
            break
    picks = ref.finalize_and_rank(tokens.view(groups, n, -1), sums.view(groups, n), len(PROMPT))
    assert [(tuple(t for t in toks if t != EOT), s) for toks, s in ours.finalize()] == picks, f"seed {seed}"
    return done


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_whisper_beams_step_for_step_as_openai_whisper(n):
    rng = random.Random(n)
    ended = 0
    for seed in range(40):
        patience = rng.choice([None, 0.5, 1.0, 1.5, 2.0])
        if round(n * (patience or 1.0)) < 1:
            patience = None
        ended += _compare(seed, n, rng.choice([1, 2, 3]), patience, rng.choice([None, 0.0, 0.6, 1.0]),
                          rng.choice([4, 8, 20]))
    assert 0 < ended < 40  # both ends were reached: patience's, and the length limit's (finalize adds beams)
