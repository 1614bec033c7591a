"""openai/whisper's underscore spellings of ``tandem transcribe``'s options (``--beam_size 5``,
``--word_timestamps True``): each parses to what Tandem's own spelling gives, and --help lists neither."""

from __future__ import annotations

import pytest

from pipelines.cli.arguments import WHISPER_SPELLINGS
from pipelines.cli.parser import build_parser

# per option: (whisper's argv, Tandem's argv giving the same value); flags as whisper writes them (str2bool)
CASES = {
    "--initial-prompt": (["--initial_prompt", "Dashwood."], ["--initial-prompt", "Dashwood."]),
    "--condition-on-previous-text": (["--condition_on_previous_text", "True"], ["--condition-on-previous-text"]),
    "--prompt-reset-on-temperature": (["--prompt_reset_on_temperature", "0.3"], ["--prompt-reset-on-temperature", "0.3"]),
    "--beam-size": (["--beam_size", "5"], ["--beam-size", "5"]),
    "--best-of": (["--best_of", "3"], ["--best-of", "3"]),
    "--length-penalty": (["--length_penalty", "0.6"], ["--length-penalty", "0.6"]),
    "--compression-ratio-threshold": (["--compression_ratio_threshold", "2.2"], ["--compression-ratio-threshold", "2.2"]),
    "--logprob-threshold": (["--logprob_threshold", "off"], ["--logprob-threshold", "off"]),
    "--no-speech-threshold": (["--no_speech_threshold", "0.5"], ["--no-speech-threshold", "0.5"]),
    "--word-timestamps": (["--word_timestamps", "True"], ["--word-timestamps"]),
    "--prepend-punctuations": (["--prepend_punctuations", "¿("], ["--prepend-punctuations", "¿("]),
    "--append-punctuations": (["--append_punctuations", ".,"], ["--append-punctuations", ".,"]),
    "--highlight-words": (["--highlight_words", "true"], ["--highlight-words"]),
    "--max-line-width": (["--max_line_width", "42"], ["--max-line-width", "42"]),
    "--max-line-count": (["--max_line_count", "2"], ["--max-line-count", "2"]),
    "--max-words-per-line": (["--max_words_per_line", "6"], ["--max-words-per-line", "6"]),
}


def _parse(argv):
    return vars(build_parser().parse_args(["transcribe", "x.wav", *argv]))


def test_every_whisper_spelling_has_a_case():
    assert set(CASES) == set(WHISPER_SPELLINGS)


@pytest.mark.parametrize("name", WHISPER_SPELLINGS)
def test_whispers_spelling_parses_to_the_same_value(name):
    whisper, tandem = CASES[name]
    got, want = _parse(whisper), _parse(tandem)
    assert got == want and got != _parse([])  # the same value, and not the default


def test_whispers_false_turns_a_flag_off_and_a_bare_flag_on():
    assert _parse(["--word_timestamps", "False"])["word_timestamps"] is False
    assert _parse(["--condition-on-previous-text", "--condition_on_previous_text", "False"])[
        "condition_on_previous_text"] is False
    assert _parse(["--word_timestamps"])["word_timestamps"] is True


def test_a_flag_value_other_than_true_or_false_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["transcribe", "x.wav", "--word_timestamps", "maybe"])
    assert "expected True or False, not 'maybe'" in capsys.readouterr().err


def test_help_lists_tandems_spelling_only():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = sub.choices["transcribe"].format_help()
    assert "--beam-size" in text and "--beam_size" not in text and "--word_timestamps" not in text
