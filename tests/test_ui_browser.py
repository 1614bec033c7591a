"""A real browser (Debian's chromium, driven by Playwright; no browser download) against ``tandem ui`` served
on 127.0.0.1, in one session: a summarization with a local test pair (copy to the clipboard, txt download),
text kept when another page is clicked right after typing, a transcription with the embedded Whisper (txt,
srt, vtt and json downloads equal to the CLI's writers) and a long transcription stopped half-way.
Screenshots go to $TANDEM_SCREENSHOTS (default: this test's tmp folder)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ui_server import PATIENCE_S, free_port, wait_healthy

from pipelines.cli import ui_command
from pipelines.models.registry import load_registry
from pipelines.paths import PROJECT_ROOT
from pipelines.quality.sets import project_documents, set_dir
from pipelines.text import TextOptions, TextRunner

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium is not installed (apt-get install chromium)")


@pytest.fixture
def server(local_models_file):
    port = free_port()
    env = dict(os.environ, TANDEM_MODELS=str(local_models_file), HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(ui_command(port), cwd=PROJECT_ROOT / "ui", env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    if not wait_healthy(url, proc):
        proc.kill()
        pytest.fail(f"the app did not start: {proc.stdout.read().decode()[-2000:]}")
    yield url
    proc.terminate()
    proc.wait(timeout=PATIENCE_S)


def _fill(page, label: str, text: str) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(text)
    box.press("Control+Enter")  # commits a Streamlit text area
    _settle(page)


def _settle(page) -> None:
    """Wait until the app has finished rerunning (an upload reruns the page; a click during that rerun is lost)."""
    page.wait_for_timeout(300)
    page.locator('[data-testid="stStatusWidget"]').wait_for(state="hidden")


def _press_until(page, button: str, shown, tries: int = 3) -> None:
    """Click ``button`` until ``shown`` (a locator) appears, as a user clicks again when nothing happens (a click
    that lands while the page is still rerunning after an upload is dropped by the app). Waits for the outcome,
    not for a time: once the click is seen taken (the app's running indicator or its Stop button shows) the
    result is awaited however slow the machine is; only a click after which nothing at all happened is
    repeated, after a grace that grows each time (10, 30 s), and the last one waits out PATIENCE_S."""
    import time

    def active() -> bool:
        return any(loc.count() and loc.first.is_visible() for loc in (
            page.locator('[data-testid="stStatusWidget"]'), page.get_by_role("button", name="Stop")))

    deadline = time.monotonic() + PATIENCE_S
    for attempt in range(tries):
        _settle(page)
        page.get_by_role("button", name=button).click()
        clicked, taken = time.monotonic(), False
        grace = 10.0 * 3**attempt if attempt < tries - 1 else PATIENCE_S
        while time.monotonic() < deadline:
            if shown.count() and shown.first.is_visible():
                return
            taken = taken or active()
            if not taken and time.monotonic() - clicked > grace:
                break  # nothing happened: the click was dropped, click again
            page.wait_for_timeout(250)
        else:
            raise AssertionError(f"{button}: nothing shown within {PATIENCE_S:.0f} s")
    raise AssertionError(f"{button}: clicked {tries} times, nothing happened")


def _download(page, label: str) -> str:
    with page.expect_download() as info:
        page.get_by_role("button", name=label).click()
    return Path(info.value.path()).read_text(encoding="utf-8")


def _nav(page, title: str) -> None:
    """Click a page in the sidebar and wait for its heading."""
    page.locator('[data-testid="stSidebarNav"] a', has_text=title).click()
    page.get_by_role("heading", name=title).wait_for()


def _type_and_leave(page, label: str, text: str, title: str) -> None:
    """Type into a box and click another page at once, without committing the text: the box's blur (which
    sends the text) and the page change leave the browser together, as when a user's click lands at once.
    Where the app takes that click as the commit only (it may, by timing), the user clicks again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    box = page.get_by_label(label, exact=True)
    box.fill(text)
    box.evaluate("""(box, title) => { box.blur();
        [...document.querySelectorAll('[data-testid="stSidebarNav"] a')].find(a => a.textContent.includes(title)).click(); }""",
                 title)
    try:
        page.get_by_role("heading", name=title).wait_for(timeout=5000)
    except PlaywrightTimeout:
        _nav(page, title)


def _long_clip(items, folder: Path) -> Path:
    """About 300 s of speech (clips joined, the set repeated past 40 s): ten 30 s windows, so a Stop lands
    mid-way even on an idle machine (70 s was decoded before the click on one). A window holding a clip twice
    would read as a repetition loop to the compression check (and fall back through five temperatures), so the
    set is repeated only at its end."""
    import numpy as np
    import soundfile as sf

    clips = [sf.read(set_dir("speech-real") / it["audio"], dtype="float32")[0] for it in items]
    audio = np.concatenate(clips)
    audio = np.tile(audio, int(np.ceil(300 * 16000 / len(audio))))[: 300 * 16000]
    path = folder / "long.wav"
    sf.write(path, audio, 16000)
    return path


