"""tandem eval: one schema for every task; quality deterministic across runs; identical rate reported."""

import json

from pipelines.cli import main
from pipelines.quality.evaluation import SCHEMA, evaluate


def test_asr_eval_report(tmp_path, capsys, speech_real):
    out = tmp_path / "eval.json"
    code = main(["eval", "--task", "asr", "--pair", "whisper-base+truncated-2l", "--set", "speech-real",
                 "--limit", "3", "--repeats", "2", "--lookahead", "constant:2", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["schema"] == SCHEMA and report["items"] == 3
    assert report["identical_rate"] == 1.0
    assert report["quality"]["plain"]["wer"]["value"] == report["quality"]["assisted"]["wer"]["value"]
    assert report["quality"]["plain"]["wer"]["signature"].startswith("metric:wer|norm:whisper-en")
    lat = report["latency"]
    assert len(lat["plain"]["runs_s"]) == 2 and lat["plain"]["min_s"] <= lat["plain"]["median_s"] <= lat["plain"]["max_s"]
    assert report["acceptance"] is not None and report["calls_per_token"] > 0  # a constant lookahead always drafts
    assert report["policy"] == {"name": "constant", "lookahead": 2, "max_lookahead": 8}
    assert report["environment"]["git_commit"] and report["environment"]["threads"] >= 1
    assert "speedup" in capsys.readouterr().out


def test_quality_is_deterministic(speech_real):
    a = evaluate("asr", "whisper-base", "speech-real", limit=2, repeats=1)
    b = evaluate("asr", "whisper-base", "speech-real", limit=2, repeats=1)
    assert a["quality"] == b["quality"] and a["identical_rate"] == b["identical_rate"] == 1.0
