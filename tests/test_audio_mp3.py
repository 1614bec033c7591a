"""An MP3 with a damaged stretch that libsndfile's mpg123 reads past without a word (it resyncs on the next
frame header, and the file only comes out shorter) is marked damaged: MP3 is decoded by ffmpeg, which fails
the frame. A sound MP3 decodes as libsndfile decodes it, cover art or not (inputs made here by
soundfile)."""

import struct
import zlib

import numpy as np
import pytest
import soundfile as sf
from test_audio_damage import _overwrite, _signal

from pipelines.audio import SAMPLE_RATE, DecodeReport, decode_audio


def _mp3(path, seconds: float = 10.0):
    sf.write(path, _signal(seconds), SAMPLE_RATE, format="MP3")
    return path


@pytest.mark.parametrize("share", [0.3, 0.5])
def test_frames_mpg123_skips_in_silence_mark_the_mp3_damaged(tmp_path, share):
    path = _mp3(tmp_path / "damaged.mp3")
    _overwrite(path, share, 400)
    with sf.SoundFile(path) as f:  # the case: libsndfile raises nothing, and reads fewer frames than declared
        declared, read = f.frames, len(f.read(dtype="float32"))
    assert declared == 10 * SAMPLE_RATE and 0 < declared - read < 0.5 * SAMPLE_RATE
    audio, report = decode_audio(path)
    assert report.damaged and report.damaged_blocks >= 1 and not report.truncated
    assert "damaged block" in report.warnings[0]
    at = float(report.warnings[0].split(" at ")[1].split(" s")[0])
    assert at == pytest.approx(share * 10.0, abs=0.6)  # where the bytes were overwritten
    assert report.seconds_recovered > 9.5 and len(audio) / SAMPLE_RATE > 9.5


def test_a_sound_mp3_decodes_as_libsndfile_decodes_it(tmp_path):
    path = _mp3(tmp_path / "ok.mp3")
    audio, report = decode_audio(path)
    reference = sf.read(path, dtype="float32")[0]  # mpg123, at the file's own rate (16 kHz): no resampling
    assert report == DecodeReport(seconds=10.0, declared_seconds=10.0)
    assert len(audio) == len(reference) and np.abs(audio - reference).max() < 1e-5


def _png() -> bytes:
    """A 1x1 PNG."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


def test_an_mp3_with_cover_art_starts_at_zero(tmp_path):
    # ffmpeg sees the ID3 picture as a second (video) stream, and the audio's start_time is the encoder delay
    # it drops (69 ms here): neither may move the times, as libsndfile's decoding did not
    plain = _mp3(tmp_path / "plain.mp3")
    picture = b"\x00image/png\x00\x03\x00" + _png()  # APIC: encoding, mime, front cover, no description
    frame = b"APIC" + struct.pack(">I", len(picture)) + b"\x00\x00" + picture
    size = bytes((len(frame) >> shift) & 0x7F for shift in (21, 14, 7, 0))  # ID3v2's syncsafe integer
    art = tmp_path / "art.mp3"
    art.write_bytes(b"ID3\x03\x00\x00" + size + frame + plain.read_bytes())
    audio, report = decode_audio(art)
    assert report == DecodeReport(seconds=10.0, declared_seconds=10.0)
    assert np.abs(audio - decode_audio(plain)[0]).max() == 0.0