def test_the_pages_in_a_real_browser(server, local_models_file, speech_real, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from pipelines.asr import TranscribeOptions, transcribe
    from pipelines.asr.outputs import render

    shots = Path(os.environ.get("TANDEM_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    doc = project_documents()[1]["document"][:250]
    expected_summary = TextRunner(load_registry(local_models_file).get("bart-pair")).summarize(doc, TextOptions()).output
    item = speech_real[1]
    audio = set_dir("speech-real") / item["audio"]
    expected = next(transcribe([audio], load_registry(local_models_file).get("whisper-base"),
                               TranscribeOptions(timestamps=True)))  # the CLI's -f all
    long_clip = _long_clip(speech_real, tmp_path)  # every clip once per window: no repeated text, no fallback

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1200, "height": 1600}, accept_downloads=True,
                                      permissions=["clipboard-read", "clipboard-write"])
        page = context.new_page()
        # every wait below is for an outcome (a heading, an output, a download) within PATIENCE_S
        page.set_default_timeout(int(os.environ.get('PW_TIMEOUT', str(int(PATIENCE_S * 1000)))))

        # Summarize: the output can be selected and copied, and downloaded as txt
        page.goto(f"{server}/summarize")
        page.get_by_role("heading", name="Summarize").wait_for()
        _fill(page, "Text", doc)
        page.get_by_role("button", name="Summarize").click()
        output = page.get_by_label("Output", exact=True)
        output.wait_for()
        assert output.input_value() == expected_summary and output.is_editable()
        output.select_text()
        page.keyboard.press("Control+C")
        assert page.evaluate("navigator.clipboard.readText()") == expected_summary
        assert _download(page, "Download txt") == expected_summary + "\n"
        page.screenshot(path=str(shots / "summarize.png"), full_page=True)

        # Translate: text typed and not committed survives a click on another page that lands at once (twice,
        # from a fresh load: the blur's rerun and the page change's then meet on the server)
        for n in range(2):
            page.goto(server)  # Translate is the first page
            page.get_by_role("heading", name="Translate").wait_for()
            _settle(page)
            _type_and_leave(page, "Text", f"Typed, then straight to another page ({n}).", "Summarize")
            _nav(page, "Translate")
            # the page's widgets fill in after its heading, and for a moment the old page's box may still be in
            # the document beside the new one: wait until the box on the page holds the text
            page.wait_for_function("""text => [...document.querySelectorAll('textarea[aria-label="Text"]')]
                .some(box => box.value === text && box.isConnected && box.offsetParent !== null)""",
                                   arg=f"Typed, then straight to another page ({n}).")
        page.screenshot(path=str(shots / "translate.png"), full_page=True)

        # Transcribe: an upload, the transcript and the four downloads (the CLI's writers)
        _nav(page, "Transcribe")
        assert not page.locator("input[type=file]").get_attribute("accept")  # every container (.mov, .avi, ...)
        page.locator("input[type=file]").set_input_files(str(audio))
        page.get_by_text(re.compile(r"^\d+(\.\d+)?KB$")).first.wait_for()  # the uploaded file's chip
        transcript = page.get_by_label("Transcript", exact=True)
        _press_until(page, "Transcribe", transcript)
        text = transcript.input_value()
        downloads = {fmt: _download(page, f"Download {fmt}") for fmt in ("txt", "srt", "vtt", "json")}
        page.screenshot(path=str(shots / "transcribe.png"), full_page=True)

        # A long file: progress, then Stop
        page.locator("input[type=file]").set_input_files(str(long_clip))
        page.get_by_text("long.wav").first.wait_for()
        _press_until(page, "Transcribe", page.get_by_text(re.compile(r"window \d+ of (about )?\d+, [\d:]+ of [\d:]+ of audio")).first)
        page.screenshot(path=str(shots / "progress.png"), full_page=True)
        page.get_by_role("button", name="Stop").click()
        page.get_by_text("Stopped. Nothing was kept").wait_for()
        expect(page.get_by_label("Transcript", exact=True)).to_have_count(0)  # nothing kept (stale elements go)
        page.screenshot(path=str(shots / "stopped.png"), full_page=True)
        browser.close()

    assert text == expected.text and text
    for fmt in ("txt", "srt", "vtt"):
        assert downloads[fmt] == render(expected, fmt), fmt
    data = json.loads(downloads["json"])
    assert data["text"] == expected.text and data["path"] == audio.name
    assert [s["text"] for s in data["segments"]] == [s.text for s in expected.segments]
    for name in ("summarize", "translate", "transcribe", "progress", "stopped"):
        assert (shots / f"{name}.png").stat().st_size > 10_000, name
    print(f"screenshots in {shots}", file=sys.stderr)
