"""Tandem's vectorised Whisper timestamp rules equal transformers' WhisperTimeStampLogitsProcessor, bit for bit,
on every kind of prefix; and over a reduced vocabulary they constrain the columns those ids map to."""

import random

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

from pipelines.engine.rules import PAD_GEN_LEN, Rules, TimestampRules, apply_rules

VOCAB = 51865
PROMPT = [50258, 50259, 50359]
GEN = GenerationConfig(no_timestamps_token_id=50363, eos_token_id=50257, bos_token_id=50257, max_initial_timestamp_index=50)
BEGIN = 50364


def _prefixes(rng: random.Random, n: int) -> list[list[int]]:
    """Generated parts mixing text, lone timestamps, pairs, EOS-adjacent ids and decreasing timestamps."""
    out = [[]]
    for _ in range(n):
        seq = []
        for _ in range(rng.randrange(0, 12)):
            r = rng.random()
            seq.append(rng.randrange(0, 50257) if r < 0.5 else BEGIN + rng.randrange(0, 1501) if r < 0.9
                       else rng.choice([50256, 50257, BEGIN, BEGIN + 1500]))
        out.append(seq)
    return out


def test_equal_to_transformers_processor():
    rng = random.Random(0)
    torch.manual_seed(0)
    hf = WhisperTimeStampLogitsProcessor(GEN, begin_index=len(PROMPT))
    ts = TimestampRules.from_generation_config(GEN, len(PROMPT))
    rules = Rules(eos=(50257,), timestamps=ts)
    gens = _prefixes(rng, 60)
    logits = torch.randn(len(gens), 1, VOCAB) * 4
    # some rows where timestamps dominate, so the log-probability rule fires
    logits[::3, 0, BEGIN:] += 6.0
    want = torch.cat([hf(torch.tensor([PROMPT + g]), logits[i, :, :].clone()) for i, g in enumerate(gens)])
    got = logits.clone()
    apply_rules(rules, got, torch.tensor([[len(g)] for g in gens]), 448, [[PROMPT + g] for g in gens])
    assert torch.equal(got[:, 0], want)
    fired = torch.isinf(want[:, :BEGIN]).all(dim=1)
    assert 0 < int(fired.sum()) < len(gens)  # both branches of the log-probability rule were exercised


def test_positions_of_one_row_and_padding():
    """Several positions of a row (a verify pass over drafts) each get their own prefix; padding is untouched."""
    hf = WhisperTimeStampLogitsProcessor(GEN, begin_index=len(PROMPT))
    rules = Rules(eos=(50257,), timestamps=TimestampRules.from_generation_config(GEN, len(PROMPT)))
    drafts = [BEGIN, 440, 1029, BEGIN + 40, BEGIN + 40]
    logits = torch.randn(2, len(drafts) + 1, VOCAB) * 3
    lens = torch.tensor([list(range(len(drafts) + 1)), [0, 1] + [PAD_GEN_LEN] * (len(drafts) - 1)])
    prefixes = [[PROMPT + drafts[:j] for j in range(len(drafts) + 1)], [PROMPT, PROMPT + [BEGIN]]]
    got = logits.clone()
    apply_rules(rules, got, lens, 448, prefixes)
    for j in range(len(drafts) + 1):
        assert torch.equal(got[0, j], hf(torch.tensor([prefixes[0][j]]), logits[0, j][None].clone())[0])
    assert torch.equal(got[1, 2:], logits[1, 2:])


def test_reduced_vocabulary_maps_ids_to_columns():
    """A drafter's head over a subset of ids: the same rules, applied to the columns of those ids."""
    torch.manual_seed(1)
    vocab = torch.tensor(sorted(set(range(0, 50257, 7)) | {50257, 50363} | set(range(BEGIN, BEGIN + 1501, 2))))
    rules = Rules(eos=(50257,), suppress=(14, 21), timestamps=TimestampRules.from_generation_config(GEN, len(PROMPT)))
    full = torch.full((1, 1, VOCAB), float("-inf"))
    sub = torch.randn(1, 1, len(vocab)) * 3
    full[..., vocab] = sub
    gen = [BEGIN + 10, 440, 1029]
    apply_rules(rules, full, torch.tensor([[len(gen)]]), 448, [[PROMPT + gen]])
    apply_rules(rules, sub, torch.tensor([[len(gen)]]), 448, [[PROMPT + gen]], vocab=vocab.tolist())
    # forbidden columns agree with the full-vocabulary result (the log-probability rule differs only in its
    # normalisation, which covers the same finite ids here)
    assert torch.equal(torch.isinf(sub[0, 0]), torch.isinf(full[0, 0, vocab]))
    assert torch.isinf(sub[0, 0, (vocab == 14) | (vocab == 21) | (vocab == 50363)]).all()
    assert torch.isinf(sub[0, 0, (vocab >= BEGIN) & (vocab < BEGIN + 11)]).all()  # timestamps never decrease


def test_the_state_moved_on_one_token_at_a_time_is_the_prefixes():
    """``TimestampRules.advance`` (the device draft loop's update, token by token) gives what ``state`` of the
    prefix with the token appended gives, for every row of a batch at once, from the empty prefix on."""
    rng = random.Random(3)
    ts = TimestampRules.from_generation_config(GEN, len(PROMPT))
    gens = [g for g in _prefixes(rng, 40) if g]
    state = torch.tensor([list(s) for s in zip(*[ts.state(PROMPT) for _ in gens])])
    for j in range(max(map(len, gens))):
        tokens = torch.tensor([g[j] if j < len(g) else 1 for g in gens])
        ts.advance(state, tokens)
        want = [ts.state(PROMPT + (g[: j + 1] if j < len(g) else g + [1] * (j + 1 - len(g)))) for g in gens]
        assert state.T.tolist() == [list(w) for w in want], j
    # its host twin over a row's drafts (the choice graph's states, core._verify)
    for g in gens:
        for cut in range(len(g) + 1):
            assert ts.states_along(PROMPT + g[:cut], g[cut:], len(g) - cut + 1) == [
                ts.state(PROMPT + g[: cut + j]) for j in range(len(g) - cut + 1)]
