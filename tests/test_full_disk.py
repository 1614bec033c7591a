"""An output that cannot be written (a full disk, a quota, a read-only folder) stops a run with one line that
names the folder and the reason, exit status 4 (errors.EXIT_OUTPUT), no traceback, the finished files kept and
no half-written file left as finished; the same command resumes once there is room. A full disk is simulated
by a writer that runs out of bytes (ENOSPC mid-write) and, where this runs as root and can mount, a real
small tmpfs."""

from __future__ import annotations

import errno
import os
import re
import subprocess
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.errors import EXIT_OUTPUT

PAIR = ["--pair", "whisper-base"]  # plain decoding: this is about files
LINE = re.compile(r"^tandem: no space left on (?P<out>.+): (?P<kept>\d+) of (?P<total>\d+) files finished and kept; "
                  r"free space and run the same command to resume\n$")


class _Disk:
    """``os`` for pipelines.paths with a disk of ``room`` bytes: the write that does not fit writes what does,
    then fails with ENOSPC (what a full disk does)."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __getattr__(self, name):
        return getattr(os, name)

    def fdopen(self, fd, mode="r", *args, **kwargs):
        handle, disk = os.fdopen(fd, mode, *args, **kwargs), self

        class Limited:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                handle.close()

            def write(self, data: bytes) -> int:
                fits = min(len(data), disk.room)
                handle.write(data[:fits])
                disk.room -= fits
                if fits < len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return fits

            def fileno(self):
                return handle.fileno()

        return Limited()


def _clips(speech_real, n: int) -> list[str]:
    return [item["audio_path"] for item in speech_real[:n]]


def _finished(out: Path) -> list[Path]:
    return sorted(out.glob("*.tandem.json"))


def _check_stop(err: str, out: Path, total: int) -> int:
    """The run's last words on stderr (above them: the progress bar) are the one line; what it says is so."""
    match = LINE.match(err.splitlines()[-1] + "\n")
    assert match and "Traceback" not in err, err
    assert match["out"] == str(out) and int(match["total"]) == total
    kept = int(match["kept"])
    assert len(_finished(out)) == kept and 0 < kept < total
    assert not list(out.rglob("*.tmp")), "a temporary file was left behind"
    for record in _finished(out):  # every finished file has all its outputs, whole
        stem = record.name[: -len(".tandem.json")]
        assert {p.suffix for p in out.glob(f"{stem}.*")} >= {".txt", ".json", ".srt"}
        assert (out / f"{stem}.json").read_text().rstrip().endswith("}")
    return kept


def test_a_disk_that_fills_up_mid_run(tmp_path, speech_real, capsys, monkeypatch):
    from pipelines import paths

    clips, out = _clips(speech_real, 3), tmp_path / "out"
    command = ["transcribe", *clips, "--out", str(out), "--formats", "txt,json,srt", *PAIR]
    with monkeypatch.context() as m:
        m.setattr(paths, "os", _Disk(room=4500))  # one file's outputs and record (2.6-3.1 KB here, the record
        # keeping the result), not two
        assert main(command) == EXIT_OUTPUT
    kept = _check_stop(capsys.readouterr().err, out, len(clips))
    assert main(command) == 0  # room again: the same command resumes
    printed = capsys.readouterr().out
    assert f"resuming: {kept} of {len(clips)} files already done" in printed
    assert len(_finished(out)) == len(clips)


def test_a_read_only_folder_is_one_line(tmp_path, speech_real, capsys, monkeypatch):
    from pipelines.paths import writing

    def read_only(path, text):
        with writing(path):  # as paths.write_atomic wraps the OS's error
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    out = tmp_path / "out"
    monkeypatch.setattr("pipelines.asr.outputs.write_atomic", read_only)
    assert main(["transcribe", *_clips(speech_real, 1), "--out", str(out), *PAIR]) == EXIT_OUTPUT
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"tandem: read-only file system on {out}: 0 of 1 files finished and kept; make it writable")


