"""Transcript files (txt, json, srt, vtt, tsv), written atomically, with a per-file record for resuming.

For an input ``a/b.wav`` and output folder ``OUT``: ``OUT/a/b.txt`` etc., then ``OUT/a/b.tandem.json``
(the record: source size and mtime, the run's signature, status, outputs). Outputs are written to a
temporary name and renamed into place; the record is written last. A re-run skips a file whose record
says done with the same signature and source, and whose outputs all exist; anything else is redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from .asr import Segment, Transcript

FORMATS = ("txt", "json", "srt", "vtt", "tsv")
RECORD_SUFFIX = ".tandem.json"


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def format_srt(segments: tuple[Segment, ...]) -> str:
    blocks = [f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text}\n" for i, s in enumerate(segments, 1)]
    return "\n".join(blocks)


def format_vtt(segments: tuple[Segment, ...]) -> str:
    blocks = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text}\n" for s in segments]
    return "WEBVTT\n\n" + "\n".join(blocks)


def format_tsv(segments: tuple[Segment, ...]) -> str:
    rows = [f"{int(round(s.start * 1000))}\t{int(round(s.end * 1000))}\t{s.text}" for s in segments]
    return "start\tend\ttext\n" + "".join(r + "\n" for r in rows)


def format_json(t: Transcript) -> str:
    data = asdict(t)
    data["segments"] = [asdict(s) for s in t.segments]
    return json.dumps(data, ensure_ascii=False, indent=1)


def render(t: Transcript, fmt: str) -> str:
    if fmt == "txt":
        return t.text + "\n"
    if fmt == "json":
        return format_json(t)
    return {"srt": format_srt, "vtt": format_vtt, "tsv": format_tsv}[fmt](t.segments)


def write_atomic(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run_signature(pair_name: str, options) -> str:
    """What changes the output: the pair and the decoding options (not batch size or compare)."""
    keys = {"pair": pair_name, "language": options.language, "task": options.task, "dtype": options.dtype,
            "assistant": options.use_assistant, "timestamps": options.timestamps, "max_new": options.max_new_tokens,
            "long_form": options.long_form}
    return hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]


class OutputTree:
    """Where each input's outputs go, relative to the common root of the inputs."""

    def __init__(self, out_dir: str | Path, inputs: list[Path], formats: tuple[str, ...], signature: str) -> None:
        self.out = Path(out_dir)
        self.formats, self.signature = formats, signature
        resolved = [p.resolve().parent for p in inputs] or [Path.cwd()]
        self.root = Path(os.path.commonpath([str(p) for p in resolved]))

    def base(self, source: Path) -> Path:
        rel = source.resolve().relative_to(self.root)
        return self.out / rel.parent / rel.stem

    def record_path(self, source: Path) -> Path:
        return self.base(source).with_name(self.base(source).name + RECORD_SUFFIX)

    def _source_id(self, source: Path) -> dict:
        st = source.stat()
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def is_done(self, source: Path) -> bool:
        record = self.record_path(source)
        try:
            meta = json.loads(record.read_text())
            same_source = meta["source"] == self._source_id(source)
        except (OSError, ValueError, KeyError):
            return False
        outputs = [Path(p) for p in meta.get("outputs", [])]
        return (meta.get("status") == "done" and meta.get("signature") == self.signature and same_source
                and all(p.is_file() for p in outputs) and {p.suffix[1:] for p in outputs} >= set(self.formats))

    def write(self, t: Transcript) -> list[Path]:
        """Outputs first, record last: an interrupted write leaves no record, so the file is redone."""
        source = Path(t.path)
        written = []
        if t.ok:
            for fmt in self.formats:
                base = self.base(source)
                path = base.with_name(f"{base.name}.{fmt}")
                write_atomic(path, render(t, fmt))
                written.append(path)
        meta = {"source": self._source_id(source) if source.exists() else None, "path": str(source),
                "signature": self.signature, "status": "done" if t.ok else "failed", "error": t.error,
                "outputs": [str(p) for p in written]}
        write_atomic(self.record_path(source), json.dumps(meta, indent=1))
        return written
