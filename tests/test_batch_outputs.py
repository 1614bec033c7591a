"""A batch run never loses or overwrites a result: odd names, links, name collisions, unusable --out, a
second run on the same folder, file modes, and a model hub that cannot be reached."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipelines.cli import main

PAIR = ["--pair", "whisper-base"]  # plain decoding: these tests are about files, not drafting


@pytest.fixture(scope="module")
def clips(speech_real):
    by_id = {i["id"]: Path(i["audio_path"]) for i in speech_real}
    return by_id["goforward"], by_id["forever"]


def _no_models(monkeypatch):
    """Fail the test if a model would load (checks must come first)."""
    from pipelines.asr import batching

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the run's checks")

    monkeypatch.setattr(batching, "WhisperRunner", refuse)


def test_undecodable_name_next_to_a_good_file(tmp_path, clips, capsys):
    """A name that is not UTF-8 (latin-1 0xE9, legal on Linux) is transcribed like any other; the good file
    beside it too; names print escaped."""
    folder = tmp_path / "in"
    folder.mkdir()
    odd = os.fsdecode(bytes(folder) + b"/caf\xe9.wav")
    shutil.copy(clips[0], odd)
    shutil.copy(clips[1], folder / "good.wav")
    out = tmp_path / "out"
    assert main(["transcribe", str(folder), "--out", str(out), "--formats", "txt,json", *PAIR]) == 0
    printed = capsys.readouterr().out
    assert "caf\\xe9.wav" in printed and "files:           2 (0 failed)" in printed
    assert "go forward" in Path(os.fsdecode(bytes(out) + b"/caf\xe9.txt")).read_text().lower()
    assert (out / "good.txt").read_text().strip()
    data = json.loads(Path(os.fsdecode(bytes(out) + b"/caf\xe9.json")).read_bytes().decode("utf-8"))  # valid UTF-8
    assert data["path"].endswith("caf\\xe9.wav")


def test_same_name_other_extension_keeps_both(tmp_path, clips, capsys):
    """talk.wav and talk.mp3 with different speech: both transcripts kept (the extension disambiguates,
    and the run says so); a re-run finds both done and never takes one's record for the other's."""
    import soundfile as sf

    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(clips[0], folder / "talk.wav")
    sf.write(folder / "talk.mp3", sf.read(clips[1])[0], 16000, format="MP3")
    out = tmp_path / "out"
    assert main(["transcribe", str(folder), "--out", str(out), *PAIR]) == 0
    printed = capsys.readouterr().out
    assert "names collide" in printed and "talk.wav.*" in printed
    assert "go forward" in (out / "talk.wav.txt").read_text().lower()
    assert "forever" in (out / "talk.mp3.txt").read_text().lower()
    assert not (out / "talk.txt").exists()
    for _ in range(2):  # re-runs: both skipped, the same files every time
        assert main(["transcribe", str(folder), "--out", str(out), *PAIR]) == 0
        assert "resuming: 2 of 2 files already done" in capsys.readouterr().out
    assert "go forward" in (out / "talk.wav.txt").read_text().lower()


def test_same_relative_name_under_two_folders(tmp_path, clips, capsys):
    for sub, clip in (("a", clips[0]), ("b", clips[1])):
        (tmp_path / sub).mkdir()
        shutil.copy(clip, tmp_path / sub / "x.wav")
    out = tmp_path / "out"
    assert main(["transcribe", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), *PAIR]) == 0
    texts = sorted(p.read_text().lower() for p in out.glob("x.wav-*.txt"))
    assert len(texts) == 2 and "forever" in texts[0] + texts[1] and "go forward" in texts[0] + texts[1]


def test_links_keep_their_names_and_dangling_links_fail(tmp_path, clips, capsys):
    """A link to a file outside the folder is named after the link, the other outputs stay where they were;
    a dangling link is a failure with its reason."""
    elsewhere = tmp_path / "elsewhere" / "deep"
    elsewhere.mkdir(parents=True)
    shutil.copy(clips[1], elsewhere / "target.wav")
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(clips[0], folder / "sub" / "a.wav")
    (folder / "link.wav").symlink_to(elsewhere / "target.wav")
    (folder / "gone.wav").symlink_to(tmp_path / "missing.wav")
    out = tmp_path / "out"
    assert main(["transcribe", str(folder), "--out", str(out), *PAIR]) == 1
    printed = capsys.readouterr().out
    assert (out / "sub" / "a.txt").is_file() and "forever" in (out / "link.txt").read_text().lower()
    assert "gone.wav  FAILED: broken symbolic link" in printed
    failures = (out / "failures.tsv").read_text().splitlines()
    assert failures[0] == "path\treason\ttime" and "gone.wav\tbroken symbolic link" in failures[1]


def test_unusable_out_is_known_before_any_model_loads(tmp_path, clips, capsys, monkeypatch):
    _no_models(monkeypatch)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for out, why in ((a_file, "is not a folder"), (a_file / "sub", "cannot be created")):
        # before any model loads (_no_models fails the test otherwise): an outcome, not a time on this machine
        assert main(["transcribe", str(clips[0]), "--out", str(out), *PAIR]) == 2
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1
    assert main(["transcribe", str(tmp_path / "nothing.wav"), "--out", str(tmp_path / "o"), *PAIR]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_one_run_per_output_folder_and_failures_accumulate(tmp_path, clips, capsys, monkeypatch):
    from pipelines.asr.inputs import find_inputs
    from pipelines.asr.outputs import OutputTree

    out = tmp_path / "out"
    holder = OutputTree(out, find_inputs([str(clips[0])])[0], ("txt",), "sig")
    holder.open()  # another run holds the folder
    try:
        with monkeypatch.context() as m:
            _no_models(m)
            assert main(["transcribe", str(clips[0]), "--out", str(out), *PAIR]) == 2
        assert "is in use by tandem run pid" in capsys.readouterr().err
    finally:
        holder.close()
    for name in ("bad1.wav", "bad2.wav"):  # two runs, each with a failure: both lines stay
        (tmp_path / name).write_text("not audio")
        assert main(["transcribe", str(tmp_path / name), "--out", str(out), *PAIR]) == 1
    lines = (out / "failures.tsv").read_text().splitlines()
    assert [Path(line.split("\t")[0]).name for line in lines[1:]] == ["bad1.wav", "bad2.wav"]


def test_outputs_take_the_umask(tmp_path, clips, capsys):
    from pipelines.paths import FILE_MODE

    umask = os.umask(0o022)
    os.umask(umask)
    out = tmp_path / "out"
    (tmp_path / "bad.wav").write_text("not audio")
    assert main(["transcribe", str(clips[0]), str(tmp_path / "bad.wav"), "--out", str(out), "--formats", "txt,srt", *PAIR]) == 1
    written = [p for p in out.iterdir() if p.is_file()]
    assert {p.name for p in written} >= {"goforward.txt", "goforward.srt", "goforward.tandem.json", "failures.tsv"}
    assert FILE_MODE == 0o666 & ~umask
    for p in written:
        assert p.stat().st_mode & 0o777 == FILE_MODE, p


def test_unreachable_hub_fails_fast(monkeypatch):
    """A hub model that is not cached, on a machine where the hub cannot be reached: the clear line from the
    reachability check (a closed local port as the hub), never the hub client's retries; at once with
    HF_HUB_OFFLINE. Checked by what ran, not by seconds (a busy machine is slow either way)."""
    from pipelines.models import loading

    ref = loading.ModelRef("hub", "tandem-test/not-there")
    loading.hub_reachable.cache_clear()
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(loading.ModelUnavailableError, match="cannot be reached.*local folder"):
        loading.load_config(ref)
    assert loading.hub_reachable() is False  # the answer the message came from (cached for the process)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(loading.ModelUnavailableError, match="HF_HUB_OFFLINE is set"):
        loading.load_config(ref)
    loading.hub_reachable.cache_clear()
