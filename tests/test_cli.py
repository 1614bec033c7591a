"""The tandem command as a user runs it (in-process through main(), and once as a real subprocess)."""

import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from pipelines.cli import main


def test_models_lists_availability_and_verdicts(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    block = out.split("\nwhisper-base+distilled (default)\n")[1].split("\n\n")[0]
    assert "offline:     available" in block and "pre-flight:  ok" in block
    assert "embedded:whisper-base-distilled, int8 weights  (reads the main encoder output)" in block
    plain = out.split("\nwhisper-base\n")[1].split("\n\n")[0]
    assert "plain decoding" in plain and "offline:     available" in plain
    hub = out.split("\nwhisper-large-v3+distil-large-v3\n")[1].split("\n\n")[0]
    assert "not available; needs the model hub once" in hub and "not checked" in hub
    from pipelines.models.loading import ModelRef, how_to_get

    assert how_to_get(ModelRef("embedded", "qwen2.5-coder-1.5b-instruct")) == "install its packages: pip install -e '.[text]'"
    assert "test only" not in out
    assert main(["models", "--all"]) == 0
    assert "whisper-base+truncated-2l  [test only]" in capsys.readouterr().out


def test_printed_lines_reach_a_redirected_stdout_at_once(monkeypatch):
    """A log file or pipe gets each line as it is printed (not a block at exit): a stopped run keeps its progress."""
    import io

    raw = io.BytesIO()
    redirected = io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False)  # as Python opens a redirected stdout
    monkeypatch.setattr(sys, "stdout", redirected)
    assert main(["models"]) == 0
    written = raw.getvalue()
    assert b"whisper-base+distilled (default)" in written
    redirected.flush()
    assert raw.getvalue() == written  # nothing was left in the buffer


def test_every_command_reads_the_models_file_given(tmp_path, capsys):
    """--models reaches the benchmarks too (bench asr read the project's models.yaml, so --also could not name a
    pair of the user's file); the environment is left as it was."""
    import os

    bad = tmp_path / "models.yaml"
    bad.write_text("pairs:\n  p:\n    task: asr\n    mian: {embedded: whisper-base}\n")
    assert main(["--models", str(bad), "bench", "asr", "--pair", "whisper-base+distilled", "--sets", "speech-real",
                 "--limit", "1", "--json", str(tmp_path / "b.json")]) == 2
    assert str(bad) in capsys.readouterr().err and "TANDEM_MODELS" not in os.environ


