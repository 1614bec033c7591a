"""Transcript files (txt, json, srt, vtt, tsv), written atomically, with a per-file record for resuming.

For an input named ``a/b`` (``inputs.find_inputs``: relative to the folder given) and output folder
``OUT``: ``OUT/a/b.txt`` etc., then ``OUT/a/b.tandem.json`` (the record: the input's absolute path, size
and mtime, the run's signature, status, outputs). Outputs are written to a temporary name and renamed into
place with the user's umask; the record is written last. A re-run skips a file whose record names the same
input, says done with the same signature and source, and whose outputs all exist; anything else is redone.
One run writes to a folder at a time (``OUT/.tandem.lock``, held while it runs); failures are appended to
``OUT/failures.tsv``, earlier runs' lines kept; the files of the folders given that are not audio are listed
in ``OUT/skipped.tsv`` (this run's list).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import TandemError
from ..paths import FILE_MODE, write_atomic
from .inputs import Input, display
from .options import Segment, Transcript
from .subtitles import SubtitleOptions, cues

FORMATS = ("txt", "json", "srt", "vtt", "tsv")
RECORD_SUFFIX = ".tandem.json"


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def timestamp(seconds: float) -> str:
    """``HH:MM:SS.mmm`` (WebVTT's form) for a time in seconds, rounded to the millisecond."""
    return _clock(seconds, ".")


def format_srt(segments: tuple[Segment, ...], subtitles: SubtitleOptions = SubtitleOptions()) -> str:
    """SubRip: a cue per segment, or from the segments' words (``subtitles.cues``, whisper's layout)."""
    blocks = [f"{i}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{text}\n" for i, (a, b, text) in enumerate(cues(segments, subtitles), 1)]
    return "\n".join(blocks)


def format_vtt(segments: tuple[Segment, ...], subtitles: SubtitleOptions = SubtitleOptions()) -> str:
    """WebVTT, cues as ``format_srt``'s."""
    blocks = [f"{_clock(a, '.')} --> {_clock(b, '.')}\n{text}\n" for a, b, text in cues(segments, subtitles)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def format_tsv(segments: tuple[Segment, ...]) -> str:
    rows = [f"{int(round(s.start * 1000))}\t{int(round(s.end * 1000))}\t{s.text}" for s in segments]
    return "start\tend\ttext\n" + "".join(r + "\n" for r in rows)


def format_json(t: Transcript) -> str:
    data = asdict(t)
    data["path"] = display(t.path)  # valid UTF-8 whatever bytes the name has
    data["segments"] = [_segment_json(s) for s in t.segments]
    if not t.dropped_windows:  # named only when there are some: other files' json stays as it was
        del data["dropped_windows"]
    return json.dumps(data, ensure_ascii=False, indent=1)


def _segment_json(s: Segment) -> dict:
    """A segment as JSON, with ``words`` (whisper's: start, end, word, probability) only when it has some, and
    ``language``, ``language_probability`` only when detected (``language=None``, auto)."""
    data = asdict(s)
    if not s.words:
        del data["words"]
    if s.language is None:
        del data["language"], data["language_probability"]
    return data


def render(t: Transcript, fmt: str, subtitles: SubtitleOptions = SubtitleOptions()) -> str:
    """``t`` in format ``fmt``; ``subtitles`` lays out srt and vtt cues from words (whisper's options)."""
    if fmt == "txt":
        return t.text + "\n"
    if fmt == "json":
        return format_json(t)
    if fmt == "tsv":
        return format_tsv(t.segments)
    return {"srt": format_srt, "vtt": format_vtt}[fmt](t.segments, subtitles)


class OutputError(TandemError, RuntimeError):
    """The output folder cannot be used (not a folder, not writable, another run holds it)."""


def run_signature(pair_name: str, options, subtitles: SubtitleOptions = SubtitleOptions()) -> str:
    """What changes the output: the pair and the decoding options (not batch size or compare)."""
    keys = {"pair": pair_name, "language": options.language, "task": options.task, "dtype": options.dtype,
            "assistant": options.use_assistant, "timestamps": options.timestamps, "max_new": options.max_new_tokens,
            "long_form": options.long_form, "temperature": list(options.temperature),
            "thresholds": [options.compression_ratio_threshold, options.logprob_threshold, options.no_speech_threshold]}
    if options.vad_filter:  # only when on: folders written before the filter existed keep their signature
        keys["vad"] = "silero"
    if options.device != "cpu":  # likewise: a GPU's kernels (and its default dtype) give other bits than the CPU's
        keys["device"] = options.device
    if getattr(options, "audio_track", 0):  # another track is another transcript
        keys["audio_track"] = options.audio_track
    if getattr(options, "word_timestamps", False):  # words, and segments bounded by them
        keys["words"] = [options.prepend_punctuations, options.append_punctuations]
    if subtitles.any:  # another layout of the srt and vtt cues
        keys["subtitles"] = [subtitles.highlight_words, subtitles.max_line_width, subtitles.max_line_count,
                             subtitles.max_words_per_line]
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]


class OutputTree:
    """Where each input's outputs go: ``OUT/<its name>.<format>`` (names from ``inputs.find_inputs``)."""

    LOCK = ".tandem.lock"

    def __init__(self, out_dir: str | Path, inputs: list[Input], formats: tuple[str, ...], signature: str,
                 subtitles: SubtitleOptions = SubtitleOptions(), pair: str | None = None) -> None:
        self.out = Path(out_dir)
        self.formats, self.signature, self.subtitles, self.pair = formats, signature, subtitles, pair
        self.names = {i.path: i.name for i in inputs}
        self._lock_fd: int | None = None

    def open(self) -> None:
        """Make the folder if needed, check that it can be written, and take its lock. Raises OutputError
        with one sentence (before any model loads)."""
        import fcntl

        out = display(self.out)
        if self.out.exists() and not self.out.is_dir():
            raise OutputError(f"--out {out} exists and is not a folder")
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.out / self.LOCK, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:
            raise OutputError(f"--out {out} cannot be created or written ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 400, 0).decode("utf-8", "replace").strip() or "another run"
            os.close(fd)
            raise OutputError(f"--out {out} is in use by {holder}; wait for it to finish or choose another folder") from None
        try:  # who holds it, for a second run's message; a full disk leaves it empty (the lock itself holds)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"tandem run pid {os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        except OSError:
            pass
        self._lock_fd = fd

    def close(self) -> None:
        """Release the folder's lock."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def base(self, source: Path) -> Path:
        name = self.names.get(source)
        return self.out / (name if name is not None else Path(source.name).with_suffix(""))

    def record_path(self, source: Path) -> Path:
        return self.base(source).with_name(self.base(source).name + RECORD_SUFFIX)

    def _source_id(self, source: Path) -> dict:
        st = source.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def is_done(self, source: Path) -> bool:
        record = self.record_path(source)
        try:
            meta = json.loads(record.read_text())
            same_source = meta["path"] == os.path.abspath(source) and meta["source"] == self._source_id(source)
        except (OSError, ValueError, KeyError):
            return False
        # outputs sit beside their record: found by name wherever the run starts from (records before 2026-12-05
        # held paths relative to that run's working folder)
        outputs = [record.parent / Path(p).name for p in meta.get("outputs", [])]
        return (meta.get("status") == "done" and meta.get("signature") == self.signature and same_source
                and all(p.is_file() for p in outputs) and {p.suffix[1:] for p in outputs} >= set(self.formats))

    def made_otherwise(self, sources) -> list[tuple[Path, str | None]]:
        """The inputs this run would overwrite: a record says done, for the same unchanged source, under another
        signature (another pair, dtype or decoding options). Each as (source, the pair its record names, or
        None for a record written before records named their pair)."""
        found = []
        for source in sources:
            try:
                meta = json.loads(self.record_path(source).read_text())
                same_source = meta["path"] == os.path.abspath(source) and meta["source"] == self._source_id(source)
            except (OSError, ValueError, KeyError):
                continue
            if same_source and meta.get("status") == "done" and meta.get("signature") != self.signature:
                found.append((source, meta.get("pair")))
        return found

    def write(self, t: Transcript) -> list[Path]:
        """Outputs first, record last: an interrupted write leaves no record, so the file is redone."""
        source = Path(t.path)
        written = []
        if t.ok:
            for fmt in self.formats:
                base = self.base(source)
                path = base.with_name(f"{base.name}.{fmt}")
                write_atomic(path, render(t, fmt, self.subtitles))
                written.append(path)
        try:
            source_id = self._source_id(source)
        except OSError:
            source_id = None
        meta = {"source": source_id, "path": os.path.abspath(source), "signature": self.signature, "pair": self.pair,
                "status": "done" if t.ok else "failed", "error": t.error, "outputs": [p.name for p in written]}
        write_atomic(self.record_path(source), json.dumps(meta, indent=1))
        return written

    def add_failures(self, failed: list[Transcript]) -> Path:
        """Append this run's failures to ``failures.tsv`` (path, reason, when), keeping earlier lines."""
        path = self.out / "failures.tsv"
        try:
            old = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            old = "path\treason\ttime\n"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        clean = lambda text: " ".join(str(text).split())  # noqa: E731  (one line, no tabs)
        new = "".join(f"{clean(display(t.path))}\t{clean(t.error)}\t{stamp}\n" for t in failed)
        write_atomic(path, old + new)
        return path

    def note_skipped(self, skipped) -> Path | None:
        """``skipped.tsv`` (path, reason): the files of the folders given that this run found not to be audio
        (``inputs.Skipped``); an earlier run's list is replaced, and removed when there are none."""
        path = self.out / "skipped.tsv"
        if not skipped:
            path.unlink(missing_ok=True)
            return None
        clean = lambda text: " ".join(str(text).split())  # noqa: E731  (one line, no tabs)
        write_atomic(path, "path\treason\n" + "".join(f"{clean(display(s.path))}\t{clean(s.reason)}\n" for s in skipped))
        return path
