"""An MP3 with a damaged stretch that libsndfile's mpg123 reads past without a word (it resyncs on the next
frame header, and the file only comes out shorter) is marked damaged: MP3 is decoded by ffmpeg, which fails
the frame. A sound MP3 decodes as libsndfile decodes it (inputs made here by soundfile)."""

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
