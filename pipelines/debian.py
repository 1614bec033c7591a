"""Debian's English package descriptions (the ``Translation-en`` index of apt's lists), the text source of the
summarization set and of the distillation corpus.

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


class DataBuildError(RuntimeError):
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
    lists_dir = lists_dir or paths.downloads_dir() / "apt-lists"
    files = sorted(lists_dir.glob("*_i18n_Translation-en*"))
    if not files:
        if shutil.which("apt-get") is None:
            raise DataBuildError("Debian's descriptions need apt-get (a Debian-based machine)")
        (lists_dir / "partial").mkdir(parents=True, exist_ok=True)
        cmd = ["apt-get", "update", "-q", "-o", f"Dir::State::Lists={lists_dir}", "-o", "Acquire::Languages=en"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        files = sorted(lists_dir.glob("*_i18n_Translation-en*"))
        if proc.returncode != 0 or not files:
            raise DataBuildError(f"apt-get update could not fetch the English descriptions: {proc.stderr.strip()[-300:]}")
    out: list[Description] = []
    for path in files:
        text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(path)], capture_output=True,
                              text=True, check=True).stdout
        out += list(_parse_translation_index(text))
    return out


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


