"""``tandem transcribe --beam-size/--patience/--length-penalty/--best-of``: whisper's names reach
``TranscribeOptions``, and a combination whisper would not use is one line before any weights load."""

from __future__ import annotations

import pytest


def _clip(speech_real) -> str:
    return next(i for i in speech_real if i["id"] == "goforward")["audio_path"]


def test_search_flags_reach_transcribe_options():
    from pipelines.cli.parser import build_parser
    from pipelines.cli.transcribe import transcribe_options

    args = build_parser().parse_args(["transcribe", "x.wav", "--beam-size", "3", "--patience", "2",
                                      "--length-penalty", "0.6", "--best-of", "4"])
    options = transcribe_options(args, ("txt",))
    assert (options.beam_size, options.patience, options.length_penalty, options.best_of) == (3, 2.0, 0.6, 4)
    plain = transcribe_options(build_parser().parse_args(["transcribe", "x.wav"]), ("txt",))
    assert (plain.beam_size, plain.patience, plain.length_penalty, plain.best_of) == (None, None, None, None)


@pytest.mark.parametrize("flags, message", [
    (["--patience", "2"], "patience needs beam_size"),
    (["--beam-size", "3", "--temperature", "0.2,0.4"], "temperature 0"),
    (["--best-of", "3", "--temperature", "0"], "above 0"),
    (["--length-penalty", "0.5"], "needs beam_size or best_of"),
    (["--beam-size", "2", "--length-penalty", "1.5"], "from 0 to 1"),
])
def test_a_search_combination_whisper_refuses_is_one_line_before_weights(speech_real, monkeypatch, capsys, flags,
                                                                          message):
    from pipelines.cli import main
    from pipelines.models import pairs

    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    code = main(["transcribe", _clip(speech_real), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--beam-size", "--best-of"])
def test_a_count_below_one_is_an_argument_error(flag, capsys):
    from pipelines.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["transcribe", "x.wav", flag, "0"])
    assert stop.value.code == 2 and "from 1" in capsys.readouterr().err
