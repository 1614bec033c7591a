"""A file being transcribed: its cursor (where it is, what it has produced), opened from a path, and what a
run reads off it (its Transcript, its share of each engine call, its audio done). Both transcription loops
(``batching.transcribe``, ``continuous.transcribe_continuously``) keep their files as these."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..audio import SAMPLE_RATE, AudioDecodeError
from ..engine import DecodeStats
from .features import Span
from .options import DroppedWindow, Progress, Segment, TranscribeOptions, Transcript
from .prompts import PromptHistory
from .runner import WhisperRunner
from .tracks import first_speech_track
from .windows import WindowReader, decode_fields, in_container_time


@dataclass
class Cursor:
    """One file being decoded: where it is and what it has produced."""

    path: Path
    reader: WindowReader
    single: bool  # the file fits one window
    track_chosen: bool = False  # its audio track was chosen as the first with speech (none was asked for)
    seek: int = 0  # sample where the next window starts
    segments: list[Segment] = field(default_factory=list)
    language: str | None = None  # the file's: the fixed one, or (auto) its first decoded window's, as whisper's
    started: bool = False  # its first piece was gathered (history and fixed prompt set)
    prompt: list[int] | None = None  # fixed language: <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>]
    history: PromptHistory = field(default_factory=PromptHistory)  # the text prompt's tokens so far (prompts.py)
    seconds: float = 0.0
    decode_seconds: float = 0.0
    plain_seconds: float = 0.0
    identical: bool = True
    tokens: int = 0
    main_calls: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    done: bool = False
    retried: int = 0
    skipped: int = 0
    dropped: int = 0
    dropped_windows: list[DroppedWindow] = field(default_factory=list)
    hist: Counter = field(default_factory=Counter)  # accepted drafts per round -> rounds
    cut: int = 0  # windows whose kept decode stopped at max_new_tokens, not at end of text
    leftovers: list[Span] = field(default_factory=list)  # chunked: the parts of chunks to redo
    ceiling: float = -10.0  # the file's loudest log-mel frame: its features' floor is 8 below (features.py)
    measure: Callable[[], float] | None = None  # ``ceiling``'s pass, put off until a piece needs it (``open_cursor``)
    last_speech: float = 0.0  # word timestamps: where the file's last word so far ends (whisper's heuristics)

    def at_end(self) -> bool:
        """Whether nothing of the file is left to decode: read to its end, the seek past it, no leftover chunk."""
        return not self.leftovers and self.reader.ended and self.seek >= self.reader.known_length


def open_cursor(path: Path, options: TranscribeOptions, runner: WhisperRunner) -> Cursor:
    """The file's cursor, on the audio track asked for, else its first with speech (``first_speech_track``),
    with the file's loudest log-mel frame (whisper's floor is 8 below it): from its samples when the reader
    holds them all, else from a first pass over the file (its blocks streamed: memory stays bounded). A file of
    one window held whole (samples unfiltered: no VAD) has it found by its first window's features, which are
    all of its frames (``Span.ceiling`` None, ``batching._next_chunk``), the file's log-mel computed once as in whisper;
    measured here only if another piece of it is decoded (``ceiling_of``)."""
    track, chosen = (options.audio_track, False) if options.audio_track is not None else first_speech_track(path)
    reader = WindowReader(path, track)
    timestamps = options.timestamps or options.word_timestamps  # words need segments, as in whisper
    held = reader.whole()
    one_window = reader.is_single_window()
    cur = Cursor(path, reader, single=one_window and not timestamps, track_chosen=chosen)
    if held is not None and one_window and not options.vad_filter:
        cur.measure = lambda: runner.loudest_frame([held])
        return cur
    # A file past two windows is decoded twice (this pass, then its windows): not material, the second decode of
    # long-05.wav (288 s) took 0.04 s (as MP3 0.56 s) at load 7; all 815 s of speech-long transcribe in 28 s.
    cur.ceiling = runner.loudest_frame([held] if held is not None else reader.again())
    return cur


def ceiling_of(cur: Cursor) -> float:
    """The file's loudest log-mel frame, measured now if ``open_cursor`` put it off."""
    if cur.measure is not None:
        cur.ceiling, cur.measure = cur.measure(), None
    return cur.ceiling


