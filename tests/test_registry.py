"""models.yaml validation (one sentence naming file, pair, field) and the config-only pre-flight."""

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from pipelines.models.registry import RegistryError, load_registry, preflight

GOOD = {
    "defaults": {"asr": "p"},
    "pairs": {"p": {"task": "asr", "main": {"embedded": "whisper-base"}, "assistant": None}},
}


def _write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "models.yaml"
    if isinstance(doc, bytes):  # bytes as they are (not UTF-8)
        path.write_bytes(doc)
    else:
        path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def test_project_registry_loads(registry):
    assert registry.default("asr").name == "whisper-base+distilled"
    assert {p.task for p in registry.pairs.values()} == {"asr", "translate", "summarize"}
    hub = [p for p in registry.pairs.values() if p.main.source == "hub"]
    assert any(p.task == "asr" for p in hub) and any(p.task == "translate" for p in hub)
    assert registry.get("whisper-base+own-decoder").test_only


def _broken(**changes):
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    for key, value in changes.items():
        if value is ...:
            del doc["pairs"]["p"][key]
        else:
            doc["pairs"]["p"][key] = value
    return doc


@pytest.mark.parametrize(
    "doc, needle",
    [
        (_broken(colour="red"), "pair 'p': field 'colour' is not a known field"),
        (_broken(task=...), "pair 'p': field 'task' is missing"),
        (_broken(main=...), "pair 'p': field 'main' is missing"),
        (_broken(task="dance"), "pair 'p': field 'task' is 'dance'"),
        (_broken(main={"embedded": "whisper-huge"}), "pair 'p': field 'main' names unknown embedded model"),
        (_broken(main={"hub": "a/b", "local": "x"}), "pair 'p': field 'main' must name exactly one"),
        (_broken(dtype="int3"), "pair 'p': field 'dtype' is 'int3'"),
        (_broken(draft="model"), "pair 'p': field 'assistant' is missing but draft is 'model'"),
        (_broken(share_encoder=True), "pair 'p': field 'share_encoder' is true but the pair has no assistant"),
        (_broken(assistant_int8=True), "pair 'p': field 'assistant_int8' is true but the pair has no assistant"),
        (_broken(assistant_int8="yes"), "pair 'p': field 'assistant_int8' must be true or false"),
        ({"pairs": GOOD["pairs"], "defaults": {"asr": "q"}}, "defaults: asr names pair 'q', which is not defined"),
        ({"pairs": {}}, "'pairs' must be a non-empty mapping"),
        ({"pairs": GOOD["pairs"], "extra": 1}, "unknown top-level key 'extra'"),
        ("pairs: [unclosed", "is not valid YAML at line"),
        ("pairs:\n  a: {task: asr, main: {embedded: whisper-base}}\n  a: {task: asr, main: {embedded: whisper-tiny.en}}\n",
         "key 'a' is given twice (YAML at line 3)"),
        ({"pairs": GOOD["pairs"], "defaults": {"asr": ["p"]}}, "defaults: asr must name one pair, not ['p']"),
        (b"pairs:\n  p: {task: asr, main: {embedded: whisper-base}} # caf\xe9\n", "is not UTF-8 text (at byte offset"),
    ],
)
def test_broken_files_fail_with_one_clear_sentence(tmp_path, doc, needle):
    path = _write(tmp_path, doc)
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    message = str(info.value)
    assert message.startswith(str(path)) and needle in message
    assert "\n" not in message


def test_missing_file(tmp_path):
    with pytest.raises(RegistryError, match="cannot be read"):
        load_registry(tmp_path / "absent.yaml")


def _config_only_folder(tmp_path: Path, name: str, tokenizer_from: Path, **config_changes) -> Path:
    """A model folder holding only a config and a tokenizer: enough for the pre-flight, no weights."""
    from transformers import AutoConfig, AutoTokenizer

    folder = tmp_path / name
    config = AutoConfig.from_pretrained(tokenizer_from)
    for key, value in config_changes.items():
        setattr(config, key, value)
    config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(folder)
    return folder


