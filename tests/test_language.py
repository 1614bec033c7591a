"""--language auto per window: each 30 s window's language is detected from its own encoder pass and the
window decoded in it (its own <|lang|> token), with the language and its probability on its segments; a
window the safeguards drop is counted and named. A fixed language decodes and writes as before."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from pipelines.asr import TranscribeOptions, transcribe
from pipelines.asr.options import DroppedWindow, Segment, Transcript
from pipelines.asr.outputs import format_json
from pipelines.asr.safeguards import compression_ratio, drop_reason

EN = ("The old lighthouse keeper walked down to the harbour every morning before sunrise. "
      "He checked the boats, counted the nets and wrote the weather in a small blue notebook. "
      "In the winter the wind was so strong that the windows rattled all night long. "
      "His daughter lived in the city and called him every Sunday to ask about the sea. "
      "He told her about the storms, the ships that passed in the distance and the birds on the rocks. "
      "One day a young engineer came to install an automatic lamp, and the keeper showed him every room of the tower. "
      "The engineer stayed for a week, and in the evenings they played cards by the fire.")
DE = ("Am Montag fahre ich mit dem Zug nach Berlin, weil meine Schwester dort Geburtstag hat. "
      "Wir wollen zusammen in ein kleines Restaurant gehen und danach durch den Park spazieren. "
      "Das Wetter soll schön werden, aber am Abend wird es kalt, deshalb nehme ich einen warmen Mantel mit. "
      "Meine Schwester arbeitet als Ärztin in einem großen Krankenhaus und hat nur selten Zeit. "
      "Im Sommer möchten wir gemeinsam an die Ostsee fahren und eine Woche am Strand verbringen. "
      "Die Kinder freuen sich schon sehr auf das Meer, die Sandburgen und das Eis am Nachmittag. "
      "Am Sonntag fahre ich wieder nach Hause, weil ich am Montag früh arbeiten muss.")
GERMAN_WORDS = {"und", "ich", "die", "das", "der", "wir", "mit", "am", "nach", "ein", "einen", "meine", "weil", "hat"}


def test_each_window_is_decoded_in_its_own_language(registry, base_runner, speech_real, monkeypatch):
    """The plumbing, without synthesis: two windows decoded in one step, detection faked to say en then de.
    One encoder pass serves detection and decoding; each row's prompt carries its window's language token;
    the segments carry the language and its probability; the file's language is its first window's."""
    paths = [i["audio_path"] for i in speech_real[:2]]
    encodes, prompts = [], []
    real_encode, real_decode = base_runner.encode, base_runner.decode_encoded
    monkeypatch.setattr(base_runner, "encode", lambda x: encodes.append(x.shape[0]) or real_encode(x))
    monkeypatch.setattr(base_runner, "languages_of", lambda hidden: [("en", 0.91), ("de", 0.62)][: hidden.shape[0]])

    def recording(enc, rows, *args, **kwargs):
        prompts.extend(rows)
        return real_decode(enc, rows, *args, **kwargs)

    monkeypatch.setattr(base_runner, "decode_encoded", recording)
    options = TranscribeOptions(language=None, batch_size=2, temperature=(0.0,))
    got = {r.path: r for r in transcribe(paths, registry.get("whisper-base"), options, base_runner)}
    gen = base_runner.model.generation_config
    en, de = gen.lang_to_id["<|en|>"], gen.lang_to_id["<|de|>"]
    assert encodes == [2]  # detection and decoding share the one encoder pass of the step
    assert [p[1] for p in prompts[:2]] == [en, de]
    first, second = got[str(paths[0])], got[str(paths[1])]
    assert first.language == "en" and second.language == "de"
    assert {(s.language, s.language_probability) for s in first.segments} == {("en", 0.91)}
    assert {(s.language, s.language_probability) for s in second.segments} == {("de", 0.62)}
    assert '"language_probability": 0.62' in format_json(second)


def test_language_probabilities_are_a_softmax_over_language_tokens(base_runner, speech_real):
    """languages_of: the argmax is transformers' detect_language's, the probability in (0, 1]."""
    from transformers.modeling_outputs import BaseModelOutput

    from pipelines.audio import load_audio

    hidden = base_runner.encode(base_runner.feats([load_audio(i["audio_path"]) for i in speech_real[:2]]))
    found = base_runner.languages_of(hidden)
    ids = base_runner.model.detect_language(encoder_outputs=BaseModelOutput(last_hidden_state=hidden)).tolist()
    assert [code for code, _ in found] == [base_runner.tokenizer.convert_ids_to_tokens(i)[2:-2] for i in ids]
    assert [code for code, _ in found] == ["en", "en"] and all(0.5 < p <= 1.0 for _, p in found)


def test_fixed_language_json_has_no_new_keys():
    """A fixed language (and no dropped window) writes the json as before: no language per segment, no
    dropped_windows; a dropped window is named with its times and reason."""
    t = Transcript("a.wav", "hi", 1.0, 0.1, segments=(Segment(0.0, 1.0, "hi"),), language="en")
    data = json.loads(format_json(t))
    assert "dropped_windows" not in data and set(data["segments"][0]) == {
        "start", "end", "text", "avg_logprob", "no_speech_prob", "compression_ratio", "temperature", "no_speech"}
    why = drop_reason(3.1, -0.4, 1.0, TranscribeOptions())
    assert why == "repetitive: compression ratio 3.10 > 2.4 at temperature 1.0"
    dropped = replace(t, dropped=1, dropped_windows=(DroppedWindow(30.0, 60.0, why),))
    assert json.loads(format_json(dropped))["dropped_windows"] == [{"start": 30.0, "end": 60.0, "reason": why}]


def test_summary_names_dropped_windows():
    from pipelines.cli.transcribe import dropped_line

    why = drop_reason(1.2, -1.5, 1.0, TranscribeOptions())
    t = Transcript("/x/talk.wav", "", 90.0, 1.0, dropped=1, dropped_windows=(DroppedWindow(30.0, 60.0, why),))
    assert dropped_line([t]) == ("talk.wav 30.00-60.00 s (unlikely: avg log-probability -1.50 < -1.0 at temperature "
                                 "1.0) (dropped_windows in their json)")


@pytest.fixture(scope="module")
def english_then_german(tmp_path_factory):
    """espeak-ng's en-us voice (32.8 s), 1 s of silence, its de voice (34.5 s): each language fills a window."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng): no German voice to test with")
    from pipelines.audio import SAMPLE_RATE, load_audio, write_wav

    where = tmp_path_factory.mktemp("en-de")
    parts = []
    for voice, text in (("en-us", EN), ("de", DE)):
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(where / f"{voice}.wav"), text], check=True,
                       capture_output=True)
        parts += [load_audio(where / f"{voice}.wav"), np.zeros(SAMPLE_RATE, np.float32)]
    path = where / "en_de.wav"
    write_wav(path, np.concatenate(parts))
    return path


@pytest.mark.slow  # several minutes on 2 CPU cores (fallback decodes of synthetic speech)
def test_english_then_german_keeps_the_german(registry, english_then_german):
    """At c527a67 the German half came out as "Ammuntaq Farah, mith dim tsuklah, feline, meh, meh, meh, ..."
    (decoded with <|en|>); per window it is detected as German and transcribed in German, assisted == plain."""
    options = TranscribeOptions(language=None, batch_size=1, compare=True)
    [t] = transcribe([english_then_german], registry.get("whisper-base+distilled"), options)
    assert t.ok and t.language == "en" and t.identical is True
    english = [s for s in t.segments if s.end < 30]
    german = [s for s in t.segments if s.start > 35]
    assert english and {s.language for s in english} == {"en"}
    assert german and {s.language for s in german} == {"de"}
    assert all(0.5 < s.language_probability <= 1 for s in t.segments)
    text = " ".join(s.text for s in german)
    words = {w.strip(".,").lower() for w in text.split()}
    assert len(words & GERMAN_WORDS) >= 5, text
    assert compression_ratio(text) < 2.4 and "meh, meh" not in text, text
