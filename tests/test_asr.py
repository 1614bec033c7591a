"""The ASR pipeline as a user meets it: a folder of mixed files in one command, outputs and failures,
resuming, timed segments, and assisted output identical to plain."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pipelines.asr import Segment, TranscribeOptions, quiet_cut, transcribe
from pipelines.asr.outputs import format_srt, format_vtt
from pipelines.cli import main


def _reencode(src: Path, dest: Path, container: str, codec: str) -> None:
    import av

    from pipelines.audio import load_audio

    samples = load_audio(src)
    with av.open(str(dest), "w", format=container) as out:
        stream = out.add_stream(codec, rate=16000, layout="mono")
        for i in range(0, len(samples), 1024):
            frame = av.AudioFrame.from_ndarray(samples[i : i + 1024].reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate = 16000
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


@pytest.fixture(scope="module")
def speech_long():
    from pipelines.quality.sets import build_set, read_manifest

    if shutil.which("flite") is None:
        pytest.skip("flite (Debian) is not installed")
    build_set("speech-long")
    return read_manifest("speech-long")


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory, speech_real, speech_long):
    """wav, flac, mp3, m4a, mp4 (audio track), a corrupt file, an empty file, a text file named .wav,
    silence and a file over three minutes, some in a subfolder."""
    folder = tmp_path_factory.mktemp("inbox")
    clips = {i["id"]: Path(i["audio_path"]) for i in speech_real}
    shutil.copy(clips["goforward"], folder / "goforward.wav")
    data, rate = sf.read(clips["forever"])
    sf.write(folder / "forever.flac", data, rate)
    sf.write(folder / "cards-001.mp3", sf.read(clips["cards-001"])[0], 16000, format="MP3")
    (folder / "video").mkdir()
    _reencode(clips["librivox-sense_and_sensibility_01_austen_64kb-0880"], folder / "video" / "austen.m4a", "ipod", "aac")
    _reencode(clips["librivox-sense_and_sensibility_01_austen_64kb-0930"], folder / "video" / "austen2.mp4", "mp4", "aac")
    (folder / "corrupt.mp3").write_bytes(np.random.default_rng(1).bytes(5000))
    (folder / "empty.wav").write_bytes(b"")
    (folder / "notes.wav").write_text("meeting notes, not audio\n" * 10)
    sf.write(folder / "silence.wav", np.zeros(16000 * 5, dtype=np.float32), 16000)
    long = next(i for i in speech_long if 180 <= i["duration"] <= 300)
    shutil.copy(long["audio_path"], folder / "long.wav")
    return folder, long


GOOD = {"goforward", "forever", "cards-001", "austen", "austen2", "silence", "long"}
BAD = {"corrupt": "not an audio file", "empty": "empty file", "notes": "not an audio file"}


def test_mixed_folder_in_one_command_then_resume(mixed_folder, tmp_path, monkeypatch, capsys):
    folder, long = mixed_folder
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)  # --out as a relative path here; the re-run below starts from another folder
    code = main(["transcribe", str(folder), "--out", "out", "--formats", "txt,srt,json", "--batch-size", "4"])
    printed = capsys.readouterr().out
    assert code == 1  # some files failed
    for stem in GOOD:
        base = next(out.rglob(f"{stem}.tandem.json")).with_name(stem)
        for fmt in ("txt", "srt", "json"):
            assert base.with_name(f"{stem}.{fmt}").is_file(), (stem, fmt)
        assert json.loads(base.with_name(f"{stem}.tandem.json").read_text())["status"] == "done"
    assert (out / "video" / "austen.txt").is_file()  # the input folders are mirrored
    failures = (out / "failures.tsv").read_text().splitlines()[1:]
    reasons = {Path(line.split("\t")[0]).stem: line.split("\t")[1] for line in failures}
    assert set(reasons) == set(BAD)
    for stem, reason in BAD.items():
        assert reason in reasons[stem]
    assert (out / "silence.txt").read_text().strip() == ""  # silence: nothing, not a hallucination
    assert "go forward 10 meters" in (out / "goforward.txt").read_text().lower()
    from pipelines.quality.metrics import wer

    assert wer([(out / "long.txt").read_text()], [long["reference"]]).value < 0.15
    assert "files:           10 (3 failed)" in printed

    # a re-run does nothing for the finished files, from any working folder; the failed ones are tried again
    monkeypatch.chdir("/")
    code = main(["transcribe", str(folder), "--out", str(out), "--formats", "txt,srt,json"])
    printed = capsys.readouterr().out
    assert "resuming: 7 of 10 files already done" in printed and "files:           3 (3 failed)" in printed

    # a half-written file (an output without its record) and a changed source are redone, nothing else
    (out / "forever.tandem.json").unlink()
    (out / "goforward.txt").write_text("half")
    shutil.copy(folder / "goforward.wav", tmp_path / "g.wav")
    (folder / "goforward.wav").write_bytes((tmp_path / "g.wav").read_bytes())  # same bytes, new mtime
    code = main(["transcribe", str(folder), "--out", str(out), "--formats", "txt,srt,json"])
    printed = capsys.readouterr().out
    assert "resuming: 5 of 10 files already done" in printed
    assert "Go forward 10 meters" in (out / "goforward.txt").read_text()


def test_interrupted_run_resumes_without_redoing(mixed_folder, tmp_path, monkeypatch, capsys):
    from pipelines.asr import outputs

    folder, _ = mixed_folder
    out = tmp_path / "out"
    real_write = outputs.OutputTree.write
    calls = {"n": 0}

    def write_then_interrupt(self, t):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # Ctrl-C while the third result is being written
        return real_write(self, t)

    monkeypatch.setattr(outputs.OutputTree, "write", write_then_interrupt)
    inputs = [str(folder / n) for n in ("goforward.wav", "forever.flac", "cards-001.mp3", "silence.wav")]
    assert main(["transcribe", *inputs, "--out", str(out), "--batch-size", "1"]) == 130
    assert "interrupted" in capsys.readouterr().out
    done = sorted(p.name for p in out.glob("*.tandem.json"))
    assert done == ["forever.tandem.json", "goforward.tandem.json"]
    monkeypatch.setattr(outputs.OutputTree, "write", real_write)
    assert main(["transcribe", *inputs, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "resuming: 2 of 4 files already done" in printed and "files:           2 (0 failed)" in printed


def _timing_hits(items, results):
    hits = total = 0
    for item in items:
        segs = results[item["audio_path"]].segments
        for ref in item["segments"]:
            total += 1
            hits += any(abs(s.start - ref["start"]) <= 1.0 for s in segs) and any(abs(s.end - ref["end"]) <= 1.0 for s in segs)
    return hits, total


def test_segment_times_follow_the_sentences(registry, base_runner, speech_long):
    items = [i for i in speech_long if i["duration"] <= 110]  # the two shorter recordings (CI time)
    results = {r.path: r for r in transcribe([i["audio_path"] for i in items], registry.get("whisper-base"),
                                             TranscribeOptions(batch_size=2), base_runner)}
    hits, total = _timing_hits(items, results)
    assert hits / total >= 0.9, (hits, total)


@pytest.mark.slow
def test_segment_times_on_all_of_speech_long(registry, base_runner, speech_long):
    results = {r.path: r for r in transcribe([i["audio_path"] for i in speech_long], registry.get("whisper-base"),
                                             TranscribeOptions(batch_size=5), base_runner)}
    hits, total = _timing_hits(speech_long, results)
    assert hits / total >= 0.9, (hits, total)


def test_assisted_long_form_is_identical_to_plain(registry, speech_long):
    """Every 30 s window of a long recording, decoded in a batch with short clips, with the test pair's
    assistant: the tokens equal plain decoding's, so the transcript and the seeks are the same."""
    item = min(speech_long, key=lambda i: i["duration"])
    pair = registry.get("whisper-base+truncated-2l")
    results = list(transcribe([item["audio_path"]], pair, TranscribeOptions(compare=True, batch_size=2)))
    assert results[0].identical is True and results[0].drafted > 0 and results[0].plain_seconds > 0


