"""tandem regress catches a deliberately worse config (broken assistant, slower policy, perturbed main model)
with a clear line and a non-zero exit; an unchanged re-run passes; history and report accumulate; quality
figures are the same in two runs of the same config."""

from __future__ import annotations

import sqlite3

import pytest
import yaml

from pipelines.cli import main
from pipelines.quality.regress import RegressConfigError, load_config

PAIR = {"task": "asr", "main": {"embedded": "whisper-base"}, "assistant": {"embedded": "whisper-base-decoder"},
        "share_encoder": True}


def _write(path, obj):
    """``obj`` as YAML, or a text as it is (lone surrogates become the bytes they escape: not UTF-8)."""
    if isinstance(obj, str):
        path.write_bytes(obj.encode("utf-8", "surrogateescape"))
    else:
        path.write_text(yaml.safe_dump(obj))
    return path


@pytest.fixture
def setup(tmp_path, speech_real):
    models = _write(tmp_path / "models.yaml", {"pairs": {"nightly": PAIR}, "defaults": {"asr": "nightly"}})
    config = {"models": "models.yaml", "out": "report", "repeats": 1,
              "thresholds": {"speedup_drop": 0.6},  # the speedup of 3 short clips is noisy on a busy 2-core machine
              # a constant lookahead drafts every round (adaptive would fall back to plain for this assistant,
              # which costs as much as the main decoder), so tokens per call show the assistant's quality
              # greedy only: the perturbed main model below invents text, and the fallback through five
              # temperatures would take minutes without changing the verdict
              "runs": [{"task": "asr", "pair": "nightly", "set": "speech-real", "limit": 3, "temperature": [0],
                        "policy": {"name": "constant", "lookahead": 4}}]}
    return tmp_path, models, config


def _run(tmp_path, config, capsys) -> tuple[int, str]:
    path = _write(tmp_path / "nightly.yaml", config)
    code = main(["regress", "--config", str(path)])
    return code, capsys.readouterr().err


def _perturbed_main(folder):
    import torch
    from transformers import WhisperForConditionalGeneration

    from pipelines.models.embedded import embedded_path

    model = WhisperForConditionalGeneration.from_pretrained(embedded_path("whisper-base"))
    torch.manual_seed(0)
    with torch.no_grad():
        for layer in model.model.decoder.layers:
            for lin in (layer.fc1, layer.fc2):
                lin.weight.add_(torch.randn_like(lin.weight) * lin.weight.std() * 0.5)
    model.save_pretrained(folder)
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    AutoTokenizer.from_pretrained(embedded_path("whisper-base")).save_pretrained(folder)
    WhisperFeatureExtractor.from_pretrained(embedded_path("whisper-base")).save_pretrained(folder)


def test_a_worse_assistant_fails_against_its_baseline(setup, capsys):
    """CI's share of the end-to-end check (two runs); the whole sequence below runs with -m slow."""
    tmp_path, models, config = setup
    config = dict(config, runs=[dict(config["runs"][0], limit=2)])
    assert _run(tmp_path, config, capsys)[0] == 0  # first run: the baseline
    broken = dict(PAIR, assistant={"embedded": "whisper-base-decoder-2l"})  # untrained 2 layers: drafts mostly wrong
    _write(models, {"pairs": {"nightly": broken}, "defaults": {"asr": "nightly"}})
    code, err = _run(tmp_path, config, capsys)
    assert code == 1 and "REGRESSION: asr nightly/speech-real [limit 2, dtype pair, constant]: tokens per main call" in err
    assert (tmp_path / "report" / "report.md").read_text().count("FAIL") >= 1


