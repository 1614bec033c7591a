"""README.md stays a front page and the documentation's links lead somewhere.

README.md is what a newcomer reads first: short (under 15 KB, about 200 lines), with the two set-up commands
exactly as they are. The rest lives in docs/ by topic and in CHANGELOG.md; every relative link in them must
name a file that exists (without an anchor: anchors break silently when a heading is reworded).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
SETUP_COMMANDS = (
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tandem demo",
    "bash .ci/run",
)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def relative_links(text: str) -> list[str]:
    """The targets of the Markdown links outside code that point into the repository."""
    prose = CODE.sub("", FENCE.sub("", text))
    return [t for t in LINK.findall(prose) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def test_link_finder():
    text = "[a](docs/x.md) [b](https://e.org) `[c](no.md)`\n```\n[d](no.md)\n```\n[e](../y.md \"t\") ![i](img.png)"
    assert relative_links(text) == ["docs/x.md", "../y.md", "img.png"]


def test_pages_exist():
    for page in ("README.md", "CHANGELOG.md", "docs/README.md"):
        assert (ROOT / page).is_file(), page


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        if "#" in target:
            broken.append(f"{target} (an anchor: link the file)")
        elif not (page.parent / target).exists():
            broken.append(f"{target} (no such file)")
    assert not broken, f"{page.relative_to(ROOT)}: " + ", ".join(broken)


def test_every_docs_page_is_linked_from_the_index():
    index = set(relative_links((ROOT / "docs" / "README.md").read_text(encoding="utf-8")))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= index, f"docs/README.md does not link {sorted(pages - index)}"


def test_readme_is_a_front_page():
    raw = (ROOT / "README.md").read_bytes()
    assert len(raw) < 15 * 1024, f"README.md is {len(raw)} bytes; move detail to docs/"
    lines = raw.decode("utf-8").count("\n")
    assert lines <= 220, f"README.md has {lines} lines; move detail to docs/"


def test_readme_keeps_the_setup_commands_first():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    commands = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
    assert commands[:2] == list(SETUP_COMMANDS), commands[:2]


def python_examples() -> list[str]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [code for page in pages
            for code in re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)]


def test_python_examples_compile_and_their_imports_exist():
    """The examples run against the real API (run by hand on a speech-real file); here at least they parse
    and every name they import is there."""
    import ast
    import importlib

    examples = python_examples()
    assert len(examples) >= 2
    for code in examples:
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"{node.module} has no {missing}"
