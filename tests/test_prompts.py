"""Text prompts (asr/prompts.py): initial_prompt, hotwords and condition_on_previous_text change the
transcript as in whisper/faster-whisper, and the assistant still gives the main model's own tokens."""

import numpy as np
import pytest

from pipelines.asr import TranscribeOptions, transcribe
from pipelines.asr.prompts import MAX_PROMPT_TOKENS, PromptHistory, window_prompt

SOT = [50258, 50259, 50359, 50363]  # <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>
PREV = 50361


def test_window_prompt_is_faster_whispers_layout_and_keeps_223_tokens():
    assert window_prompt(SOT, PREV, [], []) == SOT  # no text: the start-of-transcript tokens alone
    assert window_prompt(SOT, PREV, [1, 2], [3]) == [PREV, 1, 2, 3, *SOT]
    long = list(range(1000))
    prompt = window_prompt(SOT, PREV, [7] * 10, long)
    assert prompt[1:11] == [7] * 10 and prompt[11:-len(SOT)] == long[-(MAX_PROMPT_TOKENS - 10):]
    assert len(prompt) == 1 + MAX_PROMPT_TOKENS + len(SOT)
    assert window_prompt(SOT, None, [1], [2]) == SOT  # a model without <|startofprev|> takes no prompt


def test_history_keeps_text_only_when_conditioning_and_resets_on_a_hot_fallback():
    h = PromptHistory([1, 2])
    h.add([3], 0.0, condition=True, reset_on_temperature=0.5)
    assert h.tokens == [1, 2, 3]
    h.add([4], 0.6, condition=True, reset_on_temperature=0.5)  # whisper's prompt_reset_on_temperature
    assert h.tokens == []
    h = PromptHistory([1, 2])
    h.add([3], 0.0, condition=False, reset_on_temperature=0.5)  # the initial prompt serves the first window only
    assert h.tokens == []


def test_condition_on_previous_text_needs_sequential_long_form():
    with pytest.raises(ValueError, match="sequential"):
        TranscribeOptions(condition_on_previous_text=True, long_form="chunked")


def _clip(speech_real, name):
    return next(i for i in speech_real if i["id"] == name)["audio_path"]


@pytest.mark.parametrize("prompt", [{"hotwords": "metres"}, {"initial_prompt": "Go forward 10 metres."}])
def test_a_prompt_spells_a_word_as_it_does_and_assisted_equals_plain(speech_real, registry, prompt):
    pair = registry.get("whisper-base+distilled")
    clip = _clip(speech_real, "goforward")
    (plain,) = transcribe([clip], pair, TranscribeOptions(compare=True))
    (prompted,) = transcribe([clip], pair, TranscribeOptions(compare=True, **prompt))
    assert "meters" in plain.text and "metres" not in plain.text
    assert "metres" in prompted.text
    assert plain.identical and prompted.identical  # assisted tokens == the main model's own greedy tokens


def test_previous_text_conditions_each_window_of_a_long_file_exactly(speech_real, registry, tmp_path):
    """A 45 s file of the Austen clips (two windows); with the previous text as prompt both windows decode
    with the assistant to the main model's own tokens (rows of different prompt lengths in one run)."""
    from pipelines.audio import SAMPLE_RATE, load_audio, write_wav

    clips = [load_audio(i["audio_path"]) for i in speech_real if i["id"].startswith("librivox")]
    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    audio = np.concatenate([x for c in clips + clips[:3] for x in (c, gap)])
    assert len(audio) > 35 * SAMPLE_RATE
    path = tmp_path / "austen.wav"
    write_wav(path, audio)
    pair = registry.get("whisper-base+distilled")
    options = TranscribeOptions(compare=True, condition_on_previous_text=True, temperature=(0.0,), batch_size=2)
    short = _clip(speech_real, "goforward")
    long, other = sorted(transcribe([path, short], pair, options), key=lambda t: -t.duration)
    assert len(long.segments) > 2 and long.identical and other.identical
    assert "Dashwood" in long.text


def test_a_prompt_past_whispers_limit_is_refused_before_any_weights_load(speech_real, monkeypatch, capsys):
    from pipelines.cli import main
    from pipelines.models import pairs

    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    code = main(["transcribe", _clip(speech_real, "goforward"), "--hotwords", "word " * 300])
    err = capsys.readouterr().err
    assert code == 2 and "hotwords is 300 tokens" in err and len(err.strip().splitlines()) == 1


def test_prefix_tokens_follow_a_timestamp_when_decoding_with_timestamps():
    from transformers import WhisperTokenizer

    from pipelines.asr.prompts import prefix_tokens
    from pipelines.models.embedded import embedded_path

    tokenizer = WhisperTokenizer.from_pretrained(embedded_path("whisper-base"))
    words = tokenizer.encode(" Go forward ten", add_special_tokens=False)
    assert prefix_tokens(tokenizer, "  Go forward ten ", None) == words  # whisper's: a leading space, stripped
    assert prefix_tokens(tokenizer, "Go forward ten", 50364) == [50364, *words]  # <|0.00|> first (faster-whisper's)
    assert prefix_tokens(tokenizer, " ", 50364) == prefix_tokens(tokenizer, None, 50364) == []


@pytest.mark.parametrize("timestamps", [False, True])
def test_a_prefix_starts_the_transcript_and_assisted_equals_plain(speech_real, registry, timestamps):
    """faster-whisper's prefix: the first window's text starts with it (here against what the audio says plainly,
    "Go forward 10 meters."), the model going on from it; with the assistant the same tokens as without."""
    pair = registry.get("whisper-base+distilled")
    clip = _clip(speech_real, "goforward")
    (plain,) = transcribe([clip], pair, TranscribeOptions(compare=True, timestamps=timestamps))
    (prefixed,) = transcribe([clip], pair, TranscribeOptions(compare=True, timestamps=timestamps,
                                                             prefix="Go forward ten"))
    assert plain.text.startswith("Go forward 10")
    assert prefixed.text.startswith("Go forward ten") and len(prefixed.text) > len("Go forward ten")
    assert prefixed.segments[0].text.startswith("Go forward ten")
    assert plain.identical and prefixed.identical


def test_a_prefix_and_a_prompt_past_whispers_limit_together_are_one_line_before_weights(speech_real, monkeypatch,
                                                                                         capsys):
    from pipelines.cli import main
    from pipelines.models import pairs

    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    code = main(["transcribe", _clip(speech_real, "goforward"), "--initial-prompt", "word " * 150,
                 "--prefix", "word " * 100])
    err = capsys.readouterr().err
    assert code == 2 and "initial_prompt and prefix together are 250 tokens" in err
    assert len(err.strip().splitlines()) == 1
