"""What a batch run reads and what each input's outputs are called.

``find_inputs`` expands the paths a user gives (files, folders searched recursively, globs) into inputs,
each with the name its outputs take under ``--out``: the path relative to the folder given (a glob: to its
folder part; a file: its own name), as given, symbolic links not resolved, extension dropped
(``talk.wav`` -> ``talk.txt``). A folder's files are taken by content: a name in ``AUDIO_EXTENSIONS`` (any
case) at once, any other file when the audio layer can decode it (``audio.probe_audio``: its header), so
``.ts``, ``.avi``, ``.mpg``, ``.3gp``, ``.w64`` recordings are found; every other file is ``Skipped`` with its
reason, for the run to name (never dropped silently). A file or glob named on the command line is always
taken (what it is, the run finds out and reports). Names that would collide are disambiguated deterministically, and the run
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
from typing import NamedTuple

from ..audio import is_audio_name, probe_audio
from ..paths import display

__all__ = ["Found", "Input", "Skipped", "display", "find_audio", "find_inputs"]

MAGIC = "*?["


@dataclass(frozen=True)
class Input:
    path: Path  # as found (the argument joined with the name below it; links not resolved)
    name: PurePath  # output name relative to --out, without extension


@dataclass(frozen=True)
class Skipped:
    """A file in a folder given that is not audio, and why (``audio.probe_audio``'s words)."""

    path: Path
    reason: str


class Found(NamedTuple):
    inputs: list[Input]
    notes: list[str]  # one line per output name that had to be disambiguated
    skipped: list[Skipped]  # files of the folders given that are not audio


def _why_not(p: Path) -> str | None:
    """None when a file found in a folder is an input: an audio name (a link with one too: a dangling one is
    reported as that file's failure), or content the audio layer decodes; else why it is skipped."""
    if p.is_dir():
        return ""  # a folder: walked, not an input ("" is never reported)
    if is_audio_name(p) and (p.is_symlink() or p.is_file()):
        return None
    if not p.exists():
        return "broken symbolic link" if p.is_symlink() else "vanished while the folder was read"
    if not p.is_file():
        return "not a regular file"
    return probe_audio(p)


def _inside(path: Path, folders: list[str]) -> bool:
    here = os.path.abspath(path)
    return any(here == f or here.startswith(f + os.sep) for f in folders)


def _glob_base(pattern: str) -> Path:
    """The folder part of a glob before its first wildcard."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts:
        if any(ch in part for ch in MAGIC):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")


def _expand(item: str | Path, skipped: list[Skipped], exclude: list[str]) -> list[tuple[Path, PurePath]]:
    path = Path(item)
    if path.is_dir():
        taken = []
        for p in sorted(path.rglob("*")):
            if exclude and _inside(p, exclude):
                continue
            why = _why_not(p)
            if why is None:
                taken.append((p, p.relative_to(path)))
            elif why:
                skipped.append(Skipped(p, why))
        return taken
    if any(ch in str(item) for ch in MAGIC) and not path.exists():
        base = _glob_base(str(item))
        found = sorted(Path(p) for p in glob.glob(str(item), recursive=True))
        return [(p, p.relative_to(base) if p.is_relative_to(base) else PurePath(p.name)) for p in found
                if p.is_symlink() or p.is_file()]
    return [(path, PurePath(path.name))]


def find_inputs(items: Iterable[str | Path], exclude: Iterable[str | os.PathLike] = ()) -> Found:
    """The inputs in a stable order (each path once) with their output names, one line per collision that
    was disambiguated, and the files of the folders given that are not audio. Files under an ``exclude``
    folder (the run's own --out, when it sits inside a folder given) are neither inputs nor skipped."""
    found: list[tuple[Path, PurePath]] = []
    seen: set[str] = set()
    skipped: list[Skipped] = []
    exclude = [os.path.abspath(e) for e in exclude]
    for item in items:
        for path, rel in _expand(item, skipped, exclude):
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
    return Found([Input(path, names[path]) for path, _ in found], notes, skipped)


def find_audio(items: Iterable[str | Path]) -> list[Path]:
    """The input files only (see ``find_inputs``)."""
    return [i.path for i in find_inputs(items)[0]]