def finish(cur: Cursor, compare: bool) -> Transcript:
    cur.segments.sort(key=lambda seg: seg.start)  # chunked mode may decode a leftover after later chunks
    text = " ".join(s.text for s in cur.segments).strip()
    report = cur.reader.report
    at = report.start_offset  # dropped windows count from the container's start, as the segments do
    dropped = tuple(replace(w, start=round(w.start + at, 3), end=round(w.end + at, 3)) for w in cur.dropped_windows)
    return Transcript(
        str(cur.path), text, cur.reader.known_length / SAMPLE_RATE, cur.seconds, None,
        tuple(in_container_time(cur.segments, report)),
        cur.language, cur.tokens, cur.main_calls, cur.drafted, cur.accepted, cur.decode_seconds,
        cur.plain_seconds if compare else None, cur.identical if compare else None, cur.retried, cur.skipped, cur.dropped,
        dict(sorted(cur.hist.items())), cur.cut, "length" if cur.cut else "stop", **decode_fields(report, cur.track_chosen),
        dropped_windows=dropped,
    )


def account(cur: Cursor, result, row: int, share: float) -> None:
    stats: DecodeStats = result.stats
    cur.seconds += stats.total_s * share
    cur.decode_seconds += (stats.total_s - stats.encode_s) * share
    cur.tokens += len(result.tokens[row])
    cur.main_calls += stats.row_calls * share
    cur.drafted += stats.drafted * share
    cur.accepted += stats.accepted * share
    if result.identical is not None:
        cur.identical = cur.identical and result.identical[row]
        cur.plain_seconds += result.plain_stats.total_s * share


def audio_expected(cur: Cursor) -> float:
    """Seconds the cursor's file holds: all of it once read to its end, else what its header or stream
    declares, or what was read when that is more (no declaration, or a wrong one)."""
    read = cur.reader.known_length / SAMPLE_RATE
    if cur.reader.ended:
        return read
    return max(read, cur.reader.report.declared_seconds or 0.0)


def audio_done(cur: Cursor) -> float:
    """Seconds of the file behind its cursor (chunked mode: less the leftovers still to decode)."""
    pending = sum(len(span.audio) for span in cur.leftovers)
    return max(0, min(cur.seek, cur.reader.known_length) - pending) / SAMPLE_RATE


def open_files(queue: list[Path], active: list[Cursor], options: TranscribeOptions,
               runner: WhisperRunner) -> Iterator[Transcript]:
    """Move files from ``queue`` to ``active`` as cursors (``open_cursor``) while fewer than ``batch_size`` are active;
    yields a Transcript with ``error`` set for each that cannot be decoded (the run goes on)."""
    while queue and len(active) < max(1, options.batch_size):
        path = queue.pop(0)
        t0 = time.perf_counter()
        try:
            active.append(open_cursor(path, options, runner))
        except AudioDecodeError as exc:
            yield Transcript(str(path), "", 0.0, time.perf_counter() - t0, error=exc.reason)
        except OSError as exc:  # unreadable in a way the checks did not foresee: this file fails, the run goes on
            yield Transcript(str(path), "", 0.0, time.perf_counter() - t0, error=f"cannot be read ({exc.strerror or exc})")


def progress_of(windows: int, files_done: int, finished_audio: float, rest: list[Cursor], elapsed: float) -> Progress:
    """A run's Progress: ``files_done`` files of ``finished_audio`` seconds behind it, ``rest`` still decoding."""
    return Progress(windows, files_done, finished_audio + sum(audio_done(c) for c in rest),
                    finished_audio + sum(c.reader.known_length for c in rest) / SAMPLE_RATE, elapsed,
                    finished_audio + sum(audio_expected(c) for c in rest))
