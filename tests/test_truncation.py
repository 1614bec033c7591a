"""An output cut by a limit says so: a text row stopped at --max-new-tokens, a summary of an input truncated to
the model's window, and a Whisper window stopped at its token limit carry finish_reason "length" (OpenAI's and
transformers' name; "stop" otherwise), a note on the command line and in the transcript's json."""

from __future__ import annotations

import io
import json

from pipelines.models.registry import load_registry
from pipelines.quality.sets import project_documents
from pipelines.text import TextOptions, TextRunner


def test_a_summary_cut_by_max_new_tokens_says_so(local_models_file):
    runner = TextRunner(load_registry(local_models_file).get("bart-pair"))
    doc = project_documents()[0]["document"][:250]
    cut = runner.summarize(doc, TextOptions(max_new_tokens=2))
    assert cut.finish_reason == "length" and cut.cut_rows == 1
    assert any("cut by the token limit (2 new tokens)" in note for note in cut.notes)
    # these small random models never reach their end of sequence: a row that does is "stop" at any length
    eos, limit = runner.gen.eos_token_id, TextOptions(max_new_tokens=2)
    assert runner._cut_rows([[5, eos], [eos], [5, 6]], limit) == 1
    long_doc = " ".join(d["document"] for d in project_documents()[:3])  # far over the window
    truncated = runner.summarize(long_doc, TextOptions(max_new_tokens=8, long_input="truncate"))
    assert truncated.finish_reason == "length" and "truncated" in truncated.notes[0]


def test_translation_rows_cut_are_counted(local_models_file):
    runner = TextRunner(load_registry(local_models_file).get("m2m_100-pair"))
    pair = runner.pair
    src, tgt = pair.languages[0], pair.languages[1]
    result = runner.translate("The library opens at nine. It closes at five.", TextOptions(src=src, tgt=tgt,
                                                                                          max_new_tokens=1))
    assert result.finish_reason == "length" and result.cut_rows == 2 and "2 of 2 rows" in result.notes[-1]


def test_the_cli_line_says_the_summary_was_cut(local_models_file, monkeypatch, capsys):
    from pipelines.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO(project_documents()[1]["document"][:250]))
    assert main(["--models", str(local_models_file), "summarize", "--pair", "bart-pair", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert "note: output cut by the token limit (2 new tokens): finish_reason length" in err


def test_a_whisper_window_cut_by_its_token_limit(registry, speech_real, tmp_path, capsys):
    from pipelines.asr import TranscribeOptions, transcribe
    from pipelines.asr.outputs import format_json
    from pipelines.cli.transcribe import summary_lines  # noqa: F401  (the CLI's summary names the cut windows)

    clip = next(i for i in speech_real if i["id"] == "goforward")["audio_path"]
    pair = registry.get("whisper-base")
    options = TranscribeOptions(max_new_tokens=3, temperature=(0.0,), compression_ratio_threshold=None,
                                logprob_threshold=None)
    cut = next(transcribe([clip], pair, options))
    assert cut.ok and cut.finish_reason == "length" and cut.cut == 1
    assert json.loads(format_json(cut))["finish_reason"] == "length"
    whole = next(transcribe([clip], pair, TranscribeOptions()))
    assert whole.finish_reason == "stop" and whole.cut == 0
    assert json.loads(format_json(whole))["finish_reason"] == "stop"
