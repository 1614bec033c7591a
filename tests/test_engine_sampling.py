"""Speculative sampling keeps the main model's distribution exactly: a chi-square test of the joint
distribution of the first two sampled tokens against the one computed from the main model's logits,
and the same test failing when the acceptance rule is deliberately broken."""

import pytest
import torch
from toy_models import make_causal

from pipelines.engine import (
    AssistedDecoder,
    DecodeOptions,
    PolicyOptions,
    Sampling,
    as_decoder,
    core,
    model_drafter,
    verify,
)
from pipelines.engine.rules import Rules, to_probs

SAMPLING = Sampling(temperature=1.3, top_k=6, top_p=0.95)
PROMPT = [5, 17, 9, 30]
N = 3000


def _exact_joint(main) -> dict[tuple[int, int], float]:
    """p(x1, x2) = p(x1) p(x2 | x1) from the main model, with the same warpers."""
    with torch.no_grad():
        p1 = to_probs(main(torch.tensor([PROMPT])).logits[0, -1].float(), SAMPLING)
        joint = {}
        for x1 in torch.nonzero(p1).flatten().tolist():
            p2 = to_probs(main(torch.tensor([PROMPT + [x1]])).logits[0, -1].float(), SAMPLING)
            for x2 in torch.nonzero(p2).flatten().tolist():
                joint[(x1, x2)] = float(p1[x1] * p2[x2])
    return joint


def _chi_square_p(counts: dict, expected: dict, n: int) -> float:
    big = [c for c, p in expected.items() if p * n >= 5]
    stat, df = 0.0, len(big) - 1
    for cell in big:
        e = expected[cell] * n
        stat += (counts.get(cell, 0) - e) ** 2 / e
    rest_e = n - sum(expected[c] * n for c in big)
    rest_o = n - sum(counts.get(c, 0) for c in big)
    if rest_e >= 5:
        stat += (rest_o - rest_e) ** 2 / rest_e
        df += 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64)))


def _sample(main, drafter_model, seed=1234):
    rules = Rules(eos=())
    drafter = model_drafter(as_decoder(drafter_model), share_encoder=False, pad_id=1)
    engine = AssistedDecoder(as_decoder(main), drafter, pad_id=1)
    result = engine.generate([PROMPT] * N, rules, DecodeOptions(max_new_tokens=2, do_sample=True, sampling=SAMPLING,
                                                                seed=seed, policy=PolicyOptions("constant", 2)))
    counts: dict[tuple[int, int], int] = {}
    for t in result.tokens:
        counts[(t[0], t[1])] = counts.get((t[0], t[1]), 0) + 1
    return counts, result.stats


@pytest.fixture(scope="module")
def models():
    return make_causal("llama", layers=2, seed=0), make_causal("llama", layers=1, seed=5)


def test_speculative_sampling_matches_the_main_distribution(models):
    main, small = models
    expected = _exact_joint(main)
    counts, stats = _sample(main, small)
    assert 0.05 < stats.acceptance < 0.95  # drafts are sometimes rejected: the rule is exercised
    assert _chi_square_p(counts, expected, N) > 1e-3


def test_the_test_catches_a_broken_acceptance_rule(models, monkeypatch):
    main, small = models

    def always_accept(drafts, qs, logits, sampling, generator):
        p = to_probs(logits, sampling)
        return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator))

    monkeypatch.setattr(verify, "accept_sampling", always_accept)
    counts, _ = _sample(main, small)
    assert _chi_square_p(counts, _exact_joint(main), N) < 1e-6


def test_a_seed_gives_the_same_sample_whatever_the_adaptive_policy_measured(models, monkeypatch):
    """How many random draws a round takes follows its lookahead, and the adaptive policy picks lookaheads
    from wall-clock costs: a seeded sampled request takes the heuristic policy instead, so the same seed gives
    the same tokens however fast the machine was. Checked by making the clock run differently between two
    requests (the adaptive policy would then pick other lookaheads)."""
    import itertools
    import time as real_time

    main, small = models
    engine = AssistedDecoder(as_decoder(main), model_drafter(as_decoder(small), share_encoder=False, pad_id=1), pad_id=1)
    options = DecodeOptions(max_new_tokens=12, do_sample=True, sampling=SAMPLING, seed=7)
    assert core.seeded_policy(options).name == "heuristic"
    assert core.seeded_policy(DecodeOptions(do_sample=True)).name == "adaptive"  # no seed: nothing to keep
    assert core.seeded_policy(DecodeOptions(seed=7)).name == "adaptive"  # greedy: exact whatever the lookahead
    runs = []
    for step in (1e-4, 5e-2):  # a fast clock, then a slow one: other measured costs
        ticks = itertools.count()
        monkeypatch.setattr(core.time, "perf_counter", lambda s=step, t=ticks: next(t) * s)
        runs.append(engine.generate([PROMPT] * 3, Rules(eos=()), options).tokens)
    monkeypatch.setattr(core.time, "perf_counter", real_time.perf_counter)
    assert runs[0] == runs[1]
