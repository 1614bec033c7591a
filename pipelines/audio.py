"""Decode any audio (or the audio track of a video) to 16 kHz mono float32.

soundfile (libsndfile: wav, flac, ogg/vorbis, opus, mp3) is tried first; PyAV (ffmpeg: m4a, mp4, webm,
anything else) second. Resampling is soxr's. Long files can be streamed in blocks so memory stays bounded.
Every failure is an ``AudioDecodeError`` whose message names the file and the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .errors import TandemError
from .paths import display

SAMPLE_RATE = 16000  # Whisper's input rate, Hz
# Extensions offered when a folder is scanned; any other file can still be passed explicitly.
AUDIO_EXTENSIONS = frozenset(
    {".wav", ".flac", ".mp3", ".ogg", ".opus", ".oga", ".m4a", ".aac", ".mp4", ".m4v", ".mov", ".mkv",
     ".webm", ".wma", ".aiff", ".aif", ".caf"}
)


class AudioDecodeError(TandemError, ValueError):
    """The file cannot be turned into audio samples; the message says which file and why."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"{display(path)}: {reason}")


def _check_file(path: Path) -> None:
    if not path.exists():
        if path.is_symlink():
            raise AudioDecodeError(path, f"broken symbolic link (to {display(os.readlink(path))}, which does not exist)")
        raise AudioDecodeError(path, "no such file")
    if not path.is_file():
        raise AudioDecodeError(path, "not a regular file")
    if path.stat().st_size == 0:
        raise AudioDecodeError(path, "empty file (0 bytes)")
    if not os.access(path, os.R_OK):
        raise AudioDecodeError(path, "cannot be read (permission denied)")


def _to_mono(block: np.ndarray) -> np.ndarray:
    return block.mean(axis=1, dtype=np.float32) if block.ndim == 2 else block.astype(np.float32, copy=False)


def _stream_soundfile(path: Path, block_seconds: float) -> Iterator[np.ndarray]:
    import soundfile as sf
    import soxr

    with open(path, "rb") as fh, sf.SoundFile(fh) as f:
        if f.frames == 0:
            raise AudioDecodeError(path, "zero-length audio (no samples)")
        resampler = None if f.samplerate == SAMPLE_RATE else soxr.ResampleStream(
            f.samplerate, SAMPLE_RATE, 1, dtype="float32"
        )
        block = max(1, int(block_seconds * f.samplerate))
        while True:
            data = f.read(block, dtype="float32", always_2d=True)
            last = len(data) < block
            mono = _to_mono(data)
            if resampler is not None:
                mono = resampler.resample_chunk(mono, last=last)
            if len(mono):
                yield mono
            if last:
                return


def _stream_av(path: Path, block_seconds: float) -> Iterator[np.ndarray]:
    import av

    fh = open(path, "rb")  # a file object: names that are not UTF-8 reach ffmpeg intact
    try:
        container = av.open(fh)
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        fh.close()
        raise AudioDecodeError(path, f"not an audio file or unsupported format ({exc.__class__.__name__})") from None
    with fh, container:
        if not container.streams.audio:
            raise AudioDecodeError(path, "the file has no audio stream")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        pending: list[np.ndarray] = []
        pending_len, block, total = 0, int(block_seconds * SAMPLE_RATE), 0

        def frames() -> Iterator[np.ndarray]:
            try:
                for frame in container.decode(stream):
                    for out in resampler.resample(frame):
                        yield out.to_ndarray().reshape(-1)
                for out in resampler.resample(None):
                    yield out.to_ndarray().reshape(-1)
            except av.error.FFmpegError as exc:
                raise AudioDecodeError(path, f"corrupt audio data ({exc})") from None

        for samples in frames():
            pending.append(samples)
            pending_len += len(samples)
            if pending_len >= block:
                out = np.concatenate(pending)
                total += len(out)
                yield out
                pending, pending_len = [], 0
        if pending_len:
            total += pending_len
            yield np.concatenate(pending)
        if total == 0:
            raise AudioDecodeError(path, "zero-length audio (no samples decoded)")


