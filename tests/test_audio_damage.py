"""Audio as it comes from the world: a track that starts late in its container, several tracks, a WAV whose
header says 0 bytes, a FLAC or MP3 with a damaged block, a file cut in half. Each decodes what can be
decoded and says so in its DecodeReport (inputs made here by soundfile and PyAV)."""

import struct
from fractions import Fraction

import numpy as np
import pytest
import soundfile as sf

from pipelines.audio import SAMPLE_RATE, AudioDecodeError, DecodeReport, decode_audio, stream_audio


def _signal(seconds: float, rate: int = 16000, freq: float = 440.0) -> np.ndarray:
    """A tone with a slow tremolo and a little noise (so a compressed file is not nearly empty)."""
    t = np.arange(int(seconds * rate)) / rate
    noise = np.random.default_rng(0).normal(0, 0.02, len(t))
    return (0.3 * np.sin(2 * np.pi * freq * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 0.5 * t)) + noise).astype(np.float32)


def mux(path, fmt: str, tracks, video_seconds: float = 0.0, rate: int = 16000, codec: str = "flac") -> None:
    """A container with a black video from 0 s (when ``video_seconds``) and one audio stream per
    ``(samples, start_seconds)`` of ``tracks``, each with its packets stamped from its start."""
    import av

    with av.open(str(path), "w", format=fmt) as out:
        if video_seconds:
            video = out.add_stream("mpeg4", rate=10)
            video.width, video.height, video.pix_fmt = 32, 32, "yuv420p"
        streams = [out.add_stream(codec, rate=rate, layout="mono") for _ in tracks]
        if video_seconds:
            for i in range(int(video_seconds * 10)):
                frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
                frame.pts = i
                for packet in video.encode(frame):
                    out.mux(packet)
            for packet in video.encode(None):
                out.mux(packet)
        for stream, (samples, start) in zip(streams, tracks):
            size = stream.codec_context.frame_size or 1024
            for i in range(0, len(samples), size):
                frame = av.AudioFrame.from_ndarray(samples[i : i + size].reshape(1, -1), format="flt", layout="mono")
                frame.sample_rate, frame.time_base, frame.pts = rate, Fraction(1, rate), int(start * rate) + i
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)


def aac(path, fmt: str, samples: np.ndarray, rate: int = 48000, options: dict | None = None) -> None:
    """``samples`` (16 kHz) as one AAC track at ``rate`` in a ``fmt`` container (muxer ``options``: mp4's
    ``use_editlist``), frames stamped from 0."""
    import av
    import soxr

    audio = soxr.resample(samples, SAMPLE_RATE, rate).astype(np.float32)
    with av.open(str(path), "w", format=fmt, options=options or {}) as out:
        stream = out.add_stream("aac", rate=rate, layout="mono")
        for i in range(0, len(audio), 1024):
            frame = av.AudioFrame.from_ndarray(audio[i : i + 1024].reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate, frame.time_base, frame.pts = rate, Fraction(1, rate), i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def lag_ms(decoded: np.ndarray, source: np.ndarray) -> float:
    """Where ``source``'s first 2 s sit in ``decoded`` (ms, by cross-correlation, 16 kHz)."""
    n = 2 * SAMPLE_RATE
    return float(np.argmax(np.correlate(decoded[: n + 3200], source[:n], mode="valid"))) / 16


@pytest.mark.parametrize("name,fmt,options", [("edit_list.m4a", "mp4", None),
                                              ("no_edit_list.m4a", "mp4", {"use_editlist": "0"}),
                                              ("raw.aac", "adts", None), ("priming_in.mka", "matroska", None)])
def test_aac_priming_is_dropped_whether_or_not_the_container_marks_it(tmp_path, name, fmt, options):
    source = _signal(3.0) * np.repeat(np.random.default_rng(2).random(30) > 0.5, 1600)  # bursts: one best lag
    path = tmp_path / name
    aac(path, fmt, source, options=options)
    audio, report = decode_audio(path)
    assert lag_ms(audio, source) == 0.0  # not 1024 samples of priming late (21.3 ms at 48 kHz)
    assert abs(len(audio) - len(source)) < 0.03 * SAMPLE_RATE and not report.damaged


def _overwrite(path, share: float, size: int) -> None:
    data = bytearray(path.read_bytes())
    at = int(len(data) * share)
    data[at : at + size] = np.random.default_rng(1).bytes(size)
    path.write_bytes(bytes(data))


def _cut(path, share: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * share)])


