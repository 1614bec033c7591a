"""The labelled corpus kept in the repository (``data/distill/<main model>/``), so that it grows from run to run.

It holds no audio and no sentence text: per clip, its recipe (``speech.Recipe``: sentence addresses in
Debian's index, voice and synthesis settings, gain, noise, pauses, cut) and the main model's greedy tokens
for it (the label). Files:
    manifest.json         the teacher (model and dtype), the synthesisers' versions, and
                          per shard: its file, items, label tokens, SHA-256, the SHA-256 of its first two
                          clips' audio, and when, where and how fast it was labelled
    shard-NNNNN.json.gz   a list of {"recipe": ..., "labels": [token ids]}; shard 0 is the held-out part
A shard is written to a temporary file and renamed, then the manifest is rewritten the same way: a run
stopped at any moment leaves the corpus as it was or one shard larger; runs sharing a corpus rewrite its
manifest under a lock (``.lock``), each adding its own shards to what is there.
Reading checks each shard's checksum; rendering compares the audio hashes and reports clips that now sound
different (another synthesiser version, or another processor's floating point in the resampler or Piper's
onnxruntime), counted, not fatal: their labels were made from nearly the same audio. Shards labelled on
different devices (``made``) may differ at rare near-ties; any of them is the teacher's greedy output.
About 60 bytes a label token compressed: 20,000 clips are a few MB.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import TandemError
from ..models.loading import ModelRef
from ..paths import PROJECT_ROOT
from .speech import Recipe

FORMAT = 1


def default_corpus(ref: ModelRef) -> Path:
    """Where the repository keeps a main model's labelled corpus: data/distill/<model name>."""
    return PROJECT_ROOT / "data" / "distill" / re.sub(r"[^\w.-]+", "-", Path(ref.id).name)


class CorpusError(TandemError, RuntimeError):
    """The committed corpus cannot be used as it is; the message says why."""


@dataclass(frozen=True)
class LabelledClip:
    recipe: Recipe
    labels: tuple[int, ...]


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary name, flush it to the disk, rename: readers see the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextmanager
def _locked(folder: Path):
    """An exclusive lock on the corpus folder (``.lock``) while its manifest is read and rewritten."""
    with open(folder / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Corpus:
    """A corpus folder for one teacher. ``teacher`` (e.g. "embedded:whisper-base bfloat16") must match the
    manifest's: labels from another model or dtype are refused (CorpusError)."""

    def __init__(self, folder: Path, teacher: str, synthesis: dict[str, str]) -> None:
        self.folder, self.teacher, self.synthesis = Path(folder), teacher, synthesis
        self.manifest = self._load()

    def _load(self) -> dict:
        path = self.folder / "manifest.json"
        if not path.is_file():
            return {"format": FORMAT, "teacher": self.teacher, "synthesis": self.synthesis, "shards": {}}
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CorpusError(f"{path}: unreadable ({e})") from None
        if manifest.get("format") != FORMAT:
            raise CorpusError(f"{path}: format {manifest.get('format')!r}, this version reads {FORMAT}")
        if manifest.get("teacher") != self.teacher:
            raise CorpusError(f"{path}: labelled by {manifest.get('teacher')!r}, not {self.teacher!r}: use another --corpus")
        return manifest

    def shards(self) -> list[int]:
        return sorted(int(k) for k in self.manifest["shards"])

    def has(self, shard: int) -> bool:
        return str(shard) in self.manifest["shards"]

    def entry(self, shard: int) -> dict:
        return self.manifest["shards"][str(shard)]

    def read(self, shard: int) -> list[LabelledClip]:
        """A shard's clips; CorpusError when its file is missing or its checksum differs from the manifest's."""
        entry = self.entry(shard)
        path = self.folder / entry["file"]
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CorpusError(f"{path}: {e.strerror}") from None
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CorpusError(f"{path}: sha256 differs from the manifest's (a damaged or hand-edited shard)")
        return [LabelledClip(Recipe.from_json(d["recipe"]), tuple(d["labels"])) for d in json.loads(gzip.decompress(data))]

    def add(self, shard: int, clips: list[LabelledClip], audio_hashes: list[str], made: dict) -> None:
        """Write a shard, then the manifest that names it (each atomically)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"shard-{shard:05d}.json.gz"
        body = json.dumps([{"recipe": c.recipe.to_json(), "labels": list(c.labels)} for c in clips], separators=(",", ":"))
        data = gzip.compress(body.encode(), mtime=0)
        with _locked(self.folder):  # another run may have added shards since this one read the manifest
            _atomic_write(self.folder / name, data)
            self.manifest = self._load()
            self.manifest["synthesis"] = self.synthesis
            self.manifest["shards"][str(shard)] = {
                "file": name, "items": len(clips), "tokens": sum(len(c.labels) for c in clips),
                "sha256": hashlib.sha256(data).hexdigest(), "audio_sha256": audio_hashes, "made": made}
            self.manifest["shards"] = dict(sorted(self.manifest["shards"].items(), key=lambda kv: int(kv[0])))
            _atomic_write(self.folder / "manifest.json", (json.dumps(self.manifest, indent=1) + "\n").encode())

    def same_audio(self, shard: int, index: int, audio_hash: str) -> bool:
        """False when clip ``index`` (< 2) of ``shard`` renders other audio than when it was labelled."""
        known = self.entry(shard)["audio_sha256"]
        return index >= len(known) or known[index] == audio_hash
