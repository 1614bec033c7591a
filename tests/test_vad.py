"""The voice-activity filter (pipelines/asr/vad.py, ``--vad-filter``): Silero finds speech and not noise or tones,
the filter mutes what is not speech and keeps the file's time, no invented text with the filter alone,
speech transcripts unchanged (and assisted == plain), one sentence when faster-whisper is missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from pipelines.asr.vad import VadUnavailable, energy_regions, filter_speech, mute_outside
from pipelines.audio import SAMPLE_RATE as SR, load_audio, write_wav
from pipelines.quality.bench_vad import gaps, non_speech

GUARDS_OFF = ["--temperature", "0", "--no-speech-threshold", "off", "--logprob-threshold", "off",
              "--compression-ratio-threshold", "off"]


@pytest.fixture(scope="module")
def silero():
    pytest.importorskip("faster_whisper", reason="the vad extra: pip install -e '.[vad]'")
    from pipelines.asr.vad import silero_regions

    return silero_regions


def test_silero_finds_speech_and_not_noise_where_energy_cannot_tell(silero, speech_real):
    noise = non_speech(np.random.default_rng(0))
    assert all(silero(audio) == [] for audio in noise.values())
    assert sum(energy_regions(audio) != [] for audio in noise.values()) >= 8  # only digital silence (and maybe clicks) is quiet
    for item in speech_real:
        audio = load_audio(item["audio_path"])
        found = sum(b - a for a, b in silero(audio))
        assert found > 0.8 * len(audio), item["id"]


def test_filter_mutes_the_gap_and_keeps_the_speech_in_place(silero, speech_real):
    real = {i["id"]: load_audio(i["audio_path"]) for i in speech_real[:2]}
    audio, lo, hi = gaps(real, np.random.default_rng(0))["gap-white-0.05"]
    kept = filter_speech(audio, True)
    assert len(kept) == len(audio) and filter_speech(audio, False) is audio
    assert np.count_nonzero(kept[lo:hi]) < 0.5 * SR  # at most Silero's 0.4 s padding on each side
    assert np.array_equal(kept[: lo - SR // 2], audio[: lo - SR // 2])  # the speech itself, untouched
    assert np.array_equal(mute_outside(np.ones(10), [(2, 4), (7, 8)]), [0, 0, 1, 1, 0, 0, 0, 1, 0, 0])


def test_filter_alone_leaves_no_invented_text(silero, tmp_path, capsys):
    """With Whisper's safeguards off, noise and tones draw invented text out of Whisper (see the README's
    table); with the filter on they are silence: nothing decoded, nothing written."""
    from pipelines.cli import main

    folder = tmp_path / "in"
    folder.mkdir()
    noise = non_speech(np.random.default_rng(1))
    for name in ("white-0.05", "tones-12s", "hum-50hz"):
        write_wav(folder / f"{name}.wav", noise[name])
    out = tmp_path / "out"
    assert main(["transcribe", str(folder), "--out", str(out), "--pair", "whisper-base", "--vad-filter", *GUARDS_OFF]) == 0
    for name in ("white-0.05", "tones-12s", "hum-50hz"):
        assert (out / f"{name}.txt").read_text().strip() == "", name
    assert "(decoding 0.0 s)" in capsys.readouterr().out  # not even decoded: muted to digital silence


def test_speech_transcripts_unchanged_and_assisted_equals_plain(silero, registry, speech_real):
    from pipelines.asr import TranscribeOptions, WhisperRunner, transcribe

    pair = registry.get("whisper-base+distilled")
    runner = WhisperRunner(pair)
    paths = [i["audio_path"] for i in speech_real if i["id"] in ("cards-001", "cards-003", "goforward")]
    off = list(transcribe(paths, pair, TranscribeOptions(), runner))
    on = list(transcribe(paths, pair, TranscribeOptions(vad_filter=True, compare=True), runner))
    assert [r.text for r in on] == [r.text for r in off] and all(r.text and r.identical for r in on)


def test_gap_is_not_decoded_and_times_stay_the_files(silero, registry, base_runner, speech_real, tmp_path):
    from pipelines.asr import TranscribeOptions, transcribe

    real = {i["id"]: load_audio(i["audio_path"]) for i in speech_real if i["id"] in ("goforward", "cards-005")}
    audio, lo, hi = gaps(real, np.random.default_rng(0), seconds=6)["gap-white-0.05"]
    write_wav(tmp_path / "gap.wav", audio)
    (result,) = transcribe([tmp_path / "gap.wav"], registry.get("whisper-base"),
                           TranscribeOptions(vad_filter=True, timestamps=True), base_runner)
    segs = result.segments
    assert "spades" in result.text.lower() and "go forward" in result.text.lower()
    assert not any(lo / SR + 0.5 < s.start < hi / SR - 0.5 for s in segs)  # nothing starts inside the gap
    assert segs[0].end <= lo / SR + 0.5 and segs[-1].start >= hi / SR - 0.5  # each clip where it is in the file
    assert segs[-1].end <= len(audio) / SR


def test_missing_faster_whisper_is_one_sentence(monkeypatch, tmp_path, speech_real, capsys):
    from pipelines.asr import TranscribeOptions, transcribe
    from pipelines.cli import main

    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # import faster_whisper raises ImportError
    monkeypatch.setitem(sys.modules, "faster_whisper.vad", None)
    out = tmp_path / "out"
    assert main(["transcribe", speech_real[0]["audio_path"], "--out", str(out), "--vad-filter"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install -e '.[vad]'" in err and "faster_whisper" in err
    assert not out.exists()  # refused before the output folder was taken
    with pytest.raises(VadUnavailable, match=r"\.\[vad\]"):
        next(transcribe([speech_real[0]["audio_path"]], None, TranscribeOptions(vad_filter=True), runner=_NoModel()))


class _NoModel:
    """A runner stand-in: ``transcribe`` must refuse before it decodes anything."""

    def check_language(self, options) -> None:
        pass
