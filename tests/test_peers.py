"""The benchmarks' CPU peers (pipelines/quality/peers.py, peers_text.py): whisper.cpp on the embedded Whisper
base converted to ggml, llama.cpp on the Qwen GGUF files, OpenVINO GenAI on IR exported from the same
transformers folders. The adapters' tests need the 'bench-peers' extra (pip install -e '.[bench-peers]') and
skip with that reason without it (the OpenVINO ones also without the cached exports, which take minutes: any
`tandem bench ... --peers openvino` makes them); the reason lines and the export's failures run everywhere."""

from __future__ import annotations

import importlib.util
import struct
import sys
import types
from pathlib import Path

import pytest

from pipelines.models.embedded import WHISPER
from pipelines.models.embedded_gguf import GGUF, is_installed
from pipelines.models.loading import ModelRef
from pipelines.quality import peers, peers_text
from pipelines.quality.metrics import wer

BASE = ModelRef("embedded", "whisper-base")
needs_pywhispercpp = pytest.mark.skipif(importlib.util.find_spec("pywhispercpp") is None,
                                        reason=f"pywhispercpp is not installed: {peers.EXTRA}")
needs_llamacpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                    reason=f"llama-cpp-python is not installed: {peers.EXTRA}")
needs_text_pair = pytest.mark.skipif(not all(is_installed(n) for n in GGUF),
                                     reason="the text pair is not installed: pip install -e '.[text]'")
needs_openvino = pytest.mark.skipif(importlib.util.find_spec("openvino_genai") is None,
                                    reason=f"openvino-genai is not installed: {peers.EXTRA}")
TEXT_PAIR = "qwen2.5-coder-1.5b+0.5b-translate"


def exported(name: str, task: str, formats: tuple[str, ...]) -> bool:
    """Whether every format of ``name``'s OpenVINO export is in the cache (without reading the source)."""
    sha = WHISPER[name].sha256 if name in WHISPER else GGUF[name].sha256
    return all(peers.ov_ir_is_cached(name, sha, task, f) for f in formats)


def test_peer_names_are_checked():
    assert peers.parse_peers("whispercpp, OpenVINO,whispercpp", peers.ASR_PEERS) == ("whispercpp", "openvino")
    with pytest.raises(peers.TandemError, match="llamacpp: choose from whispercpp, openvino"):
        peers.parse_peers("llamacpp", peers.ASR_PEERS)


