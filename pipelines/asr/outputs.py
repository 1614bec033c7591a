"""Transcript files (txt, json, srt, vtt, tsv), written atomically, with a per-file record for resuming.

For an input named ``a/b`` (``inputs.find_inputs``: relative to the folder given) and output folder
``OUT``: ``OUT/a/b.txt`` etc., then ``OUT/a/b.tandem.json`` (the record: the input's absolute path, size
and mtime, the run's pair and signature, status, outputs, and the result itself: ``records.result_data``).
Outputs are written to a temporary name and renamed into place with the user's umask; the record is written
last. A re-run plans each input from its record (``OutputTree.plan``): done (same signature, same unchanged
input, outputs all there), formats written from the stored result without decoding (``fill``: another
``--output-format``), decoded again with a reason (the stored result lacks the timestamps srt/vtt/tsv need,
or the record predates stored results), refused (``other``: another pair or decoding options), or decoded.
One run writes to a folder at a time (``OUT/.tandem.lock``, held while it runs); failures are appended to
``OUT/failures.tsv``, earlier runs' lines kept; the files of the folders given that are not audio are listed
in ``OUT/skipped.tsv`` (this run's list).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import TandemError
from ..paths import FILE_MODE, write_atomic
from .inputs import Input, display
from .options import Segment, TranscribeOptions, Transcript
from .records import is_timed, result_data, transcript_from_data
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
    return json.dumps(result_data(t), ensure_ascii=False, indent=1)


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
            "thresholds": [options.compression_ratio_threshold, options.logprob_threshold, options.no_speech_threshold],
            # the encoder's input: openai/whisper's log-mel of the file (features.py) since 2026-12-07; a record
            # made from transformers' per-window features before it was decoded from other input: redone. Chunked
            # long-form's chunks read as followed by silence (``Span.silence_after``) since the same day
            "features": "whisper-log-mel" + ("+silent-chunk-ends" if options.long_form == "chunked" else "")}
    if options.vad_filter:  # only when on: folders written before the filter existed keep their signature
        keys["vad"] = "silero"
    if options.device != "cpu":  # likewise: a GPU's kernels (and its default dtype) give other bits than the CPU's
        keys["device"] = options.device
    if getattr(options, "audio_track", None) is not None:  # a track asked for, 0 included: the automatic
        keys["audio_track"] = options.audio_track  # choice (None, the first with speech) may read another
    # prompts and search (issue 52's options), each only when set: records written before they existed keep theirs
    decoding = {"initial_prompt": None, "hotwords": None, "prefix": None, "condition_on_previous_text": False,
                "beam_size": None, "patience": None, "length_penalty": None, "best_of": None}
    for name, default in decoding.items():
        if getattr(options, name, default) != default:
            keys[name] = getattr(options, name)
    if getattr(options, "condition_on_previous_text", False):  # when the history starts anew
        keys["prompt_reset_on_temperature"] = options.prompt_reset_on_temperature
    if getattr(options, "word_timestamps", False):  # words, and segments bounded by them
        keys["words"] = [options.prepend_punctuations, options.append_punctuations]
    if subtitles.any:  # another layout of the srt and vtt cues
        keys["subtitles"] = [subtitles.highlight_words, subtitles.max_line_width, subtitles.max_line_count,
                             subtitles.max_words_per_line]
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]


TIMED = ("srt", "vtt", "tsv")  # the formats that need Whisper's timestamps (the command turns them on)


@dataclass(frozen=True)
class Plan:
    """What a run does with one input, from its record (``OutputTree.plan``)."""

    action: str  # "decode" (no finished record), "done", "fill" (write ``missing`` from the stored result),
    #              "again" (decode again, ``why``: the stored result cannot give the formats), "other" (the
    #              record was made with another pair or other options: refused unless forced)
    missing: tuple[str, ...] = ()  # the formats asked for that are not there
    pair: str | None = None  # "other": the pair its record names (None for records before they named one)
    why: str = ""  # "again": why, in a few words


def _stored(meta: dict) -> Transcript | None:
    """The result a record keeps, or None (a record from before results were kept, or not a result)."""
    try:
        return transcript_from_data(meta["result"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


class OutputTree:
    """Where each input's outputs go: ``OUT/<its name>.<format>`` (names from ``inputs.find_inputs``)."""

    LOCK = ".tandem.lock"

    def __init__(self, out_dir: str | Path, inputs: list[Input], formats: tuple[str, ...], signature: str,
                 subtitles: SubtitleOptions = SubtitleOptions(), pair: str | None = None,
                 options: TranscribeOptions | None = None) -> None:
        """``options`` (with ``pair``): the run's, so that records keep each result for formats asked for
        later (without them, records hold no result)."""
        self.out = Path(out_dir)
        self.formats, self.signature, self.subtitles, self.pair = formats, signature, subtitles, pair
        self.options = options
        # the signature of a run that differed only in --timestamps (which srt/vtt/tsv turn on): its record serves
        # this run when its result has the timestamps this run needs (``plan``); records of any version name it
        self.retimed = (run_signature(pair, replace(options, timestamps=not options.timestamps), subtitles)
                        if options and pair else None)
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

    def _record(self, source: Path) -> dict | None:
        """The record of ``source`` when it names this very input, unchanged since (None otherwise)."""
        try:
            meta = json.loads(self.record_path(source).read_text())
            same = meta["path"] == os.path.abspath(source) and meta["source"] == self._source_id(source)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return meta if same and isinstance(meta, dict) else None

    def _have(self, source: Path, meta: dict) -> dict[str, str]:
        """The outputs the record names that are still there, by format (outputs sit beside their record:
        found by name wherever the run starts from; records before 2026-12-05 held relative paths)."""
        folder = self.record_path(source).parent
        names = [Path(p).name for p in meta.get("outputs", [])]
        return {Path(n).suffix[1:]: n for n in names if (folder / n).is_file()}

    def plan(self, source: Path) -> Plan:
        """What this run does with ``source``, from its record (``Plan``): decode it, nothing (done), write the
        missing formats from the stored result, decode it again (saying why), or refuse (made otherwise)."""
        meta = self._record(source)
        if meta is None or meta.get("status") != "done":
            return Plan("decode")
        missing = tuple(f for f in self.formats if f not in self._have(source, meta))
        same = meta.get("signature") == self.signature
        if not same and not (self.retimed and meta.get("signature") == self.retimed):
            return Plan("other", pair=meta.get("pair"))  # another pair, dtype or decoding options
        if same and not missing:
            return Plan("done")
        if _stored(meta) is None:
            return Plan("again", missing, why=f"its record keeps no result to write {', '.join(missing) or 'from'}"
                                              f"{' from' if missing else ''} (written by an earlier version)")
        if self.options and self.options.timestamps and not meta.get("timed"):
            needs = ", ".join(f for f in self.formats if f in TIMED) or "--timestamps"
            return Plan("again", missing, why=f"{needs} need{'' if ',' in needs else 's'} timestamps, and the "
                                              "result its record keeps was decoded without them")
        return Plan("fill", missing) if missing else Plan("done")

    def fill(self, source: Path, formats: tuple[str, ...]) -> list[Path]:
        """Write ``formats`` of ``source`` from the result its record keeps (no decoding), then the record
        naming them too. OutputError when the record no longer holds a result (changed since planned)."""
        meta = self._record(source)
        stored = _stored(meta) if meta else None
        if stored is None:
            raise OutputError(f"the record of {display(source)} changed during the run; run the same command again")
        written = [self._write_format(source, stored, fmt) for fmt in formats]
        names = list(dict.fromkeys([*meta.get("outputs", []), *(p.name for p in written)]))
        write_atomic(self.record_path(source), json.dumps({**meta, "outputs": names}, indent=1))
        return written

    def _write_format(self, source: Path, t: Transcript, fmt: str) -> Path:
        base = self.base(source)
        path = base.with_name(f"{base.name}.{fmt}")
        write_atomic(path, render(t, fmt, self.subtitles))
        return path

    def write(self, t: Transcript) -> list[Path]:
        """Outputs first, record last: an interrupted write leaves no record, so the file is redone. The formats
        its earlier record named are written again too (every output beside a record comes from the result it
        keeps), and the record keeps the result, for formats asked for later (``fill``)."""
        source = Path(t.path)
        earlier = self._record(source)
        formats = tuple(dict.fromkeys([*self.formats, *(self._have(source, earlier) if earlier else ())]))
        written = [self._write_format(source, t, fmt) for fmt in formats] if t.ok else []
        try:
            source_id = self._source_id(source)
        except OSError:
            source_id = None
        meta = {"source": source_id, "path": os.path.abspath(source), "signature": self.signature, "pair": self.pair,
                "status": "done" if t.ok else "failed", "error": t.error, "outputs": [p.name for p in written]}
        if t.ok and self.options is not None:
            meta.update(timed=is_timed(t, self.options), result=result_data(t))
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
