"""Outputs are bound to what made them: a run with another pair or other decoding options into a folder that
holds transcripts of the same files is refused in one line naming --force, before any model loads, and leaves
them as they were; --force redoes them; the same settings resume."""

import json

import numpy as np
import pytest
import soundfile as sf

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


def test_another_format_is_written_from_the_record_without_decoding(speech_real, tmp_path, monkeypatch, capsys):
    """Issue 57: -f json, then -f srt,txt into the same folder writes srt and txt from the result the record
    keeps, with no model loaded, equal to a fresh run's; the json stays as it was. The clip is over one window,
    so it was decoded with timestamps whatever the formats. A record from before records kept their result is
    decoded again, saying so, also when the formats asked for turn timestamps on (the same pair: not refused)."""
    clip = long_clip(speech_real, tmp_path)
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert main(["transcribe", str(clip), "-o", str(out), "-m", "whisper-base", "-f", "json"]) == 0
    assert main(["transcribe", str(clip), "-o", str(fresh), "-m", "whisper-base", "-f", "all"]) == 0
    capsys.readouterr()
    first = (out / "long.json").read_text()

    with monkeypatch.context() as patch:
        no_weights(patch)
        assert main(["transcribe", str(clip), "-o", str(out), "-m", "whisper-base", "-f", "srt,txt"]) == 0
        printed = capsys.readouterr().out
        assert "1 file: writing srt, txt from stored results (no decoding)" in printed, printed
        assert "  from records:    1 file: wrote srt, txt from stored results (no decoding)" in printed, printed
        assert "resuming" not in printed and "decoded again" not in printed, printed
        for fmt in ("srt", "txt"):
            assert (out / f"long.{fmt}").read_text() == (fresh / f"long.{fmt}").read_text(), fmt
        assert (out / "long.json").read_text() == first
        assert same_result(out / "long.json", fresh / "long.json")
        record = json.loads((out / "long.tandem.json").read_text())
        assert record["outputs"] == ["long.json", "long.srt", "long.txt"] and record["timed"]
        assert main(["transcribe", str(clip), "-o", str(out), "-m", "whisper-base", "-f", "txt,srt,json"]) == 0
        assert "resuming: 1 of 1 files already done" in capsys.readouterr().out

    record = out / "long.tandem.json"  # as an earlier version wrote it: no result kept
    meta = json.loads(record.read_text())
    record.write_text(json.dumps({k: v for k, v in meta.items() if k not in ("result", "timed")}))
    for fmt in ("srt", "txt"):
        (out / f"long.{fmt}").unlink()
    assert main(["transcribe", str(clip), "-o", str(out), "-m", "whisper-base", "-f", "srt,txt"]) == 0
    printed = capsys.readouterr().out
    assert ("decoded again:   1 file (e.g. long.wav): its record keeps no result to write srt, txt from (written "
            "by an earlier version)") in printed, printed
    for fmt in ("srt", "txt"):
        assert (out / f"long.{fmt}").read_text() == (fresh / f"long.{fmt}").read_text(), fmt
    assert same_result(out / "long.json", fresh / "long.json")  # the format its record named, rewritten too
    assert "result" in json.loads(record.read_text())


def test_formats_the_stored_result_cannot_give_are_decoded_again(speech_real, tmp_path, monkeypatch, capsys):
    """A clip of one window decoded for -f txt has no timestamps: -f json is written from its record, but -f srt
    decodes it again, says why, and rewrites the txt and json from the new decoding (equal to a fresh run's)."""
    clip = next(i for i in speech_real if i["id"] == "goforward")["audio_path"]
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert main(["transcribe", clip, "-o", str(fresh), "-m", "whisper-base", "-f", "all"]) == 0
    assert main(["transcribe", clip, "-o", str(out), "-m", "whisper-base", "-f", "txt"]) == 0
    untimed = (out / "goforward.txt").read_text()
    capsys.readouterr()
    with monkeypatch.context() as patch:
        no_weights(patch)
        assert main(["transcribe", clip, "-o", str(out), "-m", "whisper-base", "-f", "json"]) == 0
    assert "wrote json from stored results" in capsys.readouterr().out
    assert json.loads((out / "goforward.json").read_text())["text"] == untimed.strip()

    assert main(["transcribe", clip, "-o", str(out), "-m", "whisper-base", "-f", "srt"]) == 0
    printed = capsys.readouterr().out
    why = "1 file (e.g. goforward.wav): srt needs timestamps, and the result its record keeps was decoded without them"
    assert f"decoding again: {why}" in printed and f"  decoded again:   {why}" in printed, printed
    for fmt in ("txt", "srt"):
        assert (out / f"goforward.{fmt}").read_text() == (fresh / f"goforward.{fmt}").read_text(), fmt
    assert same_result(out / "goforward.json", fresh / "goforward.json")
    outputs = json.loads((out / "goforward.tandem.json").read_text())["outputs"]
    assert sorted(outputs) == ["goforward.json", "goforward.srt", "goforward.txt"]



