"""Decode any audio (or the audio track of a video) to 16 kHz mono float32.

soundfile (libsndfile: wav, flac, ogg/vorbis, opus) is tried first; PyAV (ffmpeg: mp3, m4a, mp4, webm,
anything else, a chosen audio track: ``audio_av``) second, and where libsndfile stops on damage or reads
nothing from a file that holds bytes past its header. MP3 goes to ffmpeg though libsndfile reads it: its
mpg123 resyncs past a damaged frame without a word, where ffmpeg fails the frame, which is counted
(``HIDES_DAMAGE``). Resampling is soxr's. Long files can be streamed in blocks so memory stays bounded
(``stream_audio``, whose ``report`` is a ``DecodeReport``: where the audio starts in its container, which
track, damaged blocks, truncation). A file with no audio to be had is an ``AudioDecodeError`` whose message
names the file and the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .audio_av import stream_av
from .audio_report import SAMPLE_RATE, AudioDecodeError, DecodeNotes, DecodeReport, wav_declared_frames
from .paths import display

__all__ = ["AUDIO_EXTENSIONS", "MAX_AMPLITUDE", "SAMPLE_RATE", "AudioDecodeError", "AudioStream", "DecodeReport",
           "audio_duration", "decode_audio", "is_audio_name", "load_audio", "probe_audio", "stream_audio", "write_wav"]
# Extensions offered when a folder is scanned; any other file can still be passed explicitly.
AUDIO_EXTENSIONS = frozenset(
    {".wav", ".flac", ".mp3", ".ogg", ".opus", ".oga", ".m4a", ".aac", ".mp4", ".m4v", ".mov", ".mkv",
     ".webm", ".wma", ".aiff", ".aif", ".caf"}
)


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


# libsndfile formats read by ffmpeg instead: mpg123 (libsndfile's MP3 decoder) skips a frame it cannot parse
# and resyncs on the next without an error (a 400-byte damaged stretch of a 10 s MP3 reads as 9.90 s, told
# nowhere); ffmpeg fails that packet, so the file is marked damaged (``audio_av``)
HIDES_DAMAGE = frozenset({"MP3"})


class _NoFrames(Exception):
    """libsndfile's header says the file holds no samples (PyAV reads it to its end instead)."""


def _stream_soundfile(path: Path, block_seconds: float, notes: DecodeNotes) -> Iterator[np.ndarray]:
    import soundfile as sf
    import soxr

    with open(path, "rb") as fh, sf.SoundFile(fh) as f:
        if f.frames == 0:
            raise _NoFrames
        declared = None
        if f.format == "WAV":
            with open(path, "rb") as header:  # apart: libsndfile reads through ``fh`` at its own position
                declared = wav_declared_frames(header)
        notes.declared_seconds = max(f.frames, declared or 0) / f.samplerate
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
                notes.samples += len(mono)
                yield mono
            if last:
                notes.ended = True
                return


MAX_AMPLITUDE = 1e6  # a float sample beyond this is refused (stream_audio)


class AudioStream(Iterator[np.ndarray]):
    """A file's 16 kHz mono float32 blocks (``stream_audio``); ``report`` says what decoding found so far,
    all of it once the blocks are exhausted."""

    def __init__(self, path: Path, block_seconds: float, track: int) -> None:
        self._notes = DecodeNotes(track=track)
        self._blocks = _checked_blocks(path, block_seconds, self._notes)

    def __next__(self) -> np.ndarray:
        return next(self._blocks)

    def close(self) -> None:
        self._blocks.close()

    @property
    def report(self) -> DecodeReport:
        return self._notes.report()


def stream_audio(path: str | Path, block_seconds: float = 30.0, track: int = 0) -> AudioStream:
    """Consecutive 16 kHz mono float32 blocks of about ``block_seconds`` each, of the file's audio track
    ``track`` (0-based among its audio streams). AudioDecodeError for a file that cannot be decoded, holds no
    samples, or holds samples that are not numbers (NaN or infinite: a float WAV can store them, and they would
    poison every log-mel frame of their window). Damage is decoded around and told in the stream's ``report``."""
    if track < 0:
        raise ValueError(f"track must be 0 or more, not {track}")
    return AudioStream(Path(path), block_seconds, track)