def _pair_file(tmp_path, assistant: Path, share=True) -> Path:
    return _write(tmp_path, {"pairs": {"x": {
        "task": "asr", "main": {"embedded": "whisper-base"}, "assistant": {"local": str(assistant)},
        "share_encoder": share}}})


def test_preflight_accepts_a_matching_config_only_assistant(tmp_path, base_dir):
    folder = _config_only_folder(tmp_path, "same", base_dir, decoder_layers=2)
    assert not (folder / "model.safetensors").exists()
    verdict = preflight(load_registry(_pair_file(tmp_path, folder)).get("x"))
    assert verdict.ok is True, verdict.summary()


def test_preflight_rejects_wrong_d_model(tmp_path, base_dir):
    folder = _config_only_folder(tmp_path, "narrow", base_dir, d_model=384)
    verdict = preflight(load_registry(_pair_file(tmp_path, folder)).get("x"))
    assert verdict.ok is False and "d_model differs (main 512, assistant 384)" in verdict.summary()


def test_preflight_rejects_wrong_mel_bins(tmp_path, base_dir):
    folder = _config_only_folder(tmp_path, "mels", base_dir, num_mel_bins=128)
    verdict = preflight(load_registry(_pair_file(tmp_path, folder)).get("x"))
    assert verdict.ok is False and "mel bins differ" in verdict.summary()


def test_preflight_rejects_a_different_tokenizer(tmp_path, base_dir):
    from pipelines.models.embedded import embedded_path

    folder = _config_only_folder(tmp_path, "tiny", embedded_path("whisper-tiny.en"))
    verdict = preflight(load_registry(_pair_file(tmp_path, folder, share=False)).get("x"))
    assert verdict.ok is False and "tokenizers differ" in verdict.summary()


def test_a_pair_that_fails_its_preflight_is_refused_before_its_weights_load(tmp_path, base_dir, monkeypatch, capsys):
    """load_pair (every command's way to a pair) runs the pre-flight first: an assistant with another tokenizer
    used to load and crash mid-decode (or, with a text model drafting for Whisper, run at acceptance 0)."""
    from pipelines.cli import main
    from pipelines.models import pairs
    from pipelines.models.embedded import embedded_path

    folder = _config_only_folder(tmp_path, "tiny", embedded_path("whisper-tiny.en"))
    pair = load_registry(_pair_file(tmp_path, folder, share=False)).get("x")
    monkeypatch.setattr(pairs, "load_model", lambda *a, **k: pytest.fail("weights were loaded"))
    with pytest.raises(RegistryError, match="pair 'x' fails its pre-flight check: .*tokenizers differ"):
        pairs.load_pair(pair)
    clip = tmp_path / "a.wav"
    sf.write(clip, np.zeros(16000, dtype=np.float32), 16000)
    assert main(["--models", str(tmp_path / "models.yaml"), "transcribe", str(clip), "--pair", "x"]) == 2
    err = capsys.readouterr().err
    assert "fails its pre-flight check" in err and err.count("\n") == 1


def test_preflight_rejects_task_misfit(tmp_path, base_dir):
    path = _write(tmp_path, {"pairs": {"t": {"task": "summarize", "main": {"embedded": "whisper-base"}}}})
    verdict = preflight(load_registry(path).get("t"))
    assert verdict.ok is False and "not fit for summarize" in verdict.summary()


def test_hub_pairs_are_not_checked_offline(registry):
    verdict = preflight(registry.get("whisper-large-v3+distil-large-v3"))
    assert verdict.ok is None and "not available offline" in verdict.summary()


def test_embedded_test_pairs_pass_preflight(registry):
    for name in ("whisper-base+own-decoder", "whisper-base+truncated-2l", "whisper-base"):
        assert preflight(registry.get(name)).ok is True
