"""A real browser (Debian's chromium, driven by Playwright; no browser download) against ``tandem ui`` served
on 127.0.0.1: one summarization with a local test pair and one transcription with the embedded Whisper.
Screenshots go to $TANDEM_SCREENSHOTS (default: this test's tmp folder)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipelines.cli import ui_command
from pipelines.evalsets import project_documents, set_dir
from pipelines.paths import PROJECT_ROOT
from pipelines.registry import load_registry
from pipelines.text import TextOptions, TextRunner

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(local_models_file):
    port = _free_port()
    env = dict(os.environ, TANDEM_MODELS=str(local_models_file), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(ui_command(port), cwd=PROJECT_ROOT / "ui", env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).read() == b"ok":
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"the app did not start: {proc.stdout.read().decode()[-2000:]}")
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def _fill(page, label: str, text: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(text)
    box.press("Control+Enter")  # commits a Streamlit text area
    page.wait_for_timeout(500)


def test_summarize_and_transcribe_in_a_real_browser(server, local_models_file, speech_real, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = Path(os.environ.get("TANDEM_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    doc = project_documents()[1]["document"][:250]
    expected_summary = TextRunner(load_registry(local_models_file).get("bart-pair")).summarize(doc, TextOptions()).output
    item = speech_real[1]
    audio = set_dir("speech-real") / item["audio"]

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1200, "height": 1600})
        page.set_default_timeout(int(os.environ.get('PW_TIMEOUT', '120000')))

        page.goto(f"{server}/summarize")
        page.get_by_text("Summarize", exact=True).first.wait_for()
        _fill(page, "Text", doc)
        page.get_by_role("button", name="Summarize").click()
        output = page.get_by_label("Output", exact=True)
        output.wait_for()
        assert output.input_value() == expected_summary
        page.screenshot(path=str(shots / "summarize.png"), full_page=True)

        page.goto(f"{server}/transcribe")
        page.locator("input[type=file]").set_input_files(str(audio))
        page.get_by_text(re.compile(r"^\d+(\.\d+)?KB$")).first.wait_for()  # the uploaded file's chip
        page.get_by_role("button", name="Transcribe").click()
        transcript = page.get_by_label("Transcript", exact=True)
        transcript.wait_for()
        text = transcript.input_value()
        page.screenshot(path=str(shots / "transcribe.png"), full_page=True)
        browser.close()

    from pipelines.asr import TranscribeOptions, transcribe

    expected = next(transcribe([audio], load_registry(local_models_file).get("whisper-base"), TranscribeOptions()))
    assert text == expected.text and text
    assert (shots / "summarize.png").stat().st_size > 10_000 and (shots / "transcribe.png").stat().st_size > 10_000
    print(f"screenshots in {shots}", file=sys.stderr)
