"""What a batch run reads and what each input's outputs are called.

``find_inputs`` expands the paths a user gives (files, folders searched recursively, globs) into inputs,
each with the name its outputs take under ``--out``: the path relative to the folder given (a glob: to its
folder part; a file: its own name), as given, symbolic links not resolved, extension dropped
(``talk.wav`` -> ``talk.txt``). Names that would collide are disambiguated deterministically, and the run
says so:
    1. inputs whose names differ only by extension keep it: ``talk.wav`` -> ``talk.wav.txt``,
       ``talk.mp3`` -> ``talk.mp3.txt``;
    2. inputs whose names are still equal (the same relative name under two folders given) get the
       first 8 hex digits of the sha256 of their absolute path: ``talk.wav-1a2b3c4d.txt``.
Any name the OS allows is kept as bytes (undecodable bytes travel as surrogate escapes); ``display``
gives a printable form. A dangling symbolic link is an input too: it fails with its reason.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath

from ..audio import is_audio_name
from ..paths import display

__all__ = ["Input", "display", "find_audio", "find_inputs"]

MAGIC = "*?["


@dataclass(frozen=True)
class Input:
    path: Path  # as found (the argument joined with the name below it; links not resolved)
    name: PurePath  # output name relative to --out, without extension


def _is_candidate(p: Path) -> bool:
    """An audio-named file, or a link (a dangling one is reported as a failure, not skipped)."""
    return is_audio_name(p) and (p.is_symlink() or p.is_file())


def _glob_base(pattern: str) -> Path:
    """The folder part of a glob before its first wildcard."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts:
        if any(ch in part for ch in MAGIC):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def _expand(item: str | Path) -> list[tuple[Path, PurePath]]:
    path = Path(item)
    if path.is_dir():
        return [(p, p.relative_to(path)) for p in sorted(path.rglob("*")) if _is_candidate(p)]
    if any(ch in str(item) for ch in MAGIC) and not path.exists():
        base = _glob_base(str(item))
        found = sorted(Path(p) for p in glob.glob(str(item), recursive=True))
        return [(p, p.relative_to(base) if p.is_relative_to(base) else PurePath(p.name)) for p in found
                if p.is_symlink() or p.is_file()]
    return [(path, PurePath(path.name))]


def find_inputs(items: Iterable[str | Path]) -> tuple[list[Input], list[str]]:
    """The inputs in a stable order (each path once) with their output names, and one line per collision
    that was disambiguated."""
    found: list[tuple[Path, PurePath]] = []
    seen: set[str] = set()
    for item in items:
        for path, rel in _expand(item):
            key = os.path.abspath(path)
            if key not in seen:
                seen.add(key)
                found.append((path, rel))
    names = {path: rel.with_suffix("") if rel.suffix else rel for path, rel in found}
    notes = []
    groups: dict[PurePath, list[Path]] = defaultdict(list)
    for path, name in names.items():
        groups[name].append(path)
    for name, paths in groups.items():
        if len(paths) < 2:
            continue
        rels = {path: rel for path, rel in found if path in paths}
        counts = defaultdict(int)
        for path in paths:
            counts[rels[path]] += 1
        for path in paths:
            rel = rels[path]
            if counts[rel] > 1:  # same name with extension too: add a digest of the absolute path
                digest = hashlib.sha256(os.fsencode(os.path.abspath(path))).hexdigest()[:8]
                rel = rel.with_name(f"{rel.name}-{digest}")
            names[path] = rel
        notes.append(f"names collide for {', '.join(display(p) for p in paths)}: outputs named "
                     + ", ".join(f"{display(names[p])}.*" for p in paths))
    return [Input(path, names[path]) for path, _ in found], notes


def find_audio(items: Iterable[str | Path]) -> list[Path]:
    """The input files only (see ``find_inputs``)."""
    return [i.path for i in find_inputs(items)[0]]
