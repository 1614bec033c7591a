"""Outputs are bound to what made them: a run with another pair or other decoding options into a folder that
holds transcripts of the same files is refused in one line naming --force, before any model loads, and leaves
them as they were; --force redoes them; the same settings resume."""

import json

import pytest

from pipelines.cli import main


def test_another_pair_does_not_overwrite_in_silence(speech_real, tmp_path, monkeypatch, capsys):
    clip = next(i for i in speech_real if i["id"] == "goforward")["audio_path"]
    out = tmp_path / "out"
    assert main(["transcribe", clip, "-o", str(out), "-m", "whisper-base+distilled"]) == 0
    record = out / "goforward.tandem.json"
    first = record.read_text()
    assert json.loads(first)["pair"] == "whisper-base+distilled"
    capsys.readouterr()

    from pipelines.models import pairs

    real_load = pairs.load_model
    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    for other in (["-m", "whisper-base"], ["--no-assistant"], ["--temperature", "0"]):
        assert main(["transcribe", clip, "-o", str(out), *other]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--force" in err and "would overwrite it" in err, err
        assert record.read_text() == first  # left as it was
    assert "made with pair whisper-base+distilled" in main_err(clip, out, capsys)

    monkeypatch.setattr(pairs, "load_model", real_load)
    assert main(["transcribe", clip, "-o", str(out), "-m", "whisper-base+distilled"]) == 0  # same settings
    assert "resuming: 1 of 1 files already done" in capsys.readouterr().out
    assert main(["transcribe", clip, "-o", str(out), "-m", "whisper-base", "--force"]) == 0
    assert json.loads(record.read_text())["pair"] == "whisper-base"
    assert "10 meters" in (out / "goforward.txt").read_text()


def main_err(clip, out, capsys) -> str:
    assert main(["transcribe", clip, "-o", str(out), "-m", "whisper-base"]) == 2
    return capsys.readouterr().err
