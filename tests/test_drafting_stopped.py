"""The batch summary says when the adaptive lookahead policy stopped drafting (issue 52: "if it does not pay
on a CPU at Whisper base's shapes, the adaptive policy stops drafting and the summary says so")."""

from __future__ import annotations

from types import SimpleNamespace

from test_policies import _serve

from pipelines.engine.policies import CostMemory


def _lines(greedy: CostMemory, beam: CostMemory | None = None) -> list[str]:
    from pipelines.cli.transcribe import drafting_lines

    return drafting_lines([SimpleNamespace(costs=greedy, beam_costs=beam or CostMemory())])


def test_drafts_that_never_pay_stop_and_the_summary_names_the_round():
    memory = CostMemory()
    chosen = _serve(memory, 1, 40, accept=False)
    costs = memory.for_rows(1)
    stop = costs.stopped_at
    assert stop is not None and chosen[stop - 1] == 0 and any(chosen[: stop - 1])  # drafted, then stopped
    assert costs.drafting_off and costs.rounds == 40 and costs.plain_rounds == chosen.count(0)
    assert sum(k > 0 for k in chosen[stop:]) <= 2  # at most a probe now and then after the stop
    [line] = _lines(memory)
    assert f"drafting stopped after round {stop} (drafts did not pay at these shapes)" in line
    assert f"{chosen.count(0)} of 40 rounds plain, probing now and then" in line


def test_drafts_that_pay_never_stop_and_the_summary_says_nothing():
    memory = CostMemory()
    chosen = _serve(memory, 1, 40)
    costs = memory.for_rows(1)
    assert costs.stopped_at is None and not costs.drafting_off and sum(k > 0 for k in chosen) >= 35
    assert _lines(memory) == []


def test_a_probe_that_pays_again_is_said_too():
    """An unlucky start (test_policies' case: 3 of 7 drafts accepted, a slow verify pass of 2 tokens) stops
    drafting; later probes find every draft accepted and drafting resumes: the line says both."""
    memory = CostMemory()
    costs = memory.for_rows(1)
    costs.draft_step_s, costs.verify_s = 0.003, {1: 0.015, 2: 0.030, 3: 0.019}
    costs.accepted, costs.rejected = 3.0, 4.0
    chosen = _serve(memory, requests=30, rounds=6)
    assert costs.stopped_at is not None and not costs.drafting_off and sum(k > 0 for k in chosen[-30:]) >= 20
    [line] = _lines(memory)
    assert f"drafting stopped after round {costs.stopped_at}" in line and "a later probe paid" in line


def test_beam_search_and_batch_buckets_are_named():
    beam = CostMemory()
    _serve(beam, 1, 40, accept=False)
    for rows in (5, 10):
        beam.for_rows(rows).stopped_at, beam.for_rows(rows).rounds = 3, 9
        beam.for_rows(rows).plain_left = 5
    lines = _lines(CostMemory(), beam)
    assert len(lines) == 3 and all("beam search: batches of up to" in line for line in lines)
    assert "batches of up to 16 rows: drafting stopped after round 3" in lines[-1]


def _clip(speech_real) -> str:
    return next(i for i in speech_real if i["id"] == "goforward")["audio_path"]


def test_beam_search_with_a_poor_assistant_stops_drafting_and_says_so(speech_real, capsys):
    """The test pair's assistant (Whisper base's first two decoder layers) rarely drafts a step all five
    beams take: the adaptive policy stops drafting within a few rounds and the summary says after which
    (the run's engine reaches the summary; the cases where drafting goes on are the tests above)."""
    from pipelines.cli import main

    assert main(["transcribe", _clip(speech_real), "--pair", "whisper-base+truncated-2l", "--beam-size", "5"]) == 0
    printed = capsys.readouterr().out
    assert "go forward" in printed.lower()
    assert "assistant:       beam search: drafting stopped after round " in printed, printed
    assert "(drafts did not pay at these shapes)" in printed
