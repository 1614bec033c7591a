"""The layout of a text to translate (pipelines/text_structure.py) with a fake translator that upper-cases each
sentence: the output must be the input (normalised) with only the translatable text changed. Inputs modelled on
the reports of issue 57: an HTML page that came back as one sentence, markdown whose headings and lists merged,
a poem that became one line, a CRLF file with a byte-order mark whose first line stayed untranslated."""

import re

import pytest

from pipelines.text_structure import clean_row, detect_format, normalize, parse_text, translate_text


def upper(rows: list[str]) -> list[str]:
    return [r.upper() for r in rows]


def same_layout(source: str, output: str) -> bool:
    """Equal once letters are dropped (the fake translation only changes their case)."""
    def drop(s):
        return re.sub(r"[^\W\d_]", "", s)
    return drop(normalize(source)) == drop(output)


PAGE = """<!DOCTYPE html>
<html lang="en">
<head><title>Opening hours</title><style>p { color: #333; }</style></head>
<body>
  <h1 class="title">Hours &amp; prices</h1>
  <p>The library opens at nine. It closes at six on
     <a href="/hours" title="Opening times">weekdays</a>.</p>
  <!-- Where is the bank? -->
  <p>Run <code>make docs</code> first.<br>Then wait.</p>
  <pre>Do not translate this.</pre>
  <p translate="no">Tandem Inc.</p>
  <script>var greeting = "Hello there.";</script>
</body>
</html>
"""

TRANSLATED = ("Opening hours", "Hours &amp; prices", "The library opens at nine. It closes at six on", "weekdays",
              "Run", "first.", "Then wait.")  # each once in PAGE; everything else is kept
PAGE_OUT = PAGE
for _text in TRANSLATED:
    PAGE_OUT = PAGE_OUT.replace(_text, _text.upper().replace("&AMP;", "&amp;"))


def test_html_translates_text_nodes_and_keeps_tags_attributes_and_code():
    calls = []
    out = translate_text(PAGE, lambda rows: calls.append(rows) or upper(rows), name="page.html")
    assert out == PAGE_OUT
    assert len(calls) == 1  # every sentence in one call: the engine batches them
    assert calls[0] == ["Opening hours", "Hours & prices", "The library opens at nine.", "It closes at six on",
                        "weekdays", "Run", "first.", "Then wait."]


def test_html_is_detected_by_suffix_or_content_and_translations_are_escaped():
    assert detect_format(PAGE) == "html" and detect_format("<p>Hi</p>") == "html"
    assert detect_format("Hello <b>you</b>.", "x.htm") == "html" and detect_format("Hello <b>you</b>.") == "text"
    assert detect_format("# Title", "notes.md") == "markdown" and detect_format("a < b, c > d") == "text"
    out = translate_text("<p>Fish and chips</p>", lambda rows: ["Fisch & <Pommes>"])
    assert out == "<p>Fisch &amp; &lt;Pommes&gt;</p>"


MARKDOWN = """# Getting started ##

Install the package first. Then run it.

- Download the file
- Open a terminal
  * Type the command
1. Read `README.md` for [the details](https://example.org/docs "Docs").
2) Some **bold words** here
- [ ] An open task

> A quoted line.

| Name | Meaning |
|------|:-------:|
| beam | the search width |

```bash
echo "Do not translate"
```

    indented code stays

Ends here.  
"""

KEPT = ("`README.md`", '(https://example.org/docs "Docs")', "|------|:-------:|", '```bash\necho "Do not translate"\n```',
        "    indented code stays")
MARKDOWN_OUT = MARKDOWN.upper()
for _text in KEPT:
    MARKDOWN_OUT = MARKDOWN_OUT.replace(_text.upper(), _text)


def test_markdown_keeps_markers_code_links_and_tables():
    assert translate_text(MARKDOWN, upper, name="guide.md") == MARKDOWN_OUT


def test_markdown_front_matter_and_plain_text_indentation():
    front = "---\ntitle: Start\n---\nHello there.\n"
    assert translate_text(front, upper, name="a.md") == "---\ntitle: Start\n---\nHELLO THERE.\n"
    # plain text: an indented line after a blank one is verse, not a code block
    assert translate_text("One line.\n\n    An indented line.\n", upper) == "ONE LINE.\n\n    AN INDENTED LINE.\n"


POEM = """The Road

Two roads diverged in a yellow wood,
And sorry I could not travel both
  And be one traveler, long I stood
  And looked down one as far as I could

"""


def test_verse_keeps_every_line_and_its_indentation():
    out = translate_text(POEM, upper)
    assert out == POEM.upper() and out.count("\n") == POEM.count("\n")
    assert parse_text(POEM).rows[1] == "Two roads diverged in a yellow wood,"  # one row per line, not per stanza


def test_crlf_and_byte_order_mark_are_normalised_and_the_first_line_translated():
    source = "\ufeffFirst line here.\r\nSecond line.\r\n\r\nA paragraph. Two sentences.\rOld Mac line.\r\n"
    out = translate_text(source, upper)
    assert out == "FIRST LINE HERE.\nSECOND LINE.\n\nA PARAGRAPH. TWO SENTENCES.\nOLD MAC LINE.\n"
    assert parse_text(source).rows[0] == "First line here."


@pytest.mark.parametrize("source, name", [(PAGE, "page.html"), (MARKDOWN, "guide.md"), (POEM, None),
                                          ("\ufeffA.\r\nB c.\r\n", None)])
def test_layout_is_identical_apart_from_the_translated_text(source, name):
    assert same_layout(source, translate_text(source, upper, name=name))


def test_a_reply_on_several_lines_or_in_document_tags_stays_on_its_line():
    assert clean_row("<document>\nDer Zug.\n</document>") == "Der Zug."
    out = translate_text("- One.\n- Two.\n", lambda rows: [f"{r}\nextra" for r in rows])
    assert out == "- One. extra\n- Two. extra\n"


def test_nothing_to_translate_gives_the_text_back():
    source = "```\ncode only\n```\n\n---\n2024\n"
    doc = parse_text(source)
    assert doc.rows == [] and doc.render([]) == source
    with pytest.raises(ValueError, match="format must be one of"):
        parse_text("x", "rtf")
