"""The adaptive lookahead policy on its own: what it decides from measured costs."""

from pipelines.engine.policies import Adaptive, CostMemory


def _memory(accepted: float, rejected: float, verify2: float = 0.018) -> CostMemory:
    memory = CostMemory()
    costs = memory.for_rows(1)
    costs.draft_step_s, costs.verify_s = 0.003, {1: 0.015, 2: verify2, 3: 0.019}
    costs.accepted, costs.rejected = accepted, rejected
    return memory


def _policy(memory: CostMemory) -> Adaptive:
    policy = Adaptive(1, 8, memory)
    policy.costs = memory.for_rows(1)
    return policy


def _serve(memory: CostMemory, requests: int, rounds: int, accept: bool = True) -> list[int]:
    """Lookaheads chosen over ``requests`` short requests of ``rounds`` rounds each (one row), every draft
    accepted (or, ``accept`` False, every one rejected), a draft step costing a fifth of a plain step."""
    chosen = []
    for _ in range(requests):
        policy = Adaptive(1, 8, memory)
        for _ in range(rounds):
            k = policy.next_k(1)[0]
            chosen.append(k)
            policy.observe([k], [k if accept else 0], 0.003 * k, 0.015 + 0.002 * k, k + 1)
    return chosen


def test_adaptive_drafts_when_it_pays_and_not_when_it_does_not():
    assert _policy(_memory(9.0, 1.0)).best_k()[0] >= 2  # acceptance 0.9: draft several
    k, gain = _policy(_memory(1.0, 9.0)).best_k()  # acceptance 0.1: plain is faster
    assert k == 0 or gain < 1.0


def test_adaptive_probes_again_across_short_requests():
    """After an unlucky start (3 of 7 drafts accepted, one slow verify pass of 2 tokens measured), a folder
    of short clips (requests of 6 rounds) must still probe now and then, learn that drafts are accepted
    and verify passes cheap, and go back to drafting."""
    memory = _memory(3.0, 4.0, verify2=0.030)
    assert _policy(memory).best_k()[0] == 0  # plain looks faster
    chosen = _serve(memory, requests=30, rounds=6)
    first_probe = next(i for i, k in enumerate(chosen) if k > 0)
    assert first_probe <= 20
    assert sum(k > 0 for k in chosen[-60:]) >= 40  # drafting most rounds by the end


def test_parse_policy_and_random_schedule():
    """``--lookahead`` values: names, a lookahead or a seed, and one sentence for a bad value; the random
    schedule is reproducible from its seed and ranges over 0 (a plain step) to max_lookahead."""
    import pytest

    from pipelines.engine import PolicyOptions, parse_policy
    from pipelines.engine.policies import make_policy

    assert parse_policy("adaptive") == PolicyOptions("adaptive")
    assert parse_policy("constant:3") == PolicyOptions("constant", lookahead=3)
    assert parse_policy("random:7") == PolicyOptions("random", seed=7)
    for bad in ("fast", "constant:0", "constant:x", "heuristic:99"):
        with pytest.raises(ValueError, match="lookahead"):
            parse_policy(bad)
    a, b = make_policy(parse_policy("random:5")), make_policy(parse_policy("random:5"))
    ks = [a.next_k(3) for _ in range(200)]
    assert ks == [b.next_k(3) for _ in range(200)]
    assert {k for row in ks for k in row} == set(range(0, 9))


def test_a_round_that_catches_the_assistant_up_is_not_timed():
    """The assistant is fed lazily: a round that drafts after one that did not first feeds it every token since
    (a draft step there costs 60x one while drafting every round). The policy times the next round, drafting
    as many tokens again, and keeps drafting where that pays; timing the catch-up switched a cheap assistant
    off for good (beam search's probes on speech-real)."""
    memory = CostMemory()
    policy = Adaptive(1, 8, memory)
    chosen, idle = [], True
    for _ in range(40):
        k = policy.next_k(1)[0]
        chosen.append(k)
        step_s = 0.180 if idle else 0.003  # per draft step: catching up, or drafting every round
        policy.observe([k], [k], step_s * k, 0.015, k + 1)  # every draft accepted; a pass costs the same at any width
        idle = k == 0
    costs = memory.for_rows(1)
    assert abs(costs.draft_step_s - 0.003) < 1e-9  # only rounds after a drafting one were timed
    assert costs.stopped_at is None and sum(k > 0 for k in chosen) >= 35
