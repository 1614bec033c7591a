"""Whisper's safeguards: no invented text for tones, noise and clips too short for a word; no loop, no
cue past the end or of zero length; the figures on every segment; fallbacks sample through the engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.asr.safeguards import avg_logprob, compression_ratio, is_silence, needs_fallback

SR = 16000


class Opts:
    compression_ratio_threshold, logprob_threshold, no_speech_threshold = 2.4, -1.0, 0.6


@pytest.mark.parametrize("ratio, logprob, no_speech, fallback, silence", [
    (1.5, -0.3, 0.1, False, False),  # confident speech
    (3.0, -0.3, 0.1, True, False),  # a loop: hotter
    (1.5, -1.5, 0.1, True, False),  # unlikely text: hotter
    (1.5, -1.5, 0.9, False, True),  # silence: skipped, not retried
    (1.5, -0.5, 0.9, False, False),  # no-speech token likely but the text is confident: kept
])
def test_fallback_and_silence_rules(ratio, logprob, no_speech, fallback, silence):
    assert needs_fallback(ratio, logprob, no_speech, Opts) is fallback
    assert is_silence(no_speech, logprob, Opts) is silence


def test_figures():
    assert compression_ratio("Thank you. " * 30) > 2.4 > compression_ratio("The birch canoe slid on the smooth planks.")
    assert avg_logprob(-3.0, [1, 2, 50257], 50257) == -1.0  # EOT counted in the sum, not in the length


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory):
    import soundfile as sf

    folder = tmp_path_factory.mktemp("odd")
    rng = np.random.default_rng(0)
    t = np.arange(12 * SR) / SR
    pulses = 0.3 * np.sin(2 * np.pi * 440 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 0.5 * t))
    sweep = 0.2 * np.sin(2 * np.pi * (200 + 300 * t[: 6 * SR]) * t[: 6 * SR])
    cases = {"tones": pulses, "noise": 0.05 * rng.standard_normal(8 * SR), "one-sample": np.array([0.1]),
             "ten-ms": 0.1 * rng.standard_normal(160), "sweep": sweep, "hum": 0.05 * np.sin(2 * np.pi * 50 * t[: 5 * SR])}
    for name, audio in cases.items():
        sf.write(folder / f"{name}.wav", audio.astype(np.float32), SR)
    return folder


def _check_transcript(out, name, duration):
    data = json.loads((out / f"{name}.json").read_text())
    text = data["text"]
    assert compression_ratio(text) <= 2.4, (name, text)  # never a loop
    for seg in data["segments"]:
        assert 0 <= seg["start"] < seg["end"] <= duration + 1e-6, (name, seg)
        assert seg["avg_logprob"] is not None and seg["compression_ratio"] is not None and seg["temperature"] is not None
    srt = (out / f"{name}.srt").read_text()
    assert "00:00:00,000 --> 00:00:00,000" not in srt
    return data


def test_no_invented_text_for_non_speech(odd_files, tmp_path, capsys):
    from pipelines.cli import main

    out = tmp_path / "out"
    assert main(["transcribe", str(odd_files), "--out", str(out), "--formats", "txt,srt,json"]) == 0
    printed = capsys.readouterr().out
    durations = {"tones": 12.0, "noise": 8.0, "one-sample": 1 / SR, "ten-ms": 0.01, "sweep": 6.0, "hum": 5.0}
    for name, duration in durations.items():
        data = _check_transcript(out, name, duration)
        flagged = data["skipped"] or data["dropped"] or all(seg["no_speech"] for seg in data["segments"])
        assert data["text"] == "" or flagged, (name, data["text"])
    for name in ("one-sample", "ten-ms"):  # too short to hold a word
        assert (out / f"{name}.txt").read_text().strip() == ""
    assert "safeguards:" in printed


def test_speech_keeps_its_text_and_carries_the_figures(speech_real, tmp_path):
    from pipelines.cli import main

    clip = next(i for i in speech_real if i["id"] == "goforward")
    out = tmp_path / "out"
    assert main(["transcribe", clip["audio_path"], "--out", str(out), "--formats", "json,srt", "--pair", "whisper-base"]) == 0
    data = _check_transcript(out, "goforward", 3.0)
    assert "go forward" in data["text"].lower() and data["retried"] == data["skipped"] == data["dropped"] == 0
    seg = data["segments"][0]
    assert seg["temperature"] == 0.0 and -1.0 < seg["avg_logprob"] < 0 and 0 <= seg["no_speech_prob"] < 0.6


def test_fallback_samples_assisted_and_off_means_today(registry, speech_real):
    """A forced fallback (every window's avg_logprob is below 0) samples at the next temperature through the
    assisted engine, and a window still failing at the last temperature is dropped; with the safeguards off the tokens are those of the default settings on real speech
    (no window there needs a fallback), and plain and assisted stay identical."""
    from pipelines.asr import TranscribeOptions, WhisperRunner, transcribe

    pair = registry.get("whisper-base+distilled")
    runner = WhisperRunner(pair)
    paths = [i["audio_path"] for i in speech_real[:4]]
    greedy = list(transcribe(paths, pair, TranscribeOptions(temperature=(0.0,)), runner))
    forced = list(transcribe(paths, pair, TranscribeOptions(logprob_threshold=0.0, temperature=(0.0, 0.5)), runner))
    assert all(r.retried == 1 and r.dropped == 1 and r.text == "" and not r.segments for r in forced)
    assert all(f.tokens > g.tokens for f, g in zip(forced, greedy))  # the sampled retry decoded ...
    assert sum(f.accepted for f in forced) > sum(g.accepted for g in greedy)  # ... with drafts accepted
    off = TranscribeOptions(temperature=(0.0,), compression_ratio_threshold=None, logprob_threshold=None,
                            no_speech_threshold=None, compare=True)
    default = TranscribeOptions(compare=True)
    a = list(transcribe(paths, pair, off, runner))
    b = list(transcribe(paths, pair, default, runner))
    assert [r.text for r in a] == [r.text for r in b] and all(r.identical for r in a + b)


def test_a_files_sampled_fallbacks_do_not_depend_on_where_it_lives(registry, speech_real, tmp_path):
    """The fallbacks' samples are seeded by the window's audio and start, not by the file's path: the same
    clip under two names in two folders gives the same sampled retries (a forced fallback at temperature 1.0
    decodes the same tokens)."""
    import shutil

    from pipelines.asr import TranscribeOptions, WhisperRunner, transcribe
    from pipelines.asr.batching import window_seed

    pair = registry.get("whisper-base+distilled")
    runner = WhisperRunner(pair)
    copies = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        copies.append(shutil.copy(speech_real[0]["audio_path"], tmp_path / folder / f"{folder}-copy.wav"))
    forced = TranscribeOptions(logprob_threshold=0.0, temperature=(0.0, 1.0))
    first, second = sorted(transcribe(copies, pair, forced, runner), key=lambda r: r.path)
    sampled = lambda r: (r.tokens, r.accepted, r.main_calls)  # noqa: E731  (what the samples decided)
    assert first.retried == second.retried == 1 and sampled(first) == sampled(second)
    audio = np.linspace(-0.5, 0.5, 480, dtype=np.float32)
    assert window_seed(audio, 0) == window_seed(audio.copy(), 0) != window_seed(audio, 480)
    assert window_seed(audio, 0) != window_seed(audio[::-1], 0)


def test_bad_safeguard_options_are_refused():
    from pipelines.asr import TranscribeOptions

    for bad in ({"temperature": ()}, {"temperature": (0.5, 0.0)}, {"no_speech_threshold": 1.5},
                {"compression_ratio_threshold": 0.0}):
        with pytest.raises(ValueError):
            TranscribeOptions(**bad)