def test_a_sound_file_reports_nothing_wrong(tmp_path):
    path = tmp_path / "ok.flac"
    sf.write(path, _signal(4.0), 16000)
    audio, report = decode_audio(path)
    assert len(audio) == 4 * SAMPLE_RATE
    assert report == DecodeReport(seconds=4.0, declared_seconds=4.0)
    assert not report.damaged and report.seconds_recovered == 4.0


@pytest.mark.parametrize("fmt", ["matroska", "mp4"])
def test_a_track_that_starts_late_reports_its_offset(tmp_path, fmt):
    path = tmp_path / f"late.{'mkv' if fmt == 'matroska' else 'mp4'}"
    mux(path, fmt, [(_signal(2.0), 2.0)], video_seconds=4.0, codec="flac" if fmt == "matroska" else "aac")
    audio, report = decode_audio(path)
    assert report.start_offset == pytest.approx(2.0, abs=0.01)  # mp4: past the AAC priming its timeline holds
    assert abs(len(audio) / SAMPLE_RATE - 2.0) < 0.15  # AAC pads its last frame
    assert not report.damaged


def test_the_audio_track_is_chosen_by_index(tmp_path):
    path = tmp_path / "two.mkv"
    mux(path, "matroska", [(_signal(2.0, freq=300), 0.0), (_signal(3.0, freq=1000), 0.0)])
    first, one = decode_audio(path)
    second, two = decode_audio(path, track=1)
    assert (one.track, one.tracks, two.track, two.tracks) == (0, 2, 1, 2)
    assert abs(len(first) / SAMPLE_RATE - 2.0) < 0.05 and abs(len(second) / SAMPLE_RATE - 3.0) < 0.05
    peak = lambda x: np.argmax(np.abs(np.fft.rfft(x))) * SAMPLE_RATE / len(x)  # noqa: E731
    assert abs(peak(first) - 300) < 10 and abs(peak(second) - 1000) < 10
    with pytest.raises(AudioDecodeError, match="track 2 asked for, but the file has 2 audio tracks"):
        decode_audio(path, track=2)
    wav = tmp_path / "one.wav"
    sf.write(wav, _signal(1.0), 16000)
    with pytest.raises(AudioDecodeError, match="has 1 audio track "):
        decode_audio(wav, track=1)


def test_a_wav_whose_header_says_zero_bytes_is_read_to_its_end(tmp_path):
    path = tmp_path / "crashed.wav"
    sf.write(path, _signal(6.0), 16000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    at = data.find(b"data")
    data[at + 4 : at + 8] = struct.pack("<I", 0)  # a recorder that crashed before writing the sizes
    data[4:8] = struct.pack("<I", 0)
    path.write_bytes(bytes(data))
    audio, report = decode_audio(path)
    assert len(audio) == 6 * SAMPLE_RATE
    assert report.damaged and not report.truncated
    assert "header declares no audio" in report.warnings[0]
    assert report.seconds_recovered == 6.0


@pytest.mark.parametrize("fmt", ["FLAC", "MP3"])
def test_a_damaged_block_in_the_middle_is_decoded_around(tmp_path, fmt):
    path = tmp_path / f"damaged.{fmt.lower()}"
    sf.write(path, _signal(10.0), 16000, format=fmt)
    _overwrite(path, 0.5, 1500)
    audio, report = decode_audio(path)
    assert report.damaged and report.damaged_blocks >= 1 and not report.truncated
    assert len(audio) / SAMPLE_RATE > 8.0  # most of it
    assert report.seconds_recovered > 8.0
    if fmt == "FLAC":  # its frames say where they belong: the hole is filled, later times stay in place
        assert len(audio) == 10 * SAMPLE_RATE and report.filled_seconds > 0


@pytest.mark.parametrize("fmt", ["WAV", "FLAC", "MP3"])
def test_a_file_cut_in_half_is_truncated(tmp_path, fmt):
    path = tmp_path / f"cut.{fmt.lower()}"
    sf.write(path, _signal(10.0), 16000, format=fmt)
    _cut(path)
    audio, report = decode_audio(path)
    assert report.truncated and report.damaged
    assert report.declared_seconds == pytest.approx(10.0, abs=0.1)
    assert 4.0 < report.seconds_recovered < 6.0 and report.seconds_recovered == pytest.approx(len(audio) / SAMPLE_RATE, abs=1e-3)
    assert any("truncated" in w for w in report.warnings)


def test_the_report_is_known_once_streamed_to_the_end(tmp_path):
    path = tmp_path / "cut.flac"
    sf.write(path, _signal(70.0), 16000)
    _cut(path, 0.6)
    stream = stream_audio(path, block_seconds=30)
    blocks = list(stream)
    assert len(blocks) >= 2 and stream.report.truncated
