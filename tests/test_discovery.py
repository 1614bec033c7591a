"""A folder is read by content: recordings in any container the audio layer decodes are transcribed whatever
their suffix (and its case); the other files are named in the summary and in skipped.tsv, never dropped
silently. Containers are made here with PyAV from a real clip."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pipelines.cli import main

PAIR = ["--pair", "whisper-base"]  # plain decoding: this is about which files are taken
# suffix -> (PyAV muxer, codec, sample rate)
CONTAINERS = {".ts": ("mpegts", "mp2", 16000), ".avi": ("avi", "pcm_s16le", 16000), ".ac3": ("ac3", "ac3", 48000),
              ".mpg": ("mpeg", "mp2", 16000), ".3gp": ("3gp", "aac", 16000), ".mka": ("matroska", "pcm_s16le", 16000),
              ".w64": ("w64", "pcm_s16le", 16000)}


def _mux(path: Path, samples: np.ndarray, fmt: str, codec: str, rate: int) -> None:
    """``samples`` (16 kHz mono float32) as ``codec`` at ``rate`` in a ``fmt`` container."""
    import av
    import soxr

    audio = soxr.resample(samples, 16000, rate).astype(np.float32) if rate != 16000 else samples
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame_format = stream.codec_context.format.name
        size, pts = stream.codec_context.frame_size or 1024, 0
        for i in range(0, len(audio), size):
            block = audio[i : i + size]
            data = (block * 32767).astype(np.int16) if frame_format.startswith("s16") else block
            frame = av.AudioFrame.from_ndarray(data[None], format=frame_format, layout="mono")
            frame.sample_rate, frame.pts = rate, pts
            pts += len(block)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


@pytest.fixture
def recordings(tmp_path, speech_real):
    """A folder of the clip in seven containers and an upper-case .WAV, beside a text file and a JPEG."""
    import av  # noqa: F401  (the test needs PyAV to make the containers)

    from pipelines.audio import load_audio

    clip = Path(next(i for i in speech_real if i["id"] == "goforward")["audio_path"])
    samples = load_audio(clip)
    folder = tmp_path / "recordings"
    (folder / "sub").mkdir(parents=True)
    for suffix, (fmt, codec, rate) in CONTAINERS.items():
        _mux(folder / ("sub" if suffix == ".mpg" else "") / f"clip{suffix}", samples, fmt, codec, rate)
    shutil.copy(clip, folder / "LOUD.WAV")
    (folder / "notes.txt").write_text("not audio\n")
    (folder / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(200))
    return folder


def test_every_container_is_found_by_content(recordings):
    from pipelines.asr.inputs import find_inputs

    inputs, _, skipped = find_inputs([recordings])
    names = sorted(str(i.path.relative_to(recordings)) for i in inputs)
    assert names == sorted(["LOUD.WAV", "clip.3gp", "clip.ac3", "clip.avi", "clip.mka", "clip.ts", "clip.w64",
                            "sub/clip.mpg"])
    assert sorted(s.path.name for s in skipped) == ["notes.txt", "photo.jpg"]
    assert all(s.reason for s in skipped)


def test_a_folder_of_containers_is_transcribed_and_the_rest_named(recordings, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["transcribe", str(recordings), "--out", str(out), *PAIR]) == 0
    printed = capsys.readouterr().out
    assert "files:           8 (0 failed)" in printed
    for name in ("LOUD", "clip.3gp", "clip.ac3", "clip.avi", "clip.mka", "clip.ts", "clip.w64", "sub/clip"):
        # the clips share a stem: the extension disambiguates (inputs' rule 1)
        assert "go forward" in (out / f"{name}.txt").read_text().lower(), name
    line = next(line for line in printed.splitlines() if "not audio" in line)
    assert "skipped 2 files that are not audio: notes.txt, photo.jpg" in line and "skipped.tsv" in line
    rows = (out / "skipped.tsv").read_text().splitlines()
    assert rows[0] == "path\treason" and sorted(Path(r.split("\t")[0]).name for r in rows[1:]) == ["notes.txt", "photo.jpg"]
    assert main(["transcribe", str(recordings), "--out", str(out), *PAIR]) == 0  # a re-run: all done before
    printed = capsys.readouterr().out
    assert "8 skipped (done before)" in printed and "skipped 2 files that are not audio" in printed


def test_an_out_folder_inside_the_input_folder_is_not_read(recordings):
    from pipelines.asr.inputs import find_inputs

    shutil.copytree(recordings, recordings / "out")  # what a run with --out recordings/out leaves there, and more
    inputs, _, skipped = find_inputs([recordings], exclude=[recordings / "out"])
    assert len(inputs) == 8 and len(skipped) == 2
    assert not any("out" in i.path.relative_to(recordings).parts for i in inputs)


def test_nothing_but_other_files_names_them(tmp_path, capsys):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    assert main(["transcribe", str(folder), *PAIR]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no audio files found" in err and "skipped 1 file that is not audio: a.txt" in err


def test_a_file_named_explicitly_is_tried_and_its_failure_recorded(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not audio")
    out = tmp_path / "out"
    assert main(["transcribe", str(tmp_path / "notes.txt"), "--out", str(out), *PAIR]) == 1
    assert "notes.txt" in (out / "failures.tsv").read_text() and not (out / "skipped.tsv").exists()