MAX_AMPLITUDE = 1e6  # a float sample beyond this is refused (stream_audio)


def stream_audio(path: str | Path, block_seconds: float = 30.0) -> Iterator[np.ndarray]:
    """Yield consecutive 16 kHz mono float32 blocks of about ``block_seconds`` each. AudioDecodeError for a file
    that cannot be decoded, holds no samples, or holds samples that are not numbers (NaN or infinite: a float WAV
    can store them, and they would poison every log-mel frame of their window)."""
    path = Path(path)
    _check_file(path)
    for block in _decoded_blocks(path, block_seconds):
        if not np.isfinite(block).all():
            raise AudioDecodeError(path, "the audio holds samples that are not numbers (NaN or infinite)")
        # full scale is 1; far beyond it a window's power spectrum overflows float32 (a 400-sample frame sums to
        # 400 |x|, squared: above 3.4e38 from |x| ~ 4.6e16), and its log-mel frames are no longer numbers
        if len(block) and float(np.abs(block).max()) > MAX_AMPLITUDE:
            raise AudioDecodeError(path, f"the audio holds samples beyond +-{MAX_AMPLITUDE:g} (full scale is 1): "
                                         "not audio as stored, or a wrong sample format")
        yield block


def _decoded_blocks(path: Path, block_seconds: float) -> Iterator[np.ndarray]:
    """The file's 16 kHz mono float32 blocks, through libsndfile where it reads the file, else PyAV (ffmpeg)."""
    import soundfile as sf

    try:
        with open(path, "rb") as fh, sf.SoundFile(fh):
            pass
        use_soundfile = True
    except (sf.LibsndfileError, RuntimeError, TypeError):
        use_soundfile = False
    if use_soundfile:
        try:
            yield from _stream_soundfile(path, block_seconds)
            return
        except sf.LibsndfileError as exc:
            raise AudioDecodeError(path, f"corrupt audio data ({exc})") from None
    yield from _stream_av(path, block_seconds)


def load_audio(path: str | Path) -> np.ndarray:
    """The whole file as one 16 kHz mono float32 array."""
    return np.concatenate(list(stream_audio(path)))


def audio_duration(samples: np.ndarray) -> float:
    """Seconds of audio in a 16 kHz array."""
    return len(samples) / SAMPLE_RATE


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """16-bit PCM wav (what the data builders write)."""
    import soundfile as sf

    sf.write(str(path), np.clip(samples, -1.0, 1.0), sample_rate, subtype="PCM_16")


def is_audio_name(path: Path) -> bool:
    """Whether ``path``'s suffix (in any case: ``.WAV`` too) is one of ``AUDIO_EXTENSIONS``."""
    return path.suffix.lower() in AUDIO_EXTENSIONS


def probe_audio(path: Path) -> str | None:
    """None when the audio layer can decode ``path``, else why not (a few words). Cheap: libsndfile reads its
    header, else ffmpeg (PyAV) probes the container's header for an audio stream, so a folder's ``.ts``,
    ``.avi``, ``.ac3``, ``.mpg``, ``.3gp``, ``.mka`` or ``.w64`` recordings are found by content, whatever
    their suffix, and a text file, an image or a video without sound is told apart."""
    import soundfile as sf

    try:
        with open(path, "rb") as fh:
            sf.info(fh)
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):
        pass
    import av

    try:
        with open(path, "rb") as fh, av.open(fh, metadata_errors="ignore") as container:
            if container.streams.audio:
                return None
            kinds = sorted({s.type for s in container.streams if s.type})
            return f"no audio stream ({', '.join(kinds)} only)" if kinds else "no audio stream"
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError):  # before OSError: some FFmpegErrors are both
        return "not a format the audio layer reads"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