@pytest.mark.slow
def test_regressions_are_caught_and_unchanged_runs_pass(setup, capsys):
    tmp_path, models, config = setup
    assert _run(tmp_path, config, capsys)[0] == 0  # first run: the baseline
    code, err = _run(tmp_path, config, capsys)
    assert code == 0 and "REGRESSION" not in err  # unchanged

    db = sqlite3.connect(tmp_path / "report" / "history.sqlite")
    q1, q2 = [row[0] for row in db.execute("SELECT quality FROM results ORDER BY run_id")]
    assert q1 == q2  # quality is deterministic across runs of the same config

    broken = dict(PAIR, assistant={"embedded": "whisper-base-decoder-2l"})  # untrained 2 layers: drafts mostly wrong
    _write(models, {"pairs": {"nightly": broken}, "defaults": {"asr": "nightly"}})
    code, err = _run(tmp_path, config, capsys)
    assert code == 1 and "REGRESSION: asr nightly/speech-real [limit 3, dtype pair, constant]: tokens per main call" in err

    _write(models, {"pairs": {"nightly": PAIR}, "defaults": {"asr": "nightly"}})
    slower = dict(config, runs=[dict(config["runs"][0], policy={"name": "constant", "lookahead": 1})])  # <= 2 per call
    code, err = _run(tmp_path, slower, capsys)
    assert code == 1 and "tokens per main call" in err

    _perturbed_main(tmp_path / "perturbed")
    _write(models, {"pairs": {"nightly": dict(PAIR, main={"local": str(tmp_path / "perturbed")})}, "defaults": {"asr": "nightly"}})
    code, err = _run(tmp_path, config, capsys)
    assert code == 1 and "REGRESSION: asr nightly/speech-real [limit 3, dtype pair, constant]: wer" in err

    runs = db.execute("SELECT id, status, accepted, baseline FROM runs ORDER BY id").fetchall()
    assert [r[1] for r in runs] == ["pass", "pass", "fail", "fail", "fail"]
    assert [r[3] for r in runs] == [None, 1, 2, 2, 2]  # failed runs never become the baseline
    report = (tmp_path / "report" / "report.md").read_text()
    assert "FAIL" in report and "![" in report and (tmp_path / "report" / "plot-1.png").stat().st_size > 5000
    assert report.count("REGRESSION") == 0 and "wer" in report
    html = (tmp_path / "report" / "report.html").read_text()
    assert "data:image/png;base64," in html

    assert main(["regress", "--config", str(tmp_path / "nightly.yaml"), "--accept", "5"]) == 0
    assert db.execute("SELECT accepted FROM runs WHERE id = 5").fetchone()[0] == 1


def test_broken_configs_are_named(tmp_path):
    bad = [
        ({"runs": []}, "non-empty 'runs'"),
        ({"runs": [{"task": "asr", "pair": "p"}]}, "runs[0]: needs task, pair and set"),
        ({"runs": [{"task": "ocr", "pair": "p", "set": "s"}]}, "runs[0].task"),
        ({"runs": [{"task": "asr", "pair": "p", "set": "s", "policy": {"name": "fastest"}}]}, "runs[0].policy.name"),
        ({"thresholds": {"speedup": 1}, "runs": [{"task": "asr", "pair": "p", "set": "s"}]}, "thresholds.speedup"),
        ({"baseline": "first", "runs": [{"task": "asr", "pair": "p", "set": "s"}]}, "baseline"),
    ]
    for obj, message in bad:
        with pytest.raises(RegressConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            load_config(_write(tmp_path / "c.yaml", obj))


# --- nightly runs a team can trust: noise, like with like, configs, history ------------------------------


def _report(speedups=(1.5, 1.5, 1.5), per_call=(2.0, 2.0, 2.0), wer=0.05, policy="adaptive", cpu="cpu-a", threads=2):
    import statistics

    plain = [1.0 * s for s in speedups]
    assisted = [1.0] * len(speedups)
    spread = lambda runs: {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs), "runs_s": runs}  # noqa: E731
    return {"task": "asr", "pair": "p", "set": "speech-real", "identical_rate": 1.0, "policy": {"name": policy}, "acceptance": 0.6,
            "quality": {"assisted": {"wer": {"value": wer}}},
            "latency": {"plain": spread(plain), "assisted": spread(assisted), "speedup": statistics.median(plain)},
            "calls_per_token": 1.0 / per_call[-1], "tokens_per_call_runs": list(per_call),
            "environment": {"cpu": cpu, "threads": threads, "device": "cpu", "torch": "2.13.0", "transformers": "5.24.0",
                            "python": "3.11"}}


def _gate(now, base, same=True):
    from pipelines.quality.regress import DEFAULT_THRESHOLDS, compare

    return compare("k", now, base, same, DEFAULT_THRESHOLDS)