def test_quiet_cut_goes_in_the_middle_of_the_last_pause():
    """Noise at 0.003 RMS everywhere, tones with pauses at 8-9 s, 18-18.6 s and 24-25 s: the cut is in the
    middle of the last pause after 15 s, not in the first one nor at the window's end."""
    rng = np.random.default_rng(0)
    t = np.arange(30 * 16000) / 16000
    audio = 0.2 * np.sin(2 * np.pi * 220 * t) + rng.normal(0, 0.003, len(t))
    for a, b in ((8.0, 9.0), (18.0, 18.6), (24.0, 25.0)):
        audio[int(a * 16000): int(b * 16000)] = rng.normal(0, 0.003, int((b - a) * 16000))
    cut = quiet_cut(audio.astype(np.float32)) / 16000
    assert 24.3 <= cut <= 24.7, cut
    assert quiet_cut(audio[: 10 * 16000].astype(np.float32)) == 10 * 16000  # nothing after 15 s: keep it all


def test_chunked_long_form_times_and_identical_output(registry, speech_long):
    """Chunked long-form: the shortest recording cut at pauses, its chunks decoded in one batch; sentence
    times within 1 s, the words as good as sequential decoding's, the assistant's output equal to plain."""
    from pipelines.quality.metrics import wer

    item = min(speech_long, key=lambda i: i["duration"])
    pair = registry.get("whisper-base+truncated-2l")
    result = next(transcribe([item["audio_path"]], pair, TranscribeOptions(compare=True, batch_size=4, long_form="chunked")))
    assert result.identical is True and result.drafted > 0
    hits, total = _timing_hits([item], {item["audio_path"]: result})
    assert hits / total >= 0.9, (hits, total)
    assert wer([result.text], [item["reference"]]).value < 0.1
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts) and result.duration == pytest.approx(item["duration"], abs=0.01)


def test_language_detection_reuses_the_encoder_pass(registry, base_runner, speech_real, monkeypatch):
    """--language auto: each window is encoded once, for detection and decoding both (the windows of a step in
    one encoder pass, as with a fixed language)."""
    paths = [i["audio_path"] for i in speech_real[:2]]
    main = base_runner.loaded.main
    calls = []
    real_encode = main.encode

    def counting(**inputs):
        calls.append(inputs["input_features"].shape[0])
        return real_encode(**inputs)

    monkeypatch.setattr(main, "encode", counting)
    pair = registry.get("whisper-base")
    auto = list(transcribe(paths, pair, TranscribeOptions(language=None, batch_size=2), base_runner))
    assert calls == [2] and [r.language for r in auto] == ["en", "en"]
    calls.clear()
    english = list(transcribe(paths, pair, TranscribeOptions(language="en", batch_size=2), base_runner))
    assert calls == [2] and [r.text for r in auto] == [r.text for r in english]


def test_options_are_checked():
    with pytest.raises(ValueError, match="long_form"):
        TranscribeOptions(long_form="parallel")
    with pytest.raises(ValueError, match="batch_size"):
        TranscribeOptions(batch_size=0)


def test_subtitle_formats():
    segs = (Segment(0.0, 1.5, "Hello there."), Segment(61.25, 3723.004, "Bye."))
    assert format_srt(segs) == ("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
                                "2\n00:01:01,250 --> 01:02:03,004\nBye.\n")
    assert format_vtt(segs).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n")
