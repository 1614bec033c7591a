"""What decoding a file found besides its samples (``DecodeReport``), and the error when nothing can be had.

``pipelines.audio`` re-exports all of it. A decoder fills a ``DecodeNotes`` as it goes (where the audio starts
in its container, which track, what the header declares, blocks it had to skip, gaps it filled with silence);
``DecodeNotes.report()`` freezes it, with the truncation check once the file is read to its end. The library
never prints these: the batch writes them into each file's JSON and names damaged files in its summary.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TandemError
from .paths import display

SAMPLE_RATE = 16000  # Whisper's input rate, Hz
# a file is truncated when it decodes to less than its declared duration by more than this (seconds, or share)
SHORTFALL_SECONDS, SHORTFALL_SHARE = 0.5, 0.02
MAX_WARNINGS = 10  # damage lines kept per file; the rest are counted
NEAR_END_SECONDS = 1.0  # damage this close to the last decoded sample is the file's cut end, not a hole in it


class AudioDecodeError(TandemError, ValueError):
    """The file cannot be turned into audio samples; the message says which file and why."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path, self.reason = str(path), reason
        super().__init__(f"{display(path)}: {reason}")


@dataclass(frozen=True)
class DecodeReport:
    """What decoding one file found: where its audio starts, which track was read, and any damage."""

    seconds: float = 0.0  # seconds of 16 kHz audio produced (gaps filled with silence included)
    declared_seconds: float | None = None  # the duration its header or stream declares, where it declares one
    start_offset: float = 0.0  # seconds from the container's start to the audio's first sample (a video's lead)
    track: int = 0  # the audio stream read, 0-based among the file's audio streams
    tracks: int = 1  # audio streams in the file
    damaged_blocks: int = 0  # blocks that could not be decoded (skipped) or holes in the timeline
    filled_seconds: float = 0.0  # silence put where damaged blocks were, so later times stay in place
    truncated: bool = False  # the file ends clearly before its declared duration
    warnings: tuple[str, ...] = ()  # one line each, in the order found

    @property
    def damaged(self) -> bool:
        """Whether any of the file could not be read as its header says (warnings say how)."""
        return bool(self.warnings)

    @property
    def seconds_recovered(self) -> float:
        """Seconds of the file's own audio decoded (filled silence left out)."""
        return max(0.0, self.seconds - self.filled_seconds)


@dataclass
class DecodeNotes:
    """A decoder's running notes, frozen into a ``DecodeReport`` by ``report()``."""

    track: int = 0
    tracks: int = 1
    start_offset: float = 0.0
    declared_seconds: float | None = None
    samples: int = 0  # 16 kHz samples produced so far
    damaged_blocks: int = 0
    filled_seconds: float = 0.0
    last_damage: float | None = None  # seconds (of output) where the latest damage was found
    ended: bool = False  # read to the end of the file
    warnings: list[str] = field(default_factory=list)
    unlisted: int = 0  # damage notes past MAX_WARNINGS

    def damage(self, message: str, blocks: int = 1) -> None:
        """Note ``blocks`` damaged blocks at the current position, and why (one line; after the first
        ``MAX_WARNINGS`` only counted)."""
        self.damaged_blocks += blocks
        self.last_damage = self.samples / SAMPLE_RATE
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)
        else:
            self.unlisted += 1

    def report(self) -> DecodeReport:
        seconds = self.samples / SAMPLE_RATE
        warnings, truncated = list(self.warnings), False
        if self.unlisted:
            warnings.append(f"and {self.unlisted} more damaged blocks")
        declared = self.declared_seconds
        if self.ended and declared is not None and declared - seconds > max(SHORTFALL_SECONDS, SHORTFALL_SHARE * declared):
            truncated = self.last_damage is None or self.last_damage >= seconds - NEAR_END_SECONDS
            warnings.append(f"truncated: the file ends at {seconds:.2f} s of the {declared:.2f} s it declares"
                            if truncated else
                            f"{declared - seconds:.2f} s of the {declared:.2f} s it declares could not be decoded")
        return DecodeReport(round(seconds, 3), declared, round(self.start_offset, 3), self.track, self.tracks,
                            self.damaged_blocks, round(self.filled_seconds, 3), truncated, tuple(warnings))


def wav_declared_frames(fh) -> int | None:
    """The frames a RIFF/WAVE file's header declares (its data chunk's size over the fmt chunk's block
    alignment), read from the open binary file ``fh``; None when it is not such a file or declares no size
    (0xFFFFFFFF: a stream). libsndfile and ffmpeg count a file cut short by its length, not its header's."""
    fh.seek(0)
    head = fh.read(12)
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    align = None
    for _ in range(64):  # a WAV has a handful of chunks; a corrupt one is not followed far
        chunk = fh.read(8)
        if len(chunk) < 8:
            return None
        kind, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if kind == b"fmt ":
            fmt = fh.read(min(size, 16))
            if len(fmt) < 16:
                return None
            align = struct.unpack("<H", fmt[12:14])[0]
            fh.seek(size - len(fmt) + (size & 1), 1)
        elif kind == b"data":
            return None if not align or size == 0xFFFFFFFF else size // align
        else:
            fh.seek(size + (size & 1), 1)
    return None