def test_unchanged_figures_within_their_noise_pass_and_planted_drops_fail():
    # the adaptive lookahead's tokens per call as measured back to back on unchanged code (issue 21): all pass
    nights = [(2.06, 1.97, 1.77), (1.77, 1.9, 2.0), (2.12, 1.85, 1.8), (1.8, 1.77, 2.05)]
    base = _report(speedups=(1.20, 1.12, 1.25), per_call=nights[0])
    for per_call, speed in zip(nights[1:], [(1.10, 1.18, 1.2), (1.25, 1.1, 1.15), (1.08, 1.2, 1.16)]):
        found, _ = _gate(_report(speedups=speed, per_call=per_call), base)
        assert found == [], found
    # the second of two back-to-back default runs (2026-12-01): every repeat 2.49, then every repeat 2.18
    found, notes = _gate(_report(per_call=(2.18, 2.18, 2.18)), _report(per_call=(2.49, 2.49, 2.49)))
    assert found == [] and any("tokens per main call 2.18 vs baseline 2.49 not gated" in n for n in notes)
    # a planted slowdown still fails, named
    found, _ = _gate(_report(speedups=(0.9, 0.92, 0.91), per_call=nights[1]), base)
    assert [f.what for f in found] == ["speedup"]
    # a fixed schedule gives the same tokens per call on every run: its floor alone gates, so a planted
    # acceptance drop fails there
    fixed = _report(per_call=(2.5, 2.5, 2.5), policy="constant")
    assert _gate(_report(per_call=(2.4, 2.4, 2.4), policy="constant"), fixed)[0] == []
    assert [f.what for f in _gate(_report(per_call=(2.0, 2.0, 2.0), policy="constant"), fixed)[0]] == ["tokens_per_call"]
    # quality keeps its absolute threshold
    assert [f.what for f in _gate(_report(wer=0.08), _report(wer=0.05))[0]] == ["quality"]


def test_one_repeat_is_reported_not_gated():
    found, notes = _gate(_report(speedups=(1.0,), per_call=(2.0,)), _report(speedups=(1.5,), per_call=(2.0,)))
    assert found == [] and any("not gated" in n and "speedup" in n for n in notes)
    # a fixed schedule's tokens per call need no repeats to be gated
    found, _ = _gate(_report(speedups=(1.5,), per_call=(1.0,), policy="constant"), _report(speedups=(1.5,), per_call=(2.0,), policy="constant"))
    assert [f.what for f in found] == ["tokens_per_call"]


def test_a_fixed_schedule_is_its_own_evaluation(tmp_path):
    """The shipped nightly measures speech-real under the adaptive lookahead and under a constant one: two
    evaluations with two baselines, not one overwriting the other."""
    from pipelines.paths import PROJECT_ROOT

    config = load_config(PROJECT_ROOT / "data" / "nightly.yaml")
    keys = [spec.key for spec in config.runs]
    assert len(set(keys)) == len(keys)
    fixed = [spec for spec in config.runs if spec.schedule != "adaptive"]
    assert fixed and all(spec.key.endswith("|" + spec.schedule) for spec in fixed)
    assert config.thresholds["tokens_per_call_drop"] > 0


def test_other_machine_compares_quality_only_and_new_evaluations_say_so():
    found, notes = _gate(_report(speedups=(0.5, 0.5, 0.5), cpu="cpu-b", wer=0.2), _report(), same=False)
    assert [f.what for f in found] == ["quality"]
    assert any("speed not compared" in n and "cpu-a" in n and "cpu-b" in n for n in notes)
    found, notes = _gate(_report(), None)
    assert found == [] and notes[0].startswith("NEW:") and "no baseline" in notes[0]


def test_baseline_is_matched_per_evaluation_and_machine(tmp_path):
    from pipelines.quality.history import baselines_for, machine_of, open_history, store_run

    db = open_history(tmp_path / "h.sqlite")
    a, b = _report(cpu="cpu-a"), _report(cpu="cpu-b")
    store_run(db, "t1", "c", "x", [], [], {}, {"k1": a})
    store_run(db, "t2", "c", "x", [], [], {}, {"k1": b})
    found = baselines_for(db, ["k1", "k2"], {"k1": machine_of(a), "k2": machine_of(a)}, None)
    assert found["k1"][0] == 1 and found["k1"][2] is True  # the older run on the same machine wins over a newer other one
    assert "k2" not in found


