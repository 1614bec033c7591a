"""Debian's English package descriptions (the ``Translation-en`` index of apt's lists), the text source of the
summarization set and of the distillation corpus; and Debian's ``fortunes`` package (fortune cookies:
quotations, literature, humour), the corpus's everyday English beside the descriptions' software English.

apt fetches the index from the machine's Debian mirror (a package registry, reachable here). Each stanza
gives ``Package``, ``Description-md5`` (the md5 of the original description, which names its text exactly:
an index entry never changes under the same md5) and ``Description-en`` (a synopsis line and the long text).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import paths
from .errors import TandemError


class DataBuildError(TandemError, RuntimeError):
    """A set or corpus cannot be built here; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class Description:
    package: str
    md5: str  # Description-md5: names this text exactly
    synopsis: str
    long: str  # the long description, paragraphs joined by spaces


def debian_descriptions(lists_dir: Path | None = None) -> list[tuple[str, str, str]]:
    """(package, synopsis, long description) from Debian's English Translation index, fetched with apt."""
    return [(d.package, d.synopsis, d.long) for d in read_index(lists_dir)]


def read_index(lists_dir: Path | None = None) -> list[Description]:
    """Every description of the English Translation index (apt-get update into ``lists_dir`` when it holds
    none; default: the cache's downloads/apt-lists). Raises DataBuildError where apt cannot fetch it."""
    out: list[Description] = []
    files = sorted(apt_lists(lists_dir).glob("*_i18n_Translation-en*"))
    for path in files:
        text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], capture_output=True,
                              text=True, check=True).stdout
        out += list(_parse_translation_index(text))
    return out


def apt_lists(lists_dir: Path | None = None) -> Path:
    """apt's package lists and English Translation index in ``lists_dir`` (default: the cache's
    downloads/apt-lists), fetched with ``apt-get update`` when it holds no Translation index. Raises
    DataBuildError where apt cannot fetch them."""
    lists_dir = lists_dir or paths.downloads_dir() / "apt-lists"
    if not any(lists_dir.glob("*_i18n_Translation-en*")):
        if shutil.which("apt-get") is None:
            raise DataBuildError("Debian's descriptions need apt-get (a Debian-based machine)")
        (lists_dir / "partial").mkdir(parents=True, exist_ok=True)
        cmd = ["apt-get", "update", "-q", "-o", f"Dir::State::Lists={lists_dir}", "-o", "Acquire::Languages=en"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not any(lists_dir.glob("*_i18n_Translation-en*")):
            raise DataBuildError(f"apt-get update could not fetch the English descriptions: {proc.stderr.strip()[-300:]}")
    return lists_dir


def _parse_translation_index(text: str) -> Iterable[Description]:
    for stanza in text.split("\n\n"):
        package, md5, desc_lines = None, "", []
        lines = stanza.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Package:"):
                package = line.split(":", 1)[1].strip()
            elif line.startswith("Description-md5:"):
                md5 = line.split(":", 1)[1].strip()
            elif line.startswith("Description-en:"):
                desc_lines = [line.split(":", 1)[1].strip()] + [
                    ln for ln in lines[i + 1 :] if ln.startswith(" ")
                ]
                break
        if package and len(desc_lines) > 1:
            body = [" " if ln.strip() == "." else ln.strip() for ln in desc_lines[1:]]
            long = re.sub(r"\s+", " ", " ".join(body)).strip()
            yield Description(package, md5, desc_lines[0], long)


@dataclass(frozen=True)
class TextFile:
    package: str
    name: str  # the file's name in the package
    md5: str  # of its text: names this text exactly
    text: str


def read_fortunes(package: str = "fortunes", folder: Path | None = None) -> list[TextFile]:
    """The fortune files of Debian's ``package`` (``/usr/share/games/fortunes/*`` but the ``.dat`` indexes and
    ``.u8`` links), from its ``.deb`` fetched with ``apt-get download`` through the same lists as ``read_index``
    into ``folder`` (default: the cache's downloads/debs) and unpacked with ``dpkg-deb``. Raises DataBuildError
    where apt cannot fetch it."""
    import hashlib

    folder = folder or paths.downloads_dir() / "debs"
    debs = sorted(folder.glob(f"{package}_*.deb"))
    if not debs:
        if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
            raise DataBuildError(f"Debian's {package} package needs apt-get and dpkg-deb (a Debian-based machine)")
        lists_dir = apt_lists()
        folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["apt-get", "download", "-q", "-o", f"Dir::State::Lists={lists_dir}", package],
                              capture_output=True, text=True, cwd=folder)
        debs = sorted(folder.glob(f"{package}_*.deb"))
        if proc.returncode != 0 or not debs:
            raise DataBuildError(f"apt-get could not download {package}: {proc.stderr.strip()[-300:]}")
    unpacked = folder / debs[-1].stem
    if not unpacked.is_dir():
        tmp = folder / f"{debs[-1].stem}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(tmp)], check=True, capture_output=True)
        tmp.rename(unpacked)
    files = []
    for path in sorted((unpacked / "usr/share/games/fortunes").iterdir()):
        if path.suffix in (".dat", ".u8") or path.is_symlink() or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        files.append(TextFile(package, path.name, hashlib.md5(text.encode("utf-8")).hexdigest(), text))
    return files