def _checked_blocks(path: Path, block_seconds: float, notes: DecodeNotes) -> Iterator[np.ndarray]:
    _check_file(path)
    for block in _decoded_blocks(path, block_seconds, notes):
        if not np.isfinite(block).all():
            raise AudioDecodeError(path, "the audio holds samples that are not numbers (NaN or infinite)")
        # full scale is 1; far beyond it a window's power spectrum overflows float32 (a 400-sample frame sums to
        # 400 |x|, squared: above 3.4e38 from |x| ~ 4.6e16), and its log-mel frames are no longer numbers
        if len(block) and float(np.abs(block).max()) > MAX_AMPLITUDE:
            raise AudioDecodeError(path, f"the audio holds samples beyond +-{MAX_AMPLITUDE:g} (full scale is 1): "
                                         "not audio as stored, or a wrong sample format")
        yield block


def _decoded_blocks(path: Path, block_seconds: float, notes: DecodeNotes) -> Iterator[np.ndarray]:
    """The file's 16 kHz mono float32 blocks, through libsndfile where it reads the file (track 0: it knows
    one) and would tell its damage (a format not in ``HIDES_DAMAGE``), else PyAV (ffmpeg). Where libsndfile
    stops on damaged data, PyAV goes on from the same sample; where its header says no samples, PyAV reads
    the file to its end."""
    import soundfile as sf

    use_soundfile = notes.track == 0
    if use_soundfile:
        try:
            with open(path, "rb") as fh, sf.SoundFile(fh) as f:
                use_soundfile = f.format not in HIDES_DAMAGE
        except (sf.LibsndfileError, RuntimeError, TypeError):
            use_soundfile = False
    if use_soundfile:
        try:
            yield from _stream_soundfile(path, block_seconds, notes)
            return
        except _NoFrames:
            yield from _header_says_empty(path, block_seconds, notes)
            return
        except sf.LibsndfileError:  # damaged data: ffmpeg decodes around it, from where libsndfile stopped
            done, notes.samples = notes.samples, 0
            yield from _skip(stream_av(path, block_seconds, notes), done)
            return
    yield from stream_av(path, block_seconds, notes)


def _header_says_empty(path: Path, block_seconds: float, notes: DecodeNotes) -> Iterator[np.ndarray]:
    """A file whose header declares no samples (a recorder that crashed before writing the size): what PyAV
    finds past the header, marked damaged; "zero-length" when it finds nothing."""
    try:
        blocks = stream_av(path, block_seconds, notes)
        first = next(blocks)
    except (AudioDecodeError, StopIteration):
        raise AudioDecodeError(path, "zero-length audio (no samples)") from None
    notes.warnings.append("the header declares no audio (a recording not closed properly?); read to the end "
                          "of the file instead")
    notes.declared_seconds = None  # the header's 0 is wrong, and ffmpeg's guess comes from the file's length
    yield first
    yield from blocks


def _skip(blocks: Iterator[np.ndarray], samples: int) -> Iterator[np.ndarray]:
    """``blocks`` less their first ``samples`` samples."""
    for block in blocks:
        if samples >= len(block):
            samples -= len(block)
            continue
        yield block[samples:]
        samples = 0


def load_audio(path: str | Path, track: int = 0) -> np.ndarray:
    """The whole file (its audio track ``track``) as one 16 kHz mono float32 array."""
    return decode_audio(path, track)[0]


def decode_audio(path: str | Path, track: int = 0) -> tuple[np.ndarray, DecodeReport]:
    """The whole file as one 16 kHz mono float32 array, and what decoding it found (``DecodeReport``)."""
    stream = stream_audio(path, track=track)
    samples = np.concatenate(list(stream))
    return samples, stream.report


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