def test_config_mistakes_exit_2_before_anything_runs(tmp_path, capsys, monkeypatch):
    from pipelines.quality import evaluation

    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: pytest.fail("an evaluation ran"))
    run = {"task": "asr", "pair": "whisper-base", "set": "speech-real"}
    cases = [
        ({"thresholds": {"quality_drop": {"wre": 0.01}}, "runs": [run]}, "thresholds.quality_drop.wre: unknown metric"),
        ({"runs": [dict(run, limit=-2)]}, "runs[0].limit: must be a whole number of 1 or more"),
        ({"runs": [dict(run, limit=0)]}, "runs[0].limit"),
        ({"runs": [run, dict(run, dtype="bf16")]}, "runs[1].dtype: 'bf16' is not one of"),
        ({"runs": [dict(run, pair="nllb-1.3b+distilled-600m")]}, "is a translate pair, not an asr pair"),
        ({"runs": [run, dict(run, pair="no-such-pair")]}, "runs[1].pair"),
        ({"runs": [run, dict(run, set="speech-nowhere")]}, "runs[1].set: unknown set"),
        ({"runs": [dict(run, set="translate-udhr")]}, "is not an asr set"),
        ({"thresholds": {"identical_min": 1.1}, "runs": [run]}, "thresholds.identical_min: must be a number from 0 to 1"),
        ({"thresholds": {"speedup_drop": True}, "runs": [run]}, "thresholds.speedup_drop"),
        ({"repeats": 0, "runs": [run]}, "repeats: must be a whole number"),
        ({"runs": [dict(run, policy={"name": "constant", "lookahead": "3"})]}, "runs[0].policy.lookahead"),
        ({"runs": [run, dict(run)]}, "two runs measure the same evaluation"),
        ({"runs": [run], "outt": "x"}, "outt: unknown key"),
        ({"runs": [run], "models": 5}, "models: must be a path (text)"),
        ({"runs": [run], "out": 5}, "out: must be a path (text)"),
        ({"runs": [run], "out": None}, "out: must be a path (text)"),
        ("runs:\n  - {task: asr, pair: whisper-base, set: speech-real}\nrepeats: 2\nrepeats: 3\n",
         "key 'repeats' is given twice (YAML at line 4)"),
        ("runs: [] # caf\udce9", "is not UTF-8 text"),
    ]
    for obj, message in cases:
        path = _write(tmp_path / "nightly.yaml", obj)
        assert main(["regress", "--config", str(path)]) == 2, message
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (message, err)


def test_history_survives_a_reader_and_a_killed_run(tmp_path):
    """A reader holding the history open does not make the run's commit fail (WAL); a run killed after its
    commit leaves a stale report that the next invocation re-renders from the history."""
    from pipelines.quality.history import heal_report, open_history, render_report, store_run

    path = tmp_path / "history.sqlite"
    db = open_history(path)
    first = store_run(db, "t1", "c", "x", [], [], {}, {"k": _report()})
    render_report(db, tmp_path, first)
    reader = sqlite3.connect(path)
    reader.execute("BEGIN")
    assert reader.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1  # a read transaction stays open
    second = store_run(db, "t2", "c", "x", [], [], {"k": first}, {"k": _report(speedups=(1.4, 1.5, 1.6))})
    reader.rollback()
    reader.close()
    # killed before the report: report.md still shows the first run
    assert (tmp_path / "report.md").read_text().startswith(f"# Tandem regression run {first}\n")
    heal_report(open_history(path), tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert report.startswith(f"# Tandem regression run {second}\n") and "Runs compared" in report and "cpu-a" in report


def test_accepting_a_run_says_whether_it_became_the_baseline(tmp_path):
    """--accept on the latest run makes it the baseline; on an older one, later accepted runs stay the baseline and
    the message says so and how to compare with it (it claimed 'it is now the baseline' either way)."""
    from types import SimpleNamespace

    from pipelines.quality.history import Finding, open_history, store_run
    from pipelines.quality.regress import accept

    db = open_history(tmp_path / "history.sqlite")
    failed = [Finding("k", "speedup", "slower")]
    for n, findings in enumerate(([], failed, [], failed), 1):  # runs 1 pass, 2 fail, 3 pass, 4 fail
        store_run(db, f"t{n}", "c", "x", findings, [], {}, {"k": _report()})
    db.close()
    config = SimpleNamespace(out=tmp_path)
    assert accept(config, 2) == ("run 2 accepted, but later accepted runs (3) stay the baseline of what they "
                                 "measured; compare with run 2 instead: tandem regress --pin 2")
    assert accept(config, 4) == "run 4 accepted: it is now the baseline"