@pytest.fixture
def small_disk(tmp_path):
    """A 24 KB tmpfs (six 4 KB pages: one file's four outputs, and a bit) at tmp_path/disk."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs root to mount a tmpfs (the simulated one runs everywhere)")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_real_full_disk(small_disk, speech_real, capsys):
    clips, out = _clips(speech_real, 3), small_disk / "out"
    command = ["transcribe", *clips, "--out", str(out), "--formats", "txt,json,srt", *PAIR]
    assert main(command) == EXIT_OUTPUT
    kept = _check_stop(capsys.readouterr().err, out, len(clips))
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # space freed
    assert main(command) == 0
    assert f"resuming: {kept} of {len(clips)} files already done" in capsys.readouterr().out
    assert len(_finished(out)) == len(clips)


def test_eval_json_on_a_full_disk_leaves_no_file(tmp_path, monkeypatch):
    from pipelines import paths
    from pipelines.paths import OutputWriteError
    from pipelines.quality.evaluation import write_report

    monkeypatch.setattr(paths, "os", _Disk(room=10))
    with pytest.raises(OutputWriteError, match=r"^no space left on .*report\.json: free space and run the same"):
        write_report({"rows": list(range(100))}, tmp_path / "report.json")
    assert not list(tmp_path.iterdir())


def _regress_config(tmp_path: Path, out: Path) -> Path:
    (tmp_path / "models.yaml").write_text("pairs:\n  x: {task: asr, main: {embedded: whisper-base}}\n")
    path = tmp_path / "nightly.yaml"
    path.write_text(f"models: models.yaml\nout: {out}\nruns: [{{task: asr, pair: x, set: speech-real}}]\n")
    return path


def test_regress_history_on_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    import sqlite3

    def full(path):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr("pipelines.quality.regress.open_history", full)
    config = _regress_config(tmp_path, tmp_path / "report")
    assert main(["regress", "--config", str(config), "--accept", "1"]) == EXIT_OUTPUT
    assert capsys.readouterr().err == (f"tandem: no space left on {tmp_path / 'report'}: free space and run the same "
                                       "command again\n")


def test_a_checkpoint_that_does_not_fit(tmp_path, monkeypatch):
    """torch.save says neither ENOSPC nor the path ("unexpected pos 640 vs 534"): a full file system is found
    by its free space; the half-written checkpoint goes, the last whole one stays."""
    from pipelines import paths
    from pipelines.distill import training
    from pipelines.paths import OutputWriteError, output_guard

    ckpt = tmp_path / "best.pt"
    ckpt.write_bytes(b"the last whole checkpoint")

    def torch_save(state, path):
        Path(path).write_bytes(b"half")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 640 vs 534")

    monkeypatch.setattr("torch.save", torch_save)
    monkeypatch.setattr(paths, "_full", lambda folder: True)
    with pytest.raises(OutputWriteError, match="^no space left on .*: what was finished is kept"):
        with output_guard(tmp_path, "what was finished is kept; free space and go on with --resume"):
            training._save_checkpoint(ckpt, {})
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"] and ckpt.read_bytes() == b"the last whole checkpoint"


def test_regress_and_a_checkpoint_on_a_real_full_disk(small_disk, tmp_path, capsys):
    import torch

    from pipelines.paths import OutputWriteError, output_guard

    config = _regress_config(tmp_path, small_disk / "report")
    assert main(["regress", "--config", str(config), "--accept", "1"]) == EXIT_OUTPUT
    err = capsys.readouterr().err
    assert err.startswith("tandem: no space left on ") and err.count("\n") == 1, err
    subprocess.run(["rm", "-rf", str(small_disk / "report")], check=True)
    with pytest.raises(OutputWriteError, match="^no space left on "):
        with output_guard(small_disk):
            torch.save({"w": torch.zeros(100_000)}, small_disk / "ckpt.pt")
