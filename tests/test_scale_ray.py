"""The batch job on a local Ray cluster (pipelines/scale): the same transcripts and files as the in-process
run, resume after an interrupted run, and a worker killed mid-run costing nothing (or, without retries, only
its in-flight file, listed as failed: marked slow). One Ray instance for the session (2 CPUs); plain
whisper-base. Skipped when Ray is not installed (CI installs the 'scale' extra)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from pipelines.asr import TranscribeOptions
from pipelines.asr.batch import transcribe_files

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install -e '.[scale]'")

from pipelines.scale import RayOptions  # noqa: E402

CLIPS = ("cards-001", "cards-002", "forever", "goforward")
OPTIONS = TranscribeOptions(batch_size=4)  # plain pair: these tests are about the job, not drafting


@pytest.fixture(scope="session")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pair(registry):
    return registry.get("whisper-base")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, speech_real):
    """Four real clips, a corrupt file and an empty one."""
    folder = tmp_path_factory.mktemp("ray-in")
    by_id = {i["id"]: Path(i["audio_path"]) for i in speech_real}
    for clip in CLIPS:
        shutil.copy(by_id[clip], folder / f"{clip}.wav")
    (folder / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    (folder / "empty.flac").write_bytes(b"")
    return folder


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, inputs, pair):
    out = tmp_path_factory.mktemp("in-process") / "out"
    run = transcribe_files([inputs], pair, OPTIONS, out, ("txt", "srt"))
    return out, {Path(r.path).name: r for r in run.results}


def _outputs(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(out.iterdir()) if p.suffix in (".txt", ".srt")}


def _failures(out: Path) -> list[tuple[str, str]]:
    return [tuple(line.split("\t")[:2]) for line in (out / "failures.tsv").read_text().splitlines()[1:]]


def _worker_pids() -> set[int]:
    """Processes of this machine that run a Ray Data map actor (Ray titles them ray::MapWorker...)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(b"ray::MapWorker"):
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def test_same_transcripts_and_files_as_in_process(tmp_path, ray_cluster, inputs, in_process, pair):
    """Two actors, two files per task: each file's text, segments and tokens, the txt/srt files and
    failures.tsv are the in-process run's."""
    expected_out, expected = in_process
    out = tmp_path / "out"
    run = transcribe_files([inputs], pair, OPTIONS, out, ("txt", "srt"),
                           ray=RayOptions(address="auto", actors=2, files_per_task=2))
    got = {Path(r.path).name: r for r in run.results}
    assert sorted(got) == sorted(expected) and len(run.results) == len(got) == 6
    for name, r in got.items():
        e = expected[name]
        assert (r.text, r.segments, r.tokens, r.error) == (e.text, e.segments, e.tokens, e.error), name
    assert {n for n, r in got.items() if not r.ok} == {"corrupt.wav", "empty.flac"}
    assert _outputs(out) == _outputs(expected_out) and len(_outputs(out)) == 8
    assert sorted(_failures(out)) == sorted(_failures(expected_out))


def test_resume_after_an_interrupted_run(tmp_path, ray_cluster, inputs, in_process, pair):
    """Ctrl-C after two files: they are kept; the second run skips them (their records untouched) and
    does the other four, and the folder ends as the in-process run's."""
    out = tmp_path / "out"
    seen = []

    def interrupt_after_two(result):
        seen.append(result)
        if len(seen) == 2:
            raise KeyboardInterrupt

    options = RayOptions(address="auto", actors=1, files_per_task=1)
    first = transcribe_files([inputs], pair, OPTIONS, out, ("txt", "srt"), ray=options, on_result=interrupt_after_two)
    assert first.interrupted and len(first.results) == 2
    kept = {r.path: (Path(out) / Path(r.path).with_suffix(".tandem.json").name).stat().st_mtime_ns for r in first.results}
    second = transcribe_files([inputs], pair, OPTIONS, out, ("txt", "srt"), ray=options)
    assert not second.interrupted and second.skipped == sum(r.ok for r in first.results)
    assert {r.path for r in second.results}.isdisjoint(r.path for r in first.results if r.ok)
    assert {Path(r.path).name for r in first.results + second.results} >= set(in_process[1])
    for path, mtime in kept.items():
        if json.loads((out / Path(path).with_suffix(".tandem.json").name).read_text())["status"] == "done":
            assert (out / Path(path).with_suffix(".tandem.json").name).stat().st_mtime_ns == mtime
    assert _outputs(out) == _outputs(in_process[0])


def _kill_worker_after_first(killed: list[int], after: list[int]):
    """An on_result that SIGKILLs the decoding actor's process once the first file is back (the actor is
    then on the next file), and notes the actor processes alive at each later result."""
    def on_result(result):
        if not killed:
            (pid,) = _worker_pids()
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            # a killed process stays listed until the kernel has torn it down (its memory freed: seconds on a
            # busy machine), so a later result could see it still there: wait for it to go
            deadline = time.monotonic() + 60
            while pid in _worker_pids() and time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            after.extend(_worker_pids())

    return on_result


def test_killed_worker_costs_nothing(tmp_path, ray_cluster, inputs, in_process, pair):
    """The actor's process is killed mid-run: Ray restarts it and retries its in-flight file; every file
    ends done or failed as in the in-process run, each exactly once, with the same outputs."""
    out = tmp_path / "out"
    killed, after = [], []
    run = transcribe_files([inputs], pair, OPTIONS, out, ("txt", "srt"),
                           ray=RayOptions(address="auto", actors=1, files_per_task=1),
                           on_result=_kill_worker_after_first(killed, after))
    names = [Path(r.path).name for r in run.results]
    assert sorted(names) == sorted(in_process[1])  # each file once: nothing lost, nothing redone
    assert killed and after and killed[0] not in after  # a new actor process finished the run
    assert _outputs(out) == _outputs(in_process[0])
    assert sorted(_failures(out)) == sorted(_failures(in_process[0]))


@pytest.mark.slow  # two more runs (~30-60 s on 2 cores): with the three above the Ray tests would pass 90 s
def test_without_retries_a_killed_worker_costs_only_its_file(tmp_path, ray_cluster, inputs, in_process, pair):
    """With max_task_retries=0 the killed actor's in-flight file is listed as failed (failures.tsv, with
    the reason), every other file is done, and a second run does that file."""
    out = tmp_path / "out"
    killed, after = [], []
    options = RayOptions(address="auto", actors=1, files_per_task=1, max_task_retries=0)
    run = transcribe_files([inputs], pair, OPTIONS, out, ("txt",), ray=options,
                           on_result=_kill_worker_after_first(killed, after))
    lost = [r for r in run.results if r.error and "Ray worker died" in r.error]
    assert killed and len(run.results) == 6 and len(lost) == 1
    expected = in_process[1]
    for r in run.results:  # the others as in the in-process run
        assert r in lost or (r.ok, r.text, r.error) == (expected[Path(r.path).name].ok, expected[Path(r.path).name].text,
                                                         expected[Path(r.path).name].error)
    name = Path(lost[0].path).name
    assert [n for n, why in _failures(out) if "Ray worker died" in why] == [str(Path(lost[0].path))]
    again = transcribe_files([inputs], pair, OPTIONS, out, ("txt",), ray=options)
    redone = {Path(r.path).name: r for r in again.results}
    assert name in redone and redone[name].error == expected[name].error and redone[name].text == expected[name].text
