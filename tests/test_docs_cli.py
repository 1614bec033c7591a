"""The CLI reference (docs/cli.md) is generated from the parser and current; the ecosystem's spellings and the
older ones parse to the same options."""

from pathlib import Path

import pytest

from pipelines.cli.docs import render_cli_reference
from pipelines.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_docs_cli_md_is_what_the_parser_generates():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert text == render_cli_reference(), "docs/cli.md is stale: python -m pipelines.cli.docs > docs/cli.md"


def test_the_reference_names_every_command_and_option():
    text = render_cli_reference()
    for command in ("tandem transcribe", "tandem bench asr", "tandem bench text", "tandem distill", "tandem eval"):
        assert f"## `{command}`" in text
    assert "`-o DIR`, `--output-dir DIR`, `--out DIR` (alias `--output_dir`)" in text
    assert "`-m NAME`, `--model NAME`, `--pair NAME`" in text


@pytest.mark.parametrize("new, old", [
    (["transcribe", "x.wav", "-o", "out", "-f", "srt"], ["transcribe", "x.wav", "--out", "out", "--formats", "srt"]),
    (["transcribe", "x.wav", "--output-dir", "out", "--output-format", "srt"],
     ["transcribe", "x.wav", "--output_dir", "out", "--output_format", "srt"]),
    (["transcribe", "x.wav", "-m", "whisper-base+distilled"], ["transcribe", "x.wav", "--pair", "whisper-base+distilled"]),
    (["transcribe", "x.wav", "--model", "whisper-base"], ["transcribe", "x.wav", "--pair", "whisper-base"]),
    (["translate", "--model", "p", "--src", "en", "--tgt", "de", "hi"], ["translate", "--pair", "p", "--src", "en",
                                                                         "--tgt", "de", "hi"]),
    (["summarize", "-m", "p", "text"], ["summarize", "--pair", "p", "text"]),
    (["eval", "-m", "p", "--set", "speech-real", "--report", "r.json"],
     ["eval", "--pair", "p", "--set", "speech-real", "--json", "r.json"]),
    (["bench", "asr", "--set", "speech-real", "--report", "r.json"], ["bench", "asr", "--sets", "speech-real",
                                                                        "--json", "r.json"]),
    (["bench", "scale", "--actor-counts", "1,2,4"], ["bench", "scale", "--actors", "1,2,4"]),
    (["distill", "--main", "whisper-base", "-o", "d"], ["distill", "--main", "whisper-base", "--out", "d"]),
])
def test_old_spellings_parse_as_the_new_ones(new, old):
    parse = build_parser().parse_args
    a, b = vars(parse(new)), vars(parse(old))
    a.pop("func"), b.pop("func")
    assert a == b


def test_the_task_is_named_by_the_set_and_older_task_options_still_parse():
    parse = build_parser().parse_args
    assert not hasattr(parse(["eval", "-m", "p", "--set", "speech-real"]), "task")
    assert parse(["eval", "--task", "asr", "--pair", "p", "--set", "speech-real"]).task == "asr"
    assert parse(["bench", "text", "--set", "translate-udhr"]).set == "translate-udhr"
    assert parse(["bench", "text", "--task", "translate"]).task == "translate"


def test_help_says_each_default_once(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["transcribe", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps at the terminal's width
    assert "-o DIR, --output-dir DIR, --out DIR" in out and "--output_dir" not in out
    assert out.count("(default: 4)") == 1  # --batch-size, said by the formatter
    assert "(default: None)" not in out and "(default: False)" not in out
