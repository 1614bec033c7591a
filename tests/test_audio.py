"""Audio decoding: every supported container to 16 kHz mono float32; every bad input one typed error."""

import numpy as np
import pytest
import soundfile as sf

from pipelines.audio import SAMPLE_RATE, AudioDecodeError, load_audio, stream_audio


def _tone(seconds=1.0, rate=44100, channels=2):
    t = np.arange(int(seconds * rate)) / rate
    mono = 0.3 * np.sin(2 * np.pi * 440 * t)
    return np.stack([mono] * channels, axis=1) if channels > 1 else mono, rate


def _encode_av(path, container, codec, seconds=1.0, rate=44100):
    import av

    samples, _ = _tone(seconds, rate, channels=1)
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        frame_size = 1024
        data = samples.astype(np.float32)
        for i in range(0, len(data), frame_size):
            chunk = data[i : i + frame_size].reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


@pytest.mark.parametrize("ext, fmt", [("wav", "WAV"), ("flac", "FLAC"), ("ogg", "OGG"), ("mp3", "MP3")])
def test_soundfile_formats_resampled_to_16k_mono(tmp_path, ext, fmt):
    data, rate = _tone(1.0, 44100, channels=2)
    path = tmp_path / f"tone.{ext}"
    sf.write(path, data, rate, format=fmt)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - SAMPLE_RATE) < 0.06 * SAMPLE_RATE  # mp3 adds encoder padding
    assert 0.15 < np.abs(audio).max() < 0.5


@pytest.mark.parametrize("name, container, codec", [("tone.m4a", "ipod", "aac"), ("tone.mp4", "mp4", "aac"),
                                                     ("tone.opus", "ogg", "libopus")])
def test_av_formats(tmp_path, name, container, codec):
    path = tmp_path / name
    _encode_av(path, container, codec, rate=48000 if codec == "libopus" else 44100)
    audio = load_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - SAMPLE_RATE) < 0.1 * SAMPLE_RATE


def test_streaming_yields_bounded_blocks(tmp_path):
    path = tmp_path / "long.wav"
    sf.write(path, np.zeros(16000 * 70, dtype=np.float32), 16000)
    blocks = list(stream_audio(path, block_seconds=30))
    assert [len(b) for b in blocks] == [480000, 480000, 160000]


def test_video_without_audio_stream(tmp_path):
    import av

    path = tmp_path / "silent.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=10)
        stream.width, stream.height = 32, 32
        for _ in range(3):
            frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), dtype=np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    with pytest.raises(AudioDecodeError, match="no audio stream"):
        load_audio(path)


def _bad_inputs(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    text = tmp_path / "notes.wav"
    text.write_text("this is not audio at all\n" * 20)
    corrupt = tmp_path / "corrupt.mp3"
    corrupt.write_bytes(np.random.default_rng(0).bytes(4000))
    zero = tmp_path / "zero.wav"
    sf.write(zero, np.zeros(0, dtype=np.float32), 16000)
    nan, inf, huge = tmp_path / "nan.wav", tmp_path / "inf.wav", tmp_path / "huge.wav"
    for path, value in ((nan, np.nan), (inf, -np.inf), (huge, 1e30)):  # a float WAV with some samples that are not numbers
        samples = np.sin(np.arange(24000, dtype=np.float32) / 9) * 0.3
        samples[20000:20100] = value
        sf.write(path, samples, 22050, subtype="FLOAT")  # resampled: the value spreads to its neighbours
    return {
        "missing": (tmp_path / "nope.wav", "no such file"),
        "folder": (tmp_path, "not a regular file"),
        "empty": (empty, "empty file"),
        "text named .wav": (text, "not an audio file"),
        "random bytes": (corrupt, "not an audio file|corrupt|no audio"),
        "zero-length": (zero, "zero-length"),
        "NaN samples": (nan, "not numbers"),
        "infinite samples": (inf, "not numbers"),
        "huge samples": (huge, r"beyond \+-1e\+06 \(full scale is 1\)"),
    }


@pytest.mark.parametrize("case", ["missing", "folder", "empty", "text named .wav", "random bytes", "zero-length",
                                  "NaN samples", "infinite samples", "huge samples"])
def test_bad_inputs_raise_one_typed_error(tmp_path, case):
    path, message = _bad_inputs(tmp_path)[case]
    with pytest.raises(AudioDecodeError, match=message) as info:
        load_audio(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)