def test_a_peer_that_cannot_run_is_one_line_and_no_system(monkeypatch):
    for module in ("pywhispercpp", "pywhispercpp.model", "openvino_genai"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails as when it is not installed
    lines = []
    systems = peers.asr_peer_systems(("whispercpp", "openvino"), BASE, 2, "unused.wav", lines.append)
    assert systems == {}
    assert lines == [f"whispercpp: no row: pywhispercpp is not installed ({peers.EXTRA})",
                     f"openvino: no row: openvino-genai is not installed ({peers.EXTRA})"]


FAKE_EXPORTER = """#!/bin/sh
# optimum-cli as the test wants it: the output folder is the last argument
for out; do :; done
case "$FAKE_EXPORT" in
  fail) echo "loading the model" >&2; echo "ValueError: no such task" >&2; exit 3 ;;
  partial) touch "$out/openvino_encoder_model.bin" ;;
  *) touch "$out/openvino_encoder_model.bin" "$out/openvino_tokenizer.xml" "$out/openvino_detokenizer.xml" ;;
esac
"""


@pytest.fixture
def fake_exporter(tmp_path, monkeypatch):
    """``FAKE_EXPORTER`` as the export venv's optimum-cli, the cache in ``tmp_path``."""
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    exporter = tmp_path / "bin" / "optimum-cli"
    exporter.parent.mkdir()
    exporter.write_text(FAKE_EXPORTER)
    exporter.chmod(0o755)
    monkeypatch.setattr(peers, "ov_export_bin", lambda log=print: exporter.parent)
    return exporter


@pytest.mark.parametrize("mode, error", [
    ("fail", r"optimum-cli export of whisper-base \(int8\) failed \(exit 3\): ValueError: no such task"),
    ("partial", r"the OpenVINO export of whisper-base \(int8\) lacks openvino_tokenizer.xml, openvino_detokenizer.xml"),
], ids=["fails", "lacks-tokenizer"])
def test_an_export_that_fails_is_a_reason_and_nothing_cached(fake_exporter, tmp_path, monkeypatch, mode, error):
    monkeypatch.setenv("FAKE_EXPORT", mode)
    with pytest.raises(peers.PeerUnavailable, match=error):
        peers.ov_ir_folder("whisper-base", tmp_path, "abc", peers.OV_ASR_TASK, "int8", log=lambda line: None)
    assert not peers.ov_ir_is_cached("whisper-base", "abc", peers.OV_ASR_TASK, "int8")


def test_an_export_is_stamped_and_made_once(fake_exporter, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_EXPORT", "ok")
    lines = []
    folder = peers.ov_ir_folder("whisper-base", tmp_path, "abc", peers.OV_ASR_TASK, "int8", lines.append)
    assert folder == tmp_path / "cache" / "models" / "whisper-base-ov-int8"
    assert peers.ov_ir_is_cached("whisper-base", "abc", peers.OV_ASR_TASK, "int8")
    assert not peers.ov_ir_is_cached("whisper-base", "other source", peers.OV_ASR_TASK, "int8")
    fake_exporter.unlink()  # a second call exports nothing
    assert peers.ov_ir_folder("whisper-base", tmp_path, "abc", peers.OV_ASR_TASK, "int8", lines.append) == folder
    assert len(lines) == 1 and lines[0].startswith("  openvino: exported whisper-base int8 in"), lines


def test_the_ggml_header_is_whisper_cpps(base_dir, tmp_path):
    """f16 needs no peer: the converter's header carries base's hyper-parameters and its mel filters."""
    from pipelines.quality.ggml_whisper import write_ggml

    out = tmp_path / "ggml.bin"
    write_ggml(base_dir, out, "f16")
    head = out.read_bytes()[:4 + 11 * 4 + 8]
    magic, *hparams = struct.unpack("12i", head[:48])
    assert magic == 0x67676D6C
    assert hparams == [51865, 1500, 512, 8, 6, 448, 512, 8, 6, 80, 1]
    assert struct.unpack("ii", head[48:56]) == (80, 201)


def test_each_openvino_speech_row_reads_its_ir_at_its_precision(monkeypatch):
    """``OPENVINO_WHISPER_ROWS`` is the rows' one source: each row compiles the IR of its weight format with its
    precision hint (none: the plugin's default), and the formats exported are the rows' own, once each."""
    from pipelines import audio
    from pipelines.models import embedded

    made = []

    class FakePipeline:  # openvino_genai.WhisperPipeline as the adapter calls it
        def __init__(self, folder, device, **properties):
            made.append((folder, device, properties))

        def get_generation_config(self):
            return types.SimpleNamespace()

        def generate(self, samples, config):
            return types.SimpleNamespace(texts=[f" {samples} "])

    monkeypatch.setitem(sys.modules, "openvino_genai", types.SimpleNamespace(WhisperPipeline=FakePipeline))
    monkeypatch.setattr(embedded, "embedded_path", lambda name: Path("/source"))
    monkeypatch.setattr(peers, "ov_ir_folder", lambda name, source, sha, task, fmt, log: Path(f"/ir/{fmt}"))
    monkeypatch.setattr(audio, "load_audio", lambda path: path)
    systems = peers.openvino_asr_systems(BASE, 3, "warm.wav", log=lambda line: None)
    assert list(systems) == ["OpenVINO fp32", "OpenVINO bf16", "OpenVINO int8"]
    assert made == [("/ir/fp32", "CPU", {"INFERENCE_NUM_THREADS": 3, "INFERENCE_PRECISION_HINT": "f32"}),
                    ("/ir/fp32", "CPU", {"INFERENCE_NUM_THREADS": 3, "INFERENCE_PRECISION_HINT": "bf16"}),
                    ("/ir/int8", "CPU", {"INFERENCE_NUM_THREADS": 3})]
    assert peers.OPENVINO_WHISPER_FORMATS == ("fp32", "int8")
    assert systems["OpenVINO int8"](["a.wav"]) == ["a.wav"]


@pytest.mark.parametrize("adapter, names", [
    pytest.param(peers.whispercpp_systems, ["whisper.cpp f16", "whisper.cpp q8_0"], marks=needs_pywhispercpp),
    pytest.param(peers.openvino_asr_systems, ["OpenVINO bf16", "OpenVINO fp32", "OpenVINO int8"], marks=[
        needs_openvino, pytest.mark.skipif(
            not exported("whisper-base", peers.OV_ASR_TASK, peers.OPENVINO_WHISPER_FORMATS),
            reason="whisper-base's OpenVINO export is not cached: tandem bench asr --peers openvino makes it")]),
], ids=["whispercpp", "openvino"])
def test_a_speech_peer_transcribes_a_file_in_each_precision(speech_real, adapter, names):
    item = speech_real[1]
    lines = []
    systems = adapter(BASE, 2, item["audio_path"], lines.append)
    assert sorted(systems) == names, lines
    for name, run in systems.items():
        [text] = run([item["audio_path"]])
        assert wer([text], [item["reference"]]).value < 0.2, (name, text)


@needs_llamacpp
@needs_text_pair
def test_llamacpp_generates_on_tandems_token_ids():
    """The three systems run on the ids of Tandem's tokenizer (the same vocabulary), a prompt's KV cache does
    not leak into the next prompt's output, and a stop token ends the output."""
    from transformers import AutoTokenizer

    from pipelines.models.embedded import embedded_path
    from pipelines.models.registry import load_registry

    pair = load_registry().get("qwen2.5-coder-1.5b+0.5b-translate")
    tokenizer = AutoTokenizer.from_pretrained(embedded_path(pair.main.id))
    chat = [{"role": "user", "content": "Translate into German: The library opens at nine."}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    eos = (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    systems = peers_text.llamacpp_systems(pair, len(prompt) + 40, 8, eos, 2)
    assert sorted(systems) == ["llama.cpp model draft", "llama.cpp plain", "llama.cpp prompt lookup"]
    other = tokenizer("Good morning", add_special_tokens=False)["input_ids"]
    outs, seconds, _ = systems["llama.cpp plain"]([prompt, other, prompt])
    assert outs[0] == outs[2] and seconds > 0
    assert "Bibliothek" in tokenizer.decode(outs[0])
    for name in ("llama.cpp model draft", "llama.cpp prompt lookup"):
        [out], _, _ = systems[name]([prompt])
        assert 0 < len(out) <= 8 and all(t not in eos for t in out[:-1]), name


@pytest.mark.slow  # four pipelines compiled, two with their drafts: 153 s on 2 busy cores
@needs_openvino
@needs_text_pair
@pytest.mark.skipif(not all(exported(n, peers.OV_TEXT_TASK, peers_text.OPENVINO_TEXT_FORMATS) for n in GGUF),
                    reason="the text pair's OpenVINO exports are not cached: tandem bench text --peers openvino "
                           "makes them")
def test_openvino_generates_on_tandems_token_ids():
    """Each system runs on the ids of Tandem's tokenizer, a prompt's KV cache does not leak into the next
    prompt's output, and no more than the tokens asked come out."""
    from transformers import AutoTokenizer

    from pipelines.models.embedded import embedded_path
    from pipelines.models.registry import load_registry

    pair = load_registry().get(TEXT_PAIR)
    tokenizer = AutoTokenizer.from_pretrained(embedded_path(pair.main.id))
    chat = [{"role": "user", "content": "Translate into German: The library opens at nine."}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    eos = (tokenizer.convert_tokens_to_ids("<|im_end|>"),)
    systems = peers_text.openvino_text_systems(pair, 8, eos, 2)
    assert sorted(systems) == sorted(f"OpenVINO {f} {s}" for f in ("int8", "int4") for s in ("plain", "model draft"))
    other = tokenizer("Good morning", add_special_tokens=False)["input_ids"]
    for name, run in systems.items():
        outs, seconds, _ = run([prompt, other, prompt])
        assert outs[0] == outs[2] and seconds > 0, name
        assert 0 < len(outs[0]) <= 8 and "Bibliothek" in tokenizer.decode(outs[0]), (name, tokenizer.decode(outs[0]))