def test_broken_models_file_is_one_sentence(tmp_path, capsys):
    bad = tmp_path / "models.yaml"
    bad.write_text("pairs:\n  p:\n    task: asr\n    mian: {embedded: whisper-base}\n")
    assert main(["--models", str(bad), "models"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"tandem: {bad}: pair 'p': field 'mian' is not a known field " \
                  "(known: assistant, assistant_int8, description, draft, dtype, languages, main, prompt_lookup_ngram, " \
                  "share_encoder, task, test_only)"


def test_transcribe_goes_on_past_bad_files(tmp_path, speech_real, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    good = next(i for i in speech_real if i["id"] == "goforward")
    shutil.copy(good["audio_path"], folder / "goforward.wav")
    (folder / "broken.wav").write_text("not audio")
    (folder / "empty.flac").write_bytes(b"")
    sf.write(folder / "silence.wav", np.zeros(16000 * 2, dtype=np.float32), 16000)
    manifest = tmp_path / "refs.jsonl"
    manifest.write_text('{"id": "goforward", "audio": "goforward.wav", "reference": "go forward ten meters"}\n')
    code = main(["transcribe", str(folder), "--refs", str(manifest)])
    out, err = capsys.readouterr()
    assert code == 1  # some files failed
    assert "loading the models...\n" in err  # the bar stays at 0 while they load: a line says why
    assert "goforward.wav" in out and "Go forward 10 meters" in out
    assert "broken.wav  FAILED: not an audio file" in out
    assert "empty.flac  FAILED: empty file" in out
    assert "files:           4 (2 failed)" in out
    assert "WER:             0.00% on 1 files" in out


def test_english_only_pair_takes_english_or_auto_and_refuses_another_language(tmp_path, speech_real, capsys):
    import json

    good = next(i for i in speech_real if i["id"] == "goforward")["audio_path"]
    assert main(["transcribe", "--pair", "whisper-tiny.en", str(good)]) == 0
    assert "Go forward 10 meters" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["transcribe", "--pair", "whisper-tiny.en", "--language", "auto", str(good), "--out", str(out),
                 "--formats", "json"]) == 0
    record = json.loads((out / "goforward.json").read_text())
    assert record["language"] == "en" and "Go forward" in record["text"]  # no detection: English-only
    capsys.readouterr()
    assert main(["transcribe", "--pair", "whisper-tiny.en", "--language", "de", str(good)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("tandem: pair 'whisper-tiny.en' is English-only: the language must be en or auto, not 'de' "
                       "(choose a multilingual pair)")
    assert "Traceback" not in "".join(err)


def test_a_language_the_model_lacks_is_refused_before_any_weights_load(tmp_path, speech_real, monkeypatch, capsys):
    """The language is checked from the main model's generation_config.json: refused before loading and before
    --out is created and locked (it used to load the pair first)."""
    from pipelines.models import pairs

    good = next(i for i in speech_real if i["id"] == "goforward")["audio_path"]
    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    for language in ("xx", "EN", "English"):
        assert main(["transcribe", good, "--language", language, "--out", str(tmp_path / "out")]) == 2
        assert capsys.readouterr().err == f"tandem: language {language!r} is not one pair 'whisper-base+distilled' knows\n"
    assert not (tmp_path / "out").exists()


def test_file_formats_without_an_output_folder_are_refused_before_any_weights_load(speech_real, monkeypatch, capsys):
    """-f srt (or json, vtt, tsv, all) writes files into -o's folder; without -o the transcripts are only printed,
    so the formats would be dropped in silence: one line instead, before the weights load. txt alone is printed."""
    from pipelines.models import pairs

    good = next(i for i in speech_real if i["id"] == "goforward")["audio_path"]
    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    for formats in ("srt", "txt,json", "all"):
        assert main(["transcribe", good, "-f", formats]) == 2
        assert capsys.readouterr().err == (f"tandem: -f {formats} writes files: give -o DIR too (without -o the "
                                           "transcripts are printed as text)\n")


def test_absolute_glob_patterns(tmp_path, speech_real):
    from pipelines.asr import find_audio

    (tmp_path / "sub").mkdir()
    for name in ("a.wav", "sub/b.wav", "c.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert find_audio([str(tmp_path / "*.wav")]) == [tmp_path / "a.wav"]
    assert find_audio([str(tmp_path / "**" / "*.wav")]) == [tmp_path / "a.wav", tmp_path / "sub" / "b.wav"]
    assert find_audio([str(tmp_path)]) == [tmp_path / "a.wav", tmp_path / "sub" / "b.wav"]  # folders: audio names only


def test_demo_says_what_it_builds_on_a_fresh_cache(tmp_path, speech_real, monkeypatch, capsys):
    """On a fresh cache the demo's first minute went to fetching the sample audio, converting the embedded Whisper
    weights and loading them, with nothing printed but a bar at 0% (a newcomer took it for a hang): a line on
    stderr says what is being built, and none once it is cached."""
    from pipelines import paths
    from pipelines.cli import transcribe
    from pipelines.models.embedded import embedded_path
    from pipelines.quality import sets

    runs = []
    monkeypatch.setattr(transcribe, "run_transcribe", lambda inputs, *a, **k: runs.append(inputs) or 0)
    real_models_dir, real_set_dir = paths.models_dir, sets.set_dir
    monkeypatch.setattr(paths, "models_dir", lambda: tmp_path / "models")  # an empty cache: nothing converted
    monkeypatch.setattr(sets, "set_dir", lambda name: tmp_path / "data" / name)  # nor built
    assert main(["demo"]) == 0
    err = capsys.readouterr().err
    assert (f"building the sample set speech-real (pocketsphinx's test recordings, fetched with pip) into "
            f"{tmp_path / 'data' / 'speech-real'} (first run only)...\n") in err
    assert ("converting the embedded Whisper weights (whisper-base, whisper-base-distilled) into "
            f"{tmp_path / 'models'} (first run only)...\n") in err
    monkeypatch.setattr(paths, "models_dir", real_models_dir)
    monkeypatch.setattr(sets, "set_dir", real_set_dir)
    embedded_path("whisper-base-distilled")  # (whisper-base too) converted into the real cache
    assert main(["demo"]) == 0
    err = capsys.readouterr().err
    assert "building" not in err and "converting" not in err and len(runs) == 2


def test_console_script_help():
    exe = shutil.which("tandem") or f"{sys.executable} -m pipelines.cli"
    out = subprocess.run(f"{exe} --help", shell=True, capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("models", "data", "transcribe", "demo"):
        assert command in out.stdout


def test_ui_stops_with_its_streamlit_child_on_sigterm(tmp_path):
    """`kill PID` on `tandem ui` reaches the Streamlit server: both exit and the port is free again."""
    import os
    import signal
    import socket

    from ui_server import PATIENCE_S, free_port, wait_healthy, wait_until

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ui", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        if not wait_healthy(f"http://127.0.0.1:{port}", proc):
            raise AssertionError("tandem ui did not start")
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert children, "tandem ui runs the server as a child process"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PATIENCE_S) in (0, 128 + signal.SIGTERM, 143)

        def gone(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        for pid in map(int, children):
            assert wait_until(lambda: gone(pid)), f"the Streamlit child {pid} outlived tandem ui"
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT left by our requests is fine
            s.bind(("127.0.0.1", port))  # nobody listens there any more
            s.listen()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of its session is left (the child, when the test fails)
        except ProcessLookupError:
            pass


def test_bench_asr_also_needs_an_assisted_pair_over_the_same_main_model(capsys):
    assert main(["bench", "asr", "--pair", "whisper-base+distilled", "--also", "whisper-tiny.en", "--limit", "1"]) == 2
    assert "--also whisper-tiny.en: not an assisted pair over embedded:whisper-base" in capsys.readouterr().err


def test_bench_asr_goes_on_without_a_faster_whisper_that_cannot_run(monkeypatch, speech_real, tmp_path):
    """faster-whisper installed but unable to run on the device (CTranslate2 without its CUDA libraries): the
    reason is one line and the other systems' rows still come, on one file."""
    from pipelines.quality import bench_asr

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA failed with error CUDA driver version is insufficient")

    monkeypatch.setattr(bench_asr, "_fw_model", broken)
    lines: list[str] = []
    report = bench_asr.bench_asr("whisper-base+distilled", ("speech-real",), limit=1, batch_size=1,
                                 json_path=str(tmp_path / "b.json"), log=lines.append, dtypes=("float32",))
    assert any("faster-whisper cannot run on cpu here (RuntimeError: CUDA failed" in line for line in lines)
    systems = [r["system"] for r in report["rows"]]
    assert not any(s.startswith("faster-whisper") for s in systems)
    assert {"transformers plain float32", "tandem plain float32", "tandem assisted float32"} <= set(systems)


@pytest.mark.parametrize("argv", [
    ["eval", "--task", "asr", "--pair", "p", "--set", "s", "--limit", "0"],
    ["eval", "--task", "asr", "--pair", "p", "--set", "s", "--limit", "-1"],
    ["eval", "--task", "asr", "--pair", "p", "--set", "s", "--repeats", "0"],
    ["--threads", "0", "models"],
    ["bench", "asr", "--batch-size", "0"],
    ["bench", "text", "--max-new-tokens", "-2"],
    ["bench", "shapes", "--tokens", "0"],
    ["distill", "--main", "whisper-base", "--out", "x", "--layers", "0"],
    ["distill", "--main", "whisper-base", "--out", "x", "--clips", "0"],
    ["distill", "--main", "whisper-base", "--out", "x", "--lr", "-1"],
    ["distill", "--main", "whisper-base", "--out", "x", "--budget-minutes", "nan"],
    ["ui", "--port", "70000"],
])
def test_counts_below_one_are_refused_by_the_parser(argv, capsys):
    """A count of 0 or below (eval --limit 0 used to mean every item, --limit -1 all but the last; distill --layers 0
    started labelling) is an argument error: exit 2 naming the option, nothing run."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "error: argument --" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--threads", "two", "models"], "argument --threads: expected a whole number from 1, not 'two'"),
    (["ui", "--port", "70000"], "argument --port: expected a whole number from 1 to 65535, not '70000'"),
    (["distill", "--main", "m", "--out", "x", "--lr", "nan"], "argument --lr: expected a number above 0, not 'nan'"),
    (["transcribe", "a.wav", "--logprob-threshold", "low"], "argument --logprob-threshold: expected a number or "
                                                             "'off', not 'low'"),
    (["transcribe", "a.wav", "--temperature", "0,x"], "argument --temperature: expected comma-separated numbers, "
                                                       "not '0,x'"),
    (["bench", "asr", "--dtypes", "float32,int3"], "argument --dtypes: expected comma-separated dtypes of float32, "
                                                   "bfloat16, float16, int8, int4, not 'float32,int3'"),
    (["bench", "asr", "--peers", "vllm"], "argument --peers: vllm: choose from whispercpp, openvino"),
    (["bench", "serve", "--clients", "1,0"], "argument --clients: whole numbers from 1, comma-separated, not '1,0'"),
], ids=["count", "port", "positive", "threshold", "temperatures", "dtypes", "peers", "clients"])
def test_a_value_of_the_wrong_kind_is_one_argument_error_saying_what_was_expected(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(message)


def test_transcribe_reads_its_references_before_any_model_loads(tmp_path, speech_real, monkeypatch, capsys):
    """--refs that is missing, not JSON lines, or lacks 'reference' is one line and exit 2 before anything is
    transcribed (it was read after the whole run: a traceback for bad JSON); a manifest file named without a
    suffix, or a folder holding manifest.jsonl, is read as such (it was taken for a set's name)."""
    from pipelines.cli import transcribe as batch  # the command's module: --refs is read there

    clip = speech_real[0]["audio_path"]
    (tmp_path / "bad.jsonl").write_text("{bad json\n")
    (tmp_path / "noref.jsonl").write_text('{"id": "x", "text": "hello"}\n')
    monkeypatch.setattr(batch, "plan_batch", lambda *a, **k: pytest.fail("the run was planned"))
    for refs, message in ((tmp_path / "missing.jsonl", "no such manifest file or set"),
                          (tmp_path / "bad.jsonl", "not a manifest of JSON lines"),
                          (tmp_path / "noref.jsonl", "item 1 is not an object with 'id' and 'reference'")):
        assert main(["transcribe", clip, "--refs", str(refs)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tandem: --refs {refs}: {message}") and err.count("\n") == 1, err
    plain = tmp_path / "refs"  # a file without a suffix, and a folder holding manifest.jsonl
    plain.write_text('{"id": "x1", "audio": "sub/a.wav", "reference": "Hello."}\n')
    assert batch.load_refs(str(plain)) == {"x1": "Hello.", "a": "Hello."}
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "manifest.jsonl").write_text(plain.read_text())
    assert batch.load_refs(str(tmp_path / "set"))["a"] == "Hello."
