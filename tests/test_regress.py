"""tandem regress catches a deliberately worse config (broken assistant, slower policy, perturbed main model)
with a clear line and a non-zero exit; an unchanged re-run passes; history and report accumulate; quality
figures are the same in two runs of the same config."""

from __future__ import annotations

import sqlite3

import pytest
import yaml

from pipelines.cli import main
from pipelines.regress import RegressConfigError, load_config

PAIR = {"task": "asr", "main": {"embedded": "whisper-base"}, "assistant": {"embedded": "whisper-base-decoder"},
        "share_encoder": True}


def _write(path, obj):
    path.write_text(yaml.safe_dump(obj))
    return path


@pytest.fixture
def setup(tmp_path, speech_real):
    models = _write(tmp_path / "models.yaml", {"pairs": {"nightly": PAIR}, "defaults": {"asr": "nightly"}})
    config = {"models": "models.yaml", "out": "report", "repeats": 1,
              "thresholds": {"speedup_drop": 0.6},  # the speedup of 3 short clips is noisy on a busy 2-core machine
              # a constant lookahead drafts every round (adaptive would fall back to plain for this assistant,
              # which costs as much as the main decoder), so tokens per call show the assistant's quality
              "runs": [{"task": "asr", "pair": "nightly", "set": "speech-real", "limit": 3,
                        "policy": {"name": "constant", "lookahead": 4}}]}
    return tmp_path, models, config


def _run(tmp_path, config, capsys) -> tuple[int, str]:
    path = _write(tmp_path / "nightly.yaml", config)
    code = main(["regress", "--config", str(path)])
    return code, capsys.readouterr().err


def _perturbed_main(folder):
    import torch
    from transformers import WhisperForConditionalGeneration

    from pipelines.embedded import embedded_path

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
    assert code == 1 and "REGRESSION: asr nightly/speech-real: tokens per main call" in err

    _write(models, {"pairs": {"nightly": PAIR}, "defaults": {"asr": "nightly"}})
    slower = dict(config, runs=[dict(config["runs"][0], policy={"name": "constant", "lookahead": 1})])  # <= 2 per call
    code, err = _run(tmp_path, slower, capsys)
    assert code == 1 and "tokens per main call" in err

    _perturbed_main(tmp_path / "perturbed")
    _write(models, {"pairs": {"nightly": dict(PAIR, main={"local": str(tmp_path / "perturbed")})}, "defaults": {"asr": "nightly"}})
    code, err = _run(tmp_path, config, capsys)
    assert code == 1 and "REGRESSION: asr nightly/speech-real: wer" in err

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
