"""The Streamlit pages driven by streamlit's AppTest: input, run, output, and every error state."""

from __future__ import annotations

import pytest
import yaml

from pipelines.evalsets import project_documents, project_sentences
from pipelines.paths import PROJECT_ROOT
from pipelines.registry import load_registry
from pipelines.text import MAX_INPUT_CHARS, TextOptions, TextRunner

streamlit = pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

UI = PROJECT_ROOT / "ui"


@pytest.fixture
def models(local_models_file, monkeypatch):
    monkeypatch.setenv("TANDEM_MODELS", str(local_models_file))
    return local_models_file


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(UI / f"{name}.py"), default_timeout=300)
    at.run()
    assert not at.exception, at.exception
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_summarize_page_output_speed_quality_and_chart(models):
    doc = project_documents()[0]["document"][:250]
    at = page("summarize")
    at.selectbox(key="pair").set_value("bart-pair")
    at.text_area(key="text").input(doc)
    at.checkbox(key="compare").check()
    at.text_area(key="reference").input(project_documents()[0]["summary"])
    at.button(key="run").click().run()
    assert not at.exception and not at.error
    expected = TextRunner(load_registry(models).get("bart-pair")).summarize(doc, TextOptions()).output
    assert at.text_area(key="output").value == expected
    shown = metrics(at)
    assert shown["Identical to plain"] == "yes"
    assert shown["Speedup"].endswith("x") and shown["Acceptance"].endswith("%")
    assert "ROUGE-1 / ROUGE-L" in shown
    assert len(at.get("vega_lite_chart")) == 2  # latency bars and accepted drafts per round


def test_translate_page_with_languages(models):
    at = page("translate")
    at.selectbox(key="pair").set_value("m2m_100-pair").run()
    at.selectbox(key="src").set_value("eng_Latn").run()
    at.selectbox(key="tgt").set_value("fra_Latn")
    text = project_sentences()[0]
    at.text_area(key="text").input(text)
    at.text_area(key="reference").input("Le train part à sept heures.")
    at.button(key="run").click().run()
    assert not at.exception and not at.error
    runner = TextRunner(load_registry(models).get("m2m_100-pair"))
    assert at.text_area(key="output").value == runner.translate(text, TextOptions(src="eng_Latn", tgt="fra_Latn")).output
    assert "BLEU / chrF" in metrics(at)


def test_text_page_errors_empty_too_large_missing_model_and_broken_registry(models, tmp_path, monkeypatch):
    at = page("summarize")
    at.selectbox(key="pair").set_value("bart-pair")
    at.text_area(key="text").input("   ")
    at.button(key="run").click().run()
    assert "Enter some text" in at.warning[0].value

    at.text_area(key="text").input("word " * (MAX_INPUT_CHARS // 5 + 1))
    at.button(key="run").click().run()
    assert "the limit is" in at.error[0].value

    spec = yaml.safe_load(models.read_text())
    spec["pairs"]["absent"] = {"task": "summarize", "main": {"hub": "nobody/no-such-model", "revision": "main"}}
    other = tmp_path / "models.yaml"
    other.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("TANDEM_MODELS", str(other))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = page("summarize")
    assert any("needs download" in o for o in at.selectbox(key="pair").options)
    at.selectbox(key="pair").set_value("absent")
    at.text_area(key="text").input("Some text.")
    at.button(key="run").click().run()
    assert "cannot be loaded" in at.error[0].value

    other.write_text("pairs: [not, a, mapping\n")
    at = page("summarize")
    assert "registry cannot be read" in at.error[0].value


def test_transcribe_page_sample_upload_and_errors(models, speech_real):
    from pipelines.asr import TranscribeOptions, transcribe
    from pipelines.evalsets import set_dir

    item = speech_real[0]
    at = page("transcribe")
    at.button(key="run").click().run()
    assert "Choose an audio file" in at.warning[0].value

    at.selectbox(key="sample").set_value(item["id"])
    at.checkbox(key="compare").check()
    at.text_area(key="reference").input(item["reference"])
    at.button(key="run").click().run()
    assert not at.exception and not at.error
    pair = load_registry(models).get("whisper-base")
    expected = next(transcribe([set_dir("speech-real") / item["audio"]], pair, TranscribeOptions()))
    assert at.text_area(key="output").value == expected.text
    shown = metrics(at)
    assert shown["Identical to plain"] == "yes" and "WER against the reference" in shown

    at.selectbox(key="sample").set_value("(none)")
    at.file_uploader(key="upload").set_value(("notes.wav", b"this is text, not audio", "audio/wav"))
    at.button(key="run").click().run()
    assert "cannot be read as audio" in at.error[0].value

    audio = (set_dir("speech-real") / item["audio"]).read_bytes()
    at.file_uploader(key="upload").set_value((item["audio"].split("/")[-1], audio, "audio/wav"))
    at.checkbox(key="compare").uncheck()
    at.checkbox(key="chunked").check()  # a clip under 30 s is one window either way
    at.button(key="run").click().run()
    assert at.text_area(key="output").value == expected.text
