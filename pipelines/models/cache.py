"""The model cache: a converted model folder is built in a private folder, stamped and renamed into place
under a lock, and used only while its stamp names the same source checksum and its weights are the stamped
ones (a crash half-way or a flipped byte is rebuilt, never loaded)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from .. import paths
from ..errors import TandemError

STAMP = "tandem-complete.json"
WEIGHTS = "model.safetensors"


class EmbeddedModelError(TandemError, RuntimeError):
    """An embedded model cannot be had: its package is missing or its bytes are not the pinned ones."""


def package_file(package: str, inner: str) -> Path:
    """The file or folder ``inner`` of installed package ``package`` (a part of an embedded model's weights).
    Raises EmbeddedModelError naming the package when it is missing or lacks that path."""
    try:
        root = resources.files(package)
    except ModuleNotFoundError:
        raise EmbeddedModelError(f"package {package!r} is not installed") from None
    path = Path(str(root.joinpath(inner)))
    if not path.is_file() and not path.is_dir():
        raise EmbeddedModelError(f"package {package!r} lacks {inner!r}")
    return path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def is_complete(folder: Path, source_sha: str, weights: str = WEIGHTS) -> bool:
    """A cached folder counts only if its stamp matches the source and the weights are the ones stamped:
    same size and modification time as at publishing (a stat, so loading a 3 GB model does not re-read
    it), else the same sha256 (a copied or touched folder is hashed once more and still counts)."""
    stamp = folder / STAMP
    if not stamp.is_file():
        return False
    try:
        meta = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    path = folder / weights
    if meta.get("source_sha256") != source_sha or not path.is_file():
        return False
    if meta.get("weights_stat") == _stat_of(path):
        return True
    if file_sha256(path) != meta.get("weights_sha256"):
        return False
    _write_stamp(folder, {**meta, "weights_stat": _stat_of(path)})  # the next check is a stat again
    return True


def _write_stamp(folder: Path, meta: dict) -> None:
    tmp = folder / (STAMP + ".tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    os.replace(tmp, folder / STAMP)


def _stat_of(path: Path) -> list[int]:
    """[size in bytes, modification time in ns]: any rewrite of the file changes it."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _publish(tmp: Path, final: Path, source_sha: str, weights: str) -> None:
    """Stamp ``tmp`` and move it into place in one rename; a reader never sees a half-written folder.
    (The rename keeps the weights' size and modification time, so the stamped stat stays true.)"""
    _write_stamp(tmp, {"source_sha256": source_sha, "weights_sha256": file_sha256(tmp / weights),
                       "weights_stat": _stat_of(tmp / weights)})
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def _sweep_killed_builds(final: Path) -> None:
    """Remove the private folders (``<name>.tmp-*``) of builds of ``final`` that were killed before their
    ``finally`` ran (a conversion of the 1.5B model leaves 1.1 GB). Called under ``paths.build_lock``, where
    no other process can be building ``final``; not where the lock is advisory only (no ``fcntl``)."""
    if os.name != "posix":  # pragma: no cover - no lock there: the folder may be a live build's
        return
    for leftover in final.parent.glob(final.name + ".tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def build_into(final: Path, build, source_sha: str, weights: str = WEIGHTS) -> Path:
    """Build into a private folder and publish it as ``final``, under ``paths.build_lock`` (a process that
    waited for another's build finds it complete and builds nothing; a killed build's folder is removed)."""
    with paths.build_lock(final):
        if is_complete(final, source_sha, weights):
            return final
        _sweep_killed_builds(final)
        tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
        try:
            build(tmp)
            _publish(tmp, final, source_sha, weights)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
