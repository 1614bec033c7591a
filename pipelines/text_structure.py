"""The layout of a text to translate: what is translated, what is kept (preprocess and postprocess).

``parse_text`` cuts a text into kept pieces (markup, markers, whitespace, code) and translatable units (a line's
text, an inline run between markdown code spans and links, an HTML text node); ``Document.rows`` are the units'
sentences, the rows the engine decodes in batches; ``Document.render_rows`` puts their translations back in
the input's layout. The input is normalised first: a byte-order mark dropped, CRLF and CR line ends made LF.

text, markdown  line by line: blank lines, line breaks, indentation, list markers (``-``, ``*``, ``+``, ``1.``,
                ``1)``, task boxes), heading markers (``#``), block quotes (``>``) and table pipes kept; fenced
                code blocks, inline code, link targets, URLs, inline tags and emphasis markers kept; markdown
                (a .md file) also keeps indented code blocks and front matter
html            text nodes translated (whitespace around them kept), tags, attributes, comments and
                declarations kept as written; nothing inside script, style, code, pre, kbd, samp, textarea,
                svg or math, or an element with translate="no" or class notranslate

A unit without a letter (numbers, rules such as ``---``) is kept as it is.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import PurePath

FORMATS = ("auto", "text", "markdown", "html")
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdown", ".mkd"}
SKIP_TAGS = {"script", "style", "code", "pre", "kbd", "samp", "textarea", "svg", "math"}
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
             "track", "wbr"}

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")
_SPACE = re.compile(r"[ \t\n\r\f\v]+")  # runs collapsed in a unit (a no-break space is kept)
_HTML_START = re.compile(r"\s*<(?:!doctype|!--|[a-z][\w-]*(?:\s|/?>))", re.IGNORECASE)
_HTML_SPACE = " \t\n\r\f"  # whitespace in HTML (not a no-break space)
# indentation, block quotes, then a list item (with a task box) or a heading marker
_PREFIX = re.compile(r"[ \t]*(?:>[ \t]?)*(?:(?:[-*+]|\d{1,9}[.)])(?:[ \t]+\[[ xX]\])?(?=[ \t]|$)|#{1,6}(?=[ \t]|$))?[ \t]*")
_LIST = re.compile(r"[ \t]*(?:>[ \t]?)*(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
_HEADING_END = re.compile(r"[ \t]+#+[ \t]*$|[ \t]*$")
_FENCE = re.compile(r"[ \t]*(?:>[ \t]?)*(`{3,}|~{3,})")
_INLINE_KEEP = re.compile(
    r"(`+).*?\1"  # a code span
    r"|<!--.*?-->|<(?:https?://|mailto:)[^>]*>|</?[A-Za-z][^>]*>"  # comments, autolinks, inline tags
    r"|https?://[^\s)>\]]+"  # a bare URL
    r"|!?\[|\]\([^)]*\)|\]\[[^\]]*\]|\]:?"  # link and image brackets, their targets and references
    r"|\*\*|__|(?<![\w*])\*(?=\S)|(?<=\S)\*(?![\w*])|(?<![\w_])_(?=\S)|(?<=\S)_(?![\w_])"  # emphasis markers
)
_TABLE_KEEP = re.compile(_INLINE_KEEP.pattern + r"|(?<!\\)\|")


def normalize(text: str) -> str:
    """``text`` without a leading byte-order mark, its line ends LF."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def detect_format(text: str, name: str | None = None) -> str:
    """"html" for a name ending .html/.htm or a text that starts with a tag, a comment or ``<!doctype``;
    "markdown" for a name ending .md/.markdown; "text" otherwise."""
    suffix = PurePath(name).suffix.lower() if name else ""
    if suffix in HTML_SUFFIXES:
        return "html"
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    return "html" if _HTML_START.match(normalize(text)) else "text"


def sentences(unit: str) -> list[str]:
    """A unit's sentences, its whitespace collapsed."""
    return [s for s in _SENTENCE.split(_SPACE.sub(" ", unit).strip(" ")) if s]


def clean_row(output: str) -> str:
    """A row's translation fit to stand in a line: a wrapping <document> tag (a chat model echoing its prompt's)
    dropped, each line break (with the spaces around it) made one space; the rest as the model wrote it."""
    output = re.sub(r"^\s*<document>|</document>\s*$", "", output.strip(), flags=re.IGNORECASE)
    return re.sub(r"[ \t]*[\r\n]+[ \t]*", " ", output.strip())


@dataclass
class Document:
    """A text cut into kept pieces (strings) and units (their index in ``units``), in order."""

    fmt: str
    pieces: list[str | int] = field(default_factory=list)
    units: list[str] = field(default_factory=list)

    def keep(self, piece: str) -> None:
        if piece:
            self.pieces.append(piece)

    def add(self, run: str, space: str = _HTML_SPACE, unescape: bool = False) -> None:
        """A run of text: its core translated when it has a letter, the whitespace around it kept."""
        core = run.strip(space)
        text = html.unescape(core) if unescape else core
        if not any(c.isalpha() for c in text):
            self.keep(run)
            return
        start = run.index(core)
        self.keep(run[:start])
        self.pieces.append(len(self.units))
        self.units.append(text)
        self.keep(run[start + len(core):])

    @property
    def rows(self) -> list[str]:
        """Every unit's sentences, in order: what the engine decodes."""
        return [s for u in self.units for s in sentences(u)]

    def render(self, translations: list[str]) -> str:
        """The document with unit ``i`` replaced by ``translations[i]`` (escaped in HTML)."""
        if len(translations) != len(self.units):
            raise ValueError(f"{len(translations)} translations for {len(self.units)} units")
        escape = (lambda s: html.escape(s, quote=False)) if self.fmt == "html" else (lambda s: s)
        return "".join(p if isinstance(p, str) else escape(translations[p]) for p in self.pieces)

    def render_rows(self, outputs: list[str]) -> str:
        """The document from the translations of ``rows`` (each cleaned: ``clean_row``), joined per unit."""
        it = iter(outputs)
        units = [" ".join(t for t in (clean_row(next(it)) for _ in sentences(u)) if t) for u in self.units]
        return self.render(units)


