"""Audio windows: streaming 30 s windows from a file, the energy detector (frame RMS, voiced frames, silence)
and where to cut a chunk at a pause."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, DecodeReport, stream_audio
from .features import HALF as CONTEXT
from .options import CHUNK_MAX_SECONDS, CHUNK_MIN_SECONDS, SILENCE_RMS, WINDOW, WINDOW_SECONDS, Segment


class WindowReader:
    """Streams a file (its audio track ``track``) and serves 30 s windows from any later start, with the
    ``CONTEXT`` samples around them that their first and last log-mel frames read; samples before that are
    dropped."""

    def __init__(self, path: Path, track: int = 0) -> None:
        self._path, self._track = path, track
        self._blocks = stream_audio(path, block_seconds=WINDOW_SECONDS, track=track)
        self._buf = np.zeros(0, dtype=np.float32)
        self._start = 0  # sample index of _buf[0]
        self._ended = False
        self._fill(WINDOW + CONTEXT)  # decode errors surface here, before any work is done

    def _fill(self, end: int) -> None:
        while not self._ended and self._start + len(self._buf) < end:
            try:
                self._buf = np.concatenate([self._buf, next(self._blocks)])
            except StopIteration:
                self._ended = True

    @property
    def known_length(self) -> int:
        """Samples read so far (the whole file once ``ended``)."""
        return self._start + len(self._buf)

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def report(self) -> DecodeReport:
        """What decoding found so far (where the audio starts in its container, its track, damage): all of it
        once ``ended``."""
        return self._blocks.report

    def window(self, start: int) -> np.ndarray:
        self._fill(start + WINDOW + CONTEXT)
        drop = max(0, start - CONTEXT - self._start)
        self._buf, self._start = self._buf[drop:], self._start + drop
        return self._buf[start - self._start: start - self._start + WINDOW]

    def around(self, start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """The samples just before and after the ``length`` samples from ``start`` (a window this reader served
        last, or a part of it): up to ``CONTEXT`` each, fewer at the file's ends."""
        at = start - self._start
        return self._buf[max(0, at - CONTEXT):max(0, at)], self._buf[at + length:at + length + CONTEXT]

    def whole(self) -> np.ndarray | None:
        """The file's samples when this reader holds all of them (nothing dropped yet, and the file read to its
        end, which a file of under two windows is here), else None."""
        if self._start == 0 and self.known_length < 2 * WINDOW:
            self._fill(self.known_length + 1)
        return self._buf if self._ended and self._start == 0 else None

    def again(self) -> Iterator[np.ndarray]:
        """The file's samples from its start once more, as blocks (a second pass: memory stays bounded)."""
        return iter(stream_audio(self._path, block_seconds=WINDOW_SECONDS, track=self._track))

    def is_single_window(self) -> bool:
        self._fill(WINDOW + 1)
        return self._ended and self.known_length <= WINDOW


def in_container_time(segments: list[Segment], report: DecodeReport) -> list[Segment]:
    """``segments`` (times from the decoded audio's first sample) moved by where that sample sits in its
    container (``report.start_offset``: a video whose audio starts 5 s in), as a player and its subtitles count."""
    offset = report.start_offset
    if not offset:
        return segments
    return [replace(s, start=round(s.start + offset, 3), end=round(s.end + offset, 3),
                    words=tuple(replace(w, start=round(w.start + offset, 3), end=round(w.end + offset, 3)) for w in s.words))
            for s in segments]


def decode_fields(report: DecodeReport, track_chosen: bool = False) -> dict:
    """A Transcript's fields from the decoding's report: offset, track (named when the file has several, and
    whether it was chosen as the first with speech), damage."""
    return {"start_offset": report.start_offset, "audio_track": report.track if report.tracks > 1 else None,
            "audio_tracks": report.tracks, "audio_track_chosen": track_chosen and report.tracks > 1, "damaged": report.damaged, "truncated": report.truncated,
            "decode_warnings": report.warnings,
            "seconds_recovered": report.seconds_recovered if report.damaged else None}


def frame_rms(audio: np.ndarray) -> np.ndarray:
    """Root mean square of each whole 10 ms frame, in ``audio``'s dtype."""
    hop = SAMPLE_RATE // 100
    n = len(audio) // hop
    return np.sqrt(np.mean(np.square(audio[: n * hop].reshape(n, hop)), axis=1))


def voiced_frames(audio: np.ndarray) -> np.ndarray:
    """Per 10 ms frame: louder than 5% of the window's loud frames (95th percentile RMS) and than 1e-3 RMS."""
    rms = frame_rms(audio)
    if len(rms) == 0:
        return np.zeros(0, dtype=bool)
    return rms > max(1e-3, 0.05 * float(np.percentile(rms, 95)))


def quiet_cut(window: np.ndarray, min_seconds: float = CHUNK_MIN_SECONDS, max_seconds: float = CHUNK_MAX_SECONDS) -> int:
    """Where to end a chunk that starts at ``window[0]`` when the file goes on past the window: in the
    middle of the latest of the quietest pauses after ``min_seconds`` (samples from the window's start).

    Frame energy r_i is the RMS of 10 ms frame i, smoothed over 21 frames: e_i = mean(r_{i-10..i+10}).
    Frames with e_i <= 1.5 * min(e) + 1e-4 between min_seconds and max_seconds (and 0.1 s before the
    window's end) are quiet; the cut goes mid-way through the last run of quiet frames (later = fewer,
    longer chunks)."""
    hop = SAMPLE_RATE // 100
    n = len(window) // hop
    lo, hi = int(min_seconds * 100), min(n - 10, int(max_seconds * 100))
    if hi <= lo:
        return len(window)
    energy = np.convolve(frame_rms(window.astype(np.float64)), np.ones(21) / 21, mode="same")[lo:hi]
    quiet = np.flatnonzero(energy <= 1.5 * float(energy.min()) + 1e-4)
    last = first = int(quiet[-1])
    while first > 0 and energy[first - 1] <= 1.5 * float(energy.min()) + 1e-4:
        first -= 1
    return (lo + (first + last) // 2) * hop


def is_silent_window(audio: np.ndarray) -> bool:
    return float(np.sqrt(np.mean(np.square(audio)))) < SILENCE_RMS
