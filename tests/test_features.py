"""Whisper's log-mel features (pipelines/asr/features.py): a window's features are the slice of the whole file's
log-mel (one floor for the file, zeros after the content frames), whatever the window and however the file is
streamed; and they equal openai-whisper's own (skipped where openai-whisper is not installed: ``pip install
--no-deps openai-whisper==20250625 tiktoken numba``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from pipelines.asr import batching, cursors
from pipelines.asr.features import HALF, HOP, N_FFT, SAMPLES, Span, file_span, log_mel, loudest_frame, mel_filters
from pipelines.asr.options import TranscribeOptions
from pipelines.asr.windows import WindowReader

SR = 16000


@pytest.fixture(scope="module")
def filters():
    from transformers import WhisperFeatureExtractor

    return mel_filters(WhisperFeatureExtractor(feature_size=80))


def _speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise in bursts of varied loudness with a silent stretch (whose frames sit on the file's floor), and one
    loud burst late in the file, so that the file's floor is not its first window's."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR) + 37  # not a whole number of frames
    envelope = np.repeat(rng.uniform(0.0, 0.05, size=n // 1600 + 1), 1600)[:n]
    audio = (rng.standard_normal(n) * envelope).astype(np.float32)
    audio[5 * SR:9 * SR] = 0.0
    audio[-3 * SR:-2 * SR] *= 20.0
    return audio


def _whole_file_reference(audio: np.ndarray, filters) -> torch.Tensor:
    """openai/whisper's ``log_mel_spectrogram(audio, padding=N_SAMPLES)``, written out (with ``filters``)."""
    x = torch.nn.functional.pad(torch.from_numpy(audio), (0, SAMPLES))
    stft = torch.stft(x, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
    log_spec = torch.clamp(filters @ stft[..., :-1].abs() ** 2, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def _whisper_window(mel: torch.Tensor, seek: int, content_frames: int) -> torch.Tensor:
    """whisper's ``pad_or_trim(mel[:, seek:seek + segment_size], N_FRAMES)``."""
    part = mel[:, seek:seek + min(3000, content_frames - seek)]
    return torch.nn.functional.pad(part, (0, 3000 - part.shape[-1]))


def test_a_window_is_the_slice_of_the_files_log_mel(filters):
    audio = _speechlike(75.0)
    mel = _whole_file_reference(audio, filters)
    content = len(audio) // HOP
    ceiling = loudest_frame([audio], filters)
    seeks = [0, 160, 1000, 3000, 4417, content - 1200]  # the start, a frame in, mid-file, the last window
    got = log_mel([file_span(audio, seek * HOP, ceiling=ceiling) for seek in seeks], filters)
    for row, seek in enumerate(seeks):
        want = _whisper_window(mel, seek, content)
        assert torch.allclose(got[row], want, atol=1e-5, rtol=0), (seek, float((got[row] - want).abs().max()))
    assert got[-1][:, 1200:].eq(0).all() and got[-1][:, 1199].ne(0).all()  # zeros after the content frames
    assert float(got[0].min()) == pytest.approx((ceiling - 4.0) / 4.0, abs=1e-6)  # silence: the file's floor


def test_a_chunk_is_followed_by_silent_frames_not_zeros(filters):
    audio = _speechlike(75.0, seed=5)
    ceiling = loudest_frame([audio], filters)
    whisper, chunk = log_mel([file_span(audio, 4800, 12 * SR, ceiling=ceiling),
                              replace(file_span(audio, 4800, 12 * SR, ceiling=ceiling), silence_after=True)], filters)
    content = 12 * SR // HOP
    assert torch.equal(chunk[:, :content], whisper[:, :content])  # the content frames are the same
    assert whisper[:, content:].eq(0).all()  # whisper's pad_or_trim: zeros
    silent = torch.tensor((ceiling - 8.0 + 4.0) / 4.0, dtype=torch.float32)
    assert chunk[:, content:].eq(silent).all()  # the floor: a silent frame's value
    assert float(chunk.min()) == pytest.approx(float(silent), abs=1e-6)


def test_a_short_file_is_one_window_floored_by_itself(filters):
    audio = _speechlike(12.0, seed=1)
    mel = _whole_file_reference(audio, filters)
    [got] = log_mel([Span(audio)], filters)
    assert torch.allclose(got, _whisper_window(mel, 0, len(audio) // HOP), atol=1e-5, rtol=0)
    [tiny] = log_mel([Span(np.full(100, 0.1, dtype=np.float32))], filters)  # under one frame: no content
    assert tiny.eq(0).all()


def test_the_loudest_frame_is_found_block_by_block(filters):
    audio = _speechlike(40.0, seed=2)
    whole = float(torch.clamp(filters @ torch.stft(torch.nn.functional.pad(torch.from_numpy(audio), (0, SAMPLES)),
                                                  N_FFT, HOP, window=torch.hann_window(N_FFT),
                                                  return_complex=True)[..., :-1].abs() ** 2, min=1e-10).log10().max())
    cuts = [0, 1, 150, 151, 20000, 480000, 480400, len(audio)]  # blocks of 1, 149, 1 ... samples, the last ones long
    blocks = [audio[a:b] for a, b in zip(cuts, cuts[1:])]
    assert loudest_frame(blocks, filters) == pytest.approx(whole, abs=1e-6)
    assert loudest_frame([audio], filters) == pytest.approx(whole, abs=1e-6)
    assert loudest_frame([np.zeros(0, dtype=np.float32)], filters) == -10.0  # nothing: log10 of the 1e-10 clamp


def test_the_reader_keeps_the_samples_around_its_window(tmp_path):
    audio = _speechlike(70.0, seed=3)
    path = tmp_path / "long.wav"
    sf.write(path, audio, SR, subtype="FLOAT")
    reader = WindowReader(path)
    assert reader.whole() is None  # over two windows: not held whole
    assert np.array_equal(np.concatenate(list(reader.again())), audio)  # a second pass reads it all
    for start in (0, 100, SAMPLES + 320, len(audio) - 5000):
        window = reader.window(start)
        before, after = reader.around(start, len(window))
        assert np.array_equal(window, audio[start:start + SAMPLES])
        assert np.array_equal(before, audio[max(0, start - HALF):start])
        assert np.array_equal(after, audio[start + len(window):start + len(window) + HALF])
    short = tmp_path / "short.wav"
    sf.write(short, audio[:45 * SR], SR, subtype="FLOAT")
    assert np.array_equal(WindowReader(short).whole(), audio[:45 * SR])  # under two windows: held, one pass


class _Runner:
    """What ``cursors.open_cursor`` asks of a runner: the file's loudest frame (``calls``: how often)."""

    def __init__(self):
        self.calls = 0

    def loudest_frame(self, blocks):
        self.calls += 1
        return loudest_frame(blocks)


@pytest.mark.parametrize("long_form", ["sequential", "chunked"])
def test_a_files_pieces_carry_its_samples_around_them_and_its_floor(tmp_path, long_form):
    audio = _speechlike(70.0, seed=4)
    path = tmp_path / "long.wav"
    sf.write(path, audio, SR, subtype="FLOAT")
    options = TranscribeOptions(long_form=long_form, timestamps=True, audio_track=0)
    cur = cursors.open_cursor(path, options, _Runner())
    assert cur.ceiling == pytest.approx(loudest_frame([audio]), abs=1e-6)
    cur.seek = 12345 * 2
    span = batching._next_chunk(cur, options)
    want = file_span(audio, 12345 * 2, len(span.audio), ceiling=cur.ceiling)
    for name in ("audio", "before", "after"):
        assert np.array_equal(getattr(span, name), getattr(want, name)), name
    assert (span.start, span.ceiling) == (want.start, want.ceiling)
    assert span.silence_after == (long_form == "chunked")  # a chunk reads as followed by silence
    if long_form == "chunked":  # the rest of a chunk, redone: the samples before it are the chunk's
        batching._keep_leftover(cur, span, 3.0, np.ones(len(span.audio) // 160, dtype=bool))
        rest = cur.leftovers[0]
        assert rest.start == span.start + 3 * SR and np.array_equal(rest.before, audio[rest.start - HALF:rest.start])
        assert np.array_equal(rest.after, span.after) and np.array_equal(rest.audio, audio[rest.start:span.start
                                                                                            + len(span.audio)])


def test_features_equal_openai_whispers(filters):
    pytest.importorskip("whisper")
    from whisper.audio import N_SAMPLES, log_mel_spectrogram, mel_filters as whisper_filters

    assert torch.allclose(filters, whisper_filters("cpu", 80), atol=1e-8, rtol=0)
    audio = _speechlike(65.0, seed=5)
    mel = log_mel_spectrogram(audio, 80, padding=N_SAMPLES)
    ceiling = loudest_frame([audio], filters)
    seeks = [0, 2000, len(audio) // HOP - 900]
    got = log_mel([file_span(audio, seek * HOP, ceiling=ceiling) for seek in seeks], filters)
    for row, seek in enumerate(seeks):
        want = _whisper_window(mel, seek, len(audio) // HOP)
        assert torch.allclose(got[row], want, atol=1e-5, rtol=0), float((got[row] - want).abs().max())


def test_a_file_of_one_window_is_floored_by_its_own_features_in_one_pass(speech_real, filters):
    """speech-real's clips (real speech, each one window): ``open_cursor`` runs no pass of its own; the window's
    features, floored by their own frames, equal bit for bit those floored by the file's measured loudest frame
    (the pass it ran before), alone and as a batch, and whisper's."""
    runner, options = _Runner(), TranscribeOptions(audio_track=0)
    spans, audios = [], []
    for item in speech_real:
        cur = cursors.open_cursor(Path(item["audio_path"]), options, runner)
        spans.append(batching._next_chunk(cur, options))
        audios.append(cur.reader.whole())
    assert runner.calls == 0 and all(span.ceiling is None for span in spans)
    measured = [replace(span, ceiling=loudest_frame([audio], filters)) for span, audio in zip(spans, audios)]
    for span, old, audio in zip(spans, measured, audios):
        got = log_mel([span], filters)
        assert torch.equal(got, log_mel([old], filters)), float((got - log_mel([old], filters)).abs().max())
        want = _whisper_window(_whole_file_reference(audio, filters), 0, len(audio) // HOP)
        assert torch.allclose(got[0], want, atol=1e-5, rtol=0)
    assert torch.equal(log_mel(spans, filters), log_mel(measured, filters))


@pytest.mark.parametrize("long_form", ["sequential", "chunked"])
def test_a_later_piece_of_a_one_window_file_reads_the_files_floor(tmp_path, long_form):
    audio = _speechlike(25.0, seed=6)
    path = tmp_path / "short.wav"
    sf.write(path, audio, SR, subtype="FLOAT")
    runner, options = _Runner(), TranscribeOptions(long_form=long_form, timestamps=True, audio_track=0)
    cur = cursors.open_cursor(path, options, runner)
    first = batching._next_chunk(cur, options)
    assert (first.ceiling, len(first.audio), runner.calls) == (None, len(audio), 0)  # the whole file
    if long_form == "chunked":  # the rest of the chunk, redone
        batching._keep_leftover(cur, first, 3.0, np.ones(len(first.audio) // 160, dtype=bool))
    else:  # the seek moved by the timestamps
        cur.seek = 3 * SR
    later = batching._next_chunk(cur, options)
    assert later.start == 3 * SR and runner.calls == 1
    assert later.ceiling == loudest_frame([audio])
    vad = cursors.open_cursor(path, replace(options, vad_filter=True), runner)  # VAD zeroes samples: measured first
    assert runner.calls == 2 and vad.ceiling == later.ceiling