def parse_text(text: str, fmt: str | None = "auto", name: str | None = None) -> Document:
    """``text`` (normalised) cut into kept pieces and units; ``fmt`` one of FORMATS ("auto": ``detect_format``
    from the content and ``name``)."""
    if fmt not in (None, *FORMATS):
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    text = normalize(text)
    fmt = detect_format(text, name) if fmt in (None, "auto") else fmt
    return _parse_html(text) if fmt == "html" else _parse_lines(text, fmt)


def translate_text(text: str, translate_rows: Callable[[list[str]], list[str]], fmt: str | None = "auto",
                   name: str | None = None) -> str:
    """``text`` in its own layout with its sentences replaced by ``translate_rows(sentences)`` (one batch)."""
    doc = parse_text(text, fmt, name)
    rows = doc.rows
    return doc.render_rows(translate_rows(rows) if rows else [])


# -- text and markdown
def _parse_lines(text: str, fmt: str) -> Document:
    doc = Document(fmt)
    lines = text.split("\n")
    fence, in_list, blank, code, front = "", False, True, False, fmt == "markdown" and lines[0].strip() == "---"
    for i, line in enumerate(lines):
        if i:
            doc.keep("\n")
        if front:  # YAML front matter of a markdown file, kept up to its closing ---
            doc.keep(line)
            front = not (i and line.strip() in ("---", "..."))
            continue
        if fence:
            doc.keep(line)
            m = _FENCE.match(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[m.end():].strip():
                fence = ""
            continue
        if m := _FENCE.match(line):
            doc.keep(line)
            fence = m.group(1)
            continue
        if not line.strip():
            doc.keep(line)
            blank = True
            continue
        indented = line.startswith(("    ", "\t"))
        if fmt == "markdown" and indented and (blank or code) and not in_list:  # an indented code block
            doc.keep(line)
            blank, code = False, True
            continue
        if _LIST.match(line):
            in_list = True
        elif not line[0].isspace():
            in_list = False
        blank = code = False
        _line(doc, line)
    return doc


def _line(doc: Document, line: str) -> None:
    """A line's prefix (indentation, quote, marker) and end (trailing space, closing #s) kept, its text in runs."""
    prefix = _PREFIX.match(line).end()
    end = _HEADING_END.search(line, prefix).start() if "#" in line[:prefix] else len(line.rstrip(" \t"))
    doc.keep(line[:prefix])
    keep = _TABLE_KEEP if line.lstrip().startswith("|") else _INLINE_KEEP
    body, at = line[prefix:end], 0
    for m in keep.finditer(body):
        doc.add(body[at:m.start()], " \t")
        doc.keep(m.group(0))
        at = m.end()
    doc.add(body[at:], " \t")
    doc.keep(line[end:])


# -- html
class _Scanner(HTMLParser):
    """Where each construct starts, what it is and, for a start tag, whether its content is to be left alone."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.events: list[tuple[tuple[int, int], str, str, bool]] = []

    def _add(self, kind: str, tag: str = "", skip: bool = False) -> None:
        self.events.append((self.getpos(), kind, tag, skip))

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        skip = tag in SKIP_TAGS or (values.get("translate") or "").lower() == "no" \
            or "notranslate" in (values.get("class") or "").split()
        self._add("start", tag, skip)

    def handle_startendtag(self, tag, attrs):
        self._add("other", tag)

    def handle_endtag(self, tag):
        self._add("end", tag)

    def handle_data(self, data):
        self._add("data")

    def handle_comment(self, data):
        self._add("other")

    def handle_decl(self, decl):
        self._add("other")

    def handle_pi(self, data):
        self._add("other")

    def unknown_decl(self, data):
        self._add("other")


def _parse_html(text: str) -> Document:
    scanner = _Scanner()
    scanner.feed(text)
    scanner.close()
    line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
    offsets = [line_starts[line - 1] + col for (line, col), *_ in scanner.events] + [len(text)]
    doc = Document("html")
    doc.keep(text[: offsets[0]])
    skipping: list[list] = []  # [tag, depth] of the open elements whose content is left alone
    run = ""
    for n, (_, kind, tag, skip) in enumerate(scanner.events):
        raw = text[offsets[n] : offsets[n + 1]]
        if kind == "data":  # consecutive data (the parser may cut a text node) is one run
            run += raw
            continue
        _flush(doc, run, bool(skipping))
        run = ""
        doc.keep(raw)
        if kind == "start" and tag not in VOID_TAGS:
            for entry in skipping:
                entry[1] += entry[0] == tag
            if skip:
                skipping.append([tag, 1])
        elif kind == "end":
            for entry in skipping:
                entry[1] -= entry[0] == tag
            skipping = [e for e in skipping if e[1] > 0]
    _flush(doc, run, bool(skipping))
    return doc


def _flush(doc: Document, run: str, skipping: bool) -> None:
    if skipping:
        doc.keep(run)
    elif run:
        doc.add(run, unescape=True)