def long_clip(speech_real, tmp_path):
    """A clip just over one window: a spoken sentence, then silence to 31 s (quick to decode)."""
    speech = sf.read(next(i for i in speech_real if i["id"] == "goforward")["audio_path"], dtype="float32")[0]
    path = tmp_path / "long.wav"
    sf.write(path, np.concatenate([speech, np.zeros(31 * 16000 - len(speech), dtype=np.float32)]), 16000)
    return path


def no_weights(monkeypatch):
    from pipelines.models import pairs

    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))


def same_result(mine, theirs) -> bool:
    """Two json outputs say the same but for wall times (another run's differ)."""
    timing = ("seconds", "decode_seconds")
    a, b = (json.loads(p.read_text()) for p in (mine, theirs))
    return {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}


def test_a_record_gives_back_the_transcript_it_keeps():
    """Every field comes back equal: floats, words, per-segment languages, dropped windows, decode warnings and
    the accepted-drafts histogram (int keys); the json format writes the same data."""
    from dataclasses import replace

    from pipelines.asr import TranscribeOptions
    from pipelines.asr.options import DroppedWindow, Segment, Transcript, Word
    from pipelines.asr.outputs import format_json
    from pipelines.asr.records import is_timed, result_data, transcript_from_data

    words = (Word(0.1, 0.52, " Go", 0.91), Word(0.52, 1.0, " forward.", 0.1 + 0.2))
    t = Transcript("a\udcff.wav", "Go forward. x", 31.5, 2.25, segments=(
        Segment(0.1, 1.0, "Go forward.", -0.25, 0.01, 0.7, 0.2, False, words, "en", 0.987654321),
        Segment(30.0, 31.5, "x", no_speech=True)), language=None, tokens=7, main_calls=2.5, drafted=1 / 3,
        accepted=2 / 3, decode_seconds=1e-7, plain_seconds=0.5, identical=True, retried=1, skipped=2, dropped=1,
        accepted_hist={0: 3, 4: 1}, cut=1, finish_reason="length", start_offset=4.978, audio_track=1,
        audio_tracks=2, damaged=True, truncated=True, seconds_recovered=31.0,
        decode_warnings=("a damaged block at 4.79 s was skipped",),
        dropped_windows=(DroppedWindow(30.0, 60.0, "repetitive: compression ratio 3.10 > 2.4 at temperature 1.0"),))
    back = transcript_from_data(json.loads(json.dumps(result_data(t))))
    assert back == replace(t, path="a\\xff.wav")  # the path as printed (a name's bytes that are not UTF-8)
    assert format_json(back) == format_json(t)
    bare = Transcript("b.wav", "", 2.0, 0.1)
    assert transcript_from_data(json.loads(json.dumps(result_data(bare)))) == bare
    assert is_timed(t, TranscribeOptions())  # over one window: always decoded with timestamps
    assert not is_timed(replace(t, duration=30.0), TranscribeOptions())
    assert is_timed(replace(t, duration=30.0), TranscribeOptions(timestamps=True))
    assert is_timed(replace(t, duration=30.0), TranscribeOptions(word_timestamps=True))


def test_a_track_asked_for_is_another_record_than_the_automatic_choice():
    # the automatic choice (None) reads the first track with speech, which may be track 1: a record made by it
    # must not pass for one of --audio-track 0 (nor the other way round)
    from pipelines.asr.options import TranscribeOptions
    from pipelines.asr.outputs import run_signature

    auto, first, second = (run_signature("p", TranscribeOptions(audio_track=t)) for t in (None, 0, 1))
    assert len({auto, first, second}) == 3


@pytest.mark.parametrize("change", [
    {"initial_prompt": "Glossary: metres."}, {"hotwords": "metres"}, {"prefix": "Go"},
    {"condition_on_previous_text": True}, {"beam_size": 5}, {"beam_size": 5, "patience": 2.0},
    {"beam_size": 5, "length_penalty": 0.5}, {"best_of": 5},
])
def test_prompts_and_search_make_another_record(change):
    # each changes the transcript, so a record made without it must not pass for one made with it (and a folder
    # written before these options existed keeps its signature: the defaults add nothing)
    from pipelines.asr.options import TranscribeOptions
    from pipelines.asr.outputs import run_signature

    assert run_signature("p", TranscribeOptions(**change)) != run_signature("p", TranscribeOptions())


def test_records_from_the_old_features_are_not_resumed():
    # 52451d96728ad670: the default options' signature before whisper's log-mel (asr/features.py) replaced
    # transformers' per-window features; a folder written then holds transcripts of other encoder input
    from pipelines.asr.options import TranscribeOptions
    from pipelines.asr.outputs import run_signature

    assert run_signature("p", TranscribeOptions()) != "52451d96728ad670"


def test_the_history_reset_counts_only_with_conditioning():
    from pipelines.asr.options import TranscribeOptions
    from pipelines.asr.outputs import run_signature

    def signature(**options):
        return run_signature("p", TranscribeOptions(**options))

    assert signature(prompt_reset_on_temperature=0.2) == signature()  # no history to reset: the same output
    assert signature(condition_on_previous_text=True, prompt_reset_on_temperature=0.2) != signature(
        condition_on_previous_text=True)
