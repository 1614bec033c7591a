"""tandem distill on a small local encoder-decoder text model (the same command as for Whisper): corpus from a
text file, labels from the main model through the engine, a 1-layer student trained within a budget and
resumed, exported as a folder the registry and the engine load like any other assistant; and the shipped
Whisper assistant's checksum guard."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

from pipelines.distill import DistillError, DistillOptions, distill, read_shard, spread_layers
from pipelines.models.registry import load_registry
from pipelines.quality.sets import project_sentences
from pipelines.text import TextOptions, TextRunner


def test_spread_layers_keeps_first_and_last():
    assert spread_layers(6, 2) == [0, 5] and spread_layers(6, 3) == [0, 2, 5] and spread_layers(2, 1) == [1]
    assert spread_layers(4, 8) == [0, 1, 2, 3]


def test_distill_a_text_model_resume_and_use_it(local_models_file, tmp_path):
    main = yaml.safe_load(local_models_file.read_text())["pairs"]["bart-pair"]["main"]["local"]
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(project_sentences()))
    out = tmp_path / "run"
    opts = DistillOptions(main=main, out=out, layers=1, data=(str(corpus),), clips=48, heldout=16, shard_size=16,
                          epochs=2, batch_size=8, eval_every=2, draft_vocab=0)
    # a budget already spent stops the run before it labels anything; a second start must say --resume
    assert distill(DistillOptions(**{**opts.__dict__, "budget_minutes": 1e-9})) is None
    with pytest.raises(DistillError, match="--resume"):
        distill(opts)
    folder = distill(DistillOptions(**{**opts.__dict__, "resume": True}))
    assert folder == out / "assistant" and (folder / "CARD.md").is_file()

    shard = read_shard(out, 1)
    assert len(shard.items) == 16 and all(it["labels"] for it in shard.items)
    assert shard.topk_ids.shape == (sum(len(it["labels"]) for it in shard.items), 8)
    card = json.loads((folder / "card.json").read_text())
    assert card["init_layers"] == [1] and len(card["curve"]) >= 3
    assert all(0.0 <= p["agreement"] <= 1.0 and p["tokens_per_call"] >= 1.0 for p in card["curve"])

    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump({"pairs": {"distilled": {
        "task": "summarize", "main": {"local": main}, "assistant": {"local": str(folder)}, "share_encoder": True}},
        "defaults": {"summarize": "distilled"}}))
    runner = TextRunner(load_registry(models).get("distilled"))
    result = runner.summarize(" ".join(project_sentences()[:3]), TextOptions(compare=True, max_new_tokens=20))
    assert result.identical is True and result.drafted > 0


def test_a_damaged_shipped_assistant_is_refused(tmp_path, monkeypatch):
    from pipelines.models import embedded

    spec = embedded.DERIVED["whisper-base-distilled"]
    src = embedded.ASSISTANTS_DIR / spec.trained
    if not (src / "assistant.json").is_file():
        pytest.skip("no distilled assistant shipped yet")
    copy = tmp_path / spec.trained
    copy.mkdir()
    (copy / "assistant.json").write_bytes((src / "assistant.json").read_bytes())
    data = bytearray((src / "layers.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (copy / "layers.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(embedded, "ASSISTANTS_DIR", tmp_path)
    with pytest.raises(embedded.EmbeddedModelError, match="sha256"):
        embedded._trained_meta(spec)


def test_an_exported_whisper_assistant_folder_loads_as_a_local_assistant(tmp_path):
    from pipelines.models import embedded
    from pipelines.models.loading import ModelRef, ModelUnavailableError, is_available_offline, resolve

    shipped = embedded.ASSISTANTS_DIR / "whisper-base-distilled"
    if not (shipped / "assistant.json").is_file():
        pytest.skip("no distilled assistant shipped yet")
    ref = ModelRef("local", str(shipped))  # the folder tandem distill exports, named in models.yaml
    assert is_available_offline(ref)
    built, _ = resolve(ref)
    config = json.loads((embedded.distilled_path(shipped) / "config.json").read_text())
    meta = json.loads((shipped / "assistant.json").read_text())
    assert built == str(embedded.distilled_path(shipped)) and config["decoder_layers"] == meta["layers"]
    assert config["draft_vocab"] == meta["draft_vocab"]
    cut = tmp_path / "cut"  # the same layers with a smaller draft head: built apart, with its own head
    shutil.copytree(shipped, cut)
    (cut / "assistant.json").write_text(json.dumps({**meta, "draft_vocab": meta["draft_vocab"][::2]}))
    assert json.loads((embedded.distilled_path(cut) / "config.json").read_text())["draft_vocab"] == meta["draft_vocab"][::2]
    assert embedded.distilled_path(cut) != embedded.distilled_path(shipped)
    other = tmp_path / "other"
    other.mkdir()
    (other / "assistant.json").write_text(json.dumps({"base": "openai/whisper-large-v3", "sha256": "0" * 64}))
    with pytest.raises(ModelUnavailableError, match="not an embedded Whisper"):
        resolve(ModelRef("local", str(other)))


@pytest.mark.parametrize("change, message", [
    ({"curve": (100, 128)}, "sizes are whole shards of 64 clips"),
    ({"curve": (128,), "steps": 0}, "at least one optimizer step"),
    ({"curve": (64,), "main": "facebook/bart-large-cnn"}, "Whisper main models only"),
    ({"drafter": "medusa"}, "measured in a learning curve"),
    ({"curve": (64,), "drafter": "medusa", "heads": 0}, "at least one head"),
    ({"shards": (0, 1)}, "shard 0 is held out"),
    ({"shards": (64,), "curve": (64,)}, "do not go together"),
    ({"start": "shipped", "curve": (64,)}, "goes on training an exported Whisper assistant"),
    ({"start": "shipped", "init": "first"}, "goes on training an exported Whisper assistant"),
    ({"start": "shipped", "main": "facebook/bart-large-cnn"}, "goes on training an exported Whisper assistant"),
    ({"start": "shipped", "layers": 3}, "with 2 layers, this run trains 3 layers"),
    ({"start": "/nonexistent/run"}, "not an exported Whisper assistant"),
])
def test_a_curve_it_cannot_measure_is_refused_before_anything_is_labelled(tmp_path, monkeypatch, change, message):
    """A size of part of a shard would train on the whole shard (other clips than the row says), and a text
    main model or no step at all could only fail after hours of labelling: each is one error up front. So is a
    start that cannot be trained on (no such assistant, other layers, a design that starts from the main
    model's own layers) and shards that are not training shards."""
    from pipelines import distill as package

    monkeypatch.setattr(package, "Teacher", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(package, "is_whisper_ref", lambda ref: "whisper" in str(ref))
    opts = DistillOptions(**{"main": "whisper-base", "out": tmp_path / "run", **change})
    with pytest.raises(DistillError, match=message):
        distill(opts, log=lambda *_: None)
    assert not (tmp_path / "run" / "plan.json").exists()  # the corrected command is not refused as "an earlier run"


def test_a_curve_point_measured_at_other_steps_is_not_reused(tmp_path):
    """--resume with another --steps (or another largest size, hence other default steps) would mix rows
    trained for different lengths in one curve: the stored point refuses."""
    from dataclasses import asdict

    from pipelines.distill.curve import CurvePoint, measure_size
    from pipelines.distill.options import HeldOut

    held = HeldOut(0.5, 2.0, 0.9)
    folder = tmp_path / "curve" / "64"
    folder.mkdir(parents=True)
    (folder / "point.json").write_text(json.dumps(asdict(CurvePoint(64, 12, 192, held, held, 1.0, ("cpu: x",), 2.0, "cpu"))))
    opts = DistillOptions(main="whisper-base", out=tmp_path, curve=(64,), steps=12)
    assert measure_size(opts, None, 64, None, None, None, print).steps == 12
    undated = {k: v for k, v in json.loads((folder / "point.json").read_text()).items() if k != "measured"}
    (folder / "point.json").write_text(json.dumps(undated))  # written before points carried their date
    os.utime(folder / "point.json", (1764806400, 1764806400))  # 2025-12-04 00:00 UTC
    assert measure_size(opts, None, 64, None, None, None, print).measured == "2025-12-04"
    with pytest.raises(DistillError, match="trained for 12 steps, this curve asks for 24"):
        measure_size(DistillOptions(**{**opts.__dict__, "steps": 24}), None, 64, None, None, None, print)


def test_shards_are_numbers_and_ranges():
    from pipelines.distill.options import parse_shards, shard_ranges

    assert parse_shards("317-320") == (317, 318, 319, 320) and parse_shards("5, 1-2,2") == (1, 2, 5)
    assert shard_ranges([7, 1, 3, 2, 9, 10]) == "1-3,7,9-10" and shard_ranges([]) == ""
    assert parse_shards(shard_ranges([4, 11, 317, 318, 319])) == (4, 11, 317, 318, 319)
    assert parse_shards(None) == () and parse_shards("") == ()
    for bad in ("a", "5-3", "1-", "-2", "1;2"):
        with pytest.raises(DistillError, match="--shards"):
            parse_shards(bad)


def test_a_start_that_is_not_its_assistant_is_refused(tmp_path):
    """A layers file that is not the one its assistant.json names (damaged, or swapped by hand) is refused."""
    from pipelines.distill.student import read_start
    from pipelines.models import embedded
    from pipelines.models.loading import ModelRef

    shipped = embedded.ASSISTANTS_DIR / "whisper-base-distilled"
    if not (shipped / "assistant.json").is_file():
        pytest.skip("no distilled assistant shipped yet")
    ref = ModelRef("embedded", "whisper-base")
    assert read_start("shipped", ref, 2)[0] == shipped
    run = tmp_path / "run"
    shutil.copytree(shipped, run / "assistant")  # a distill run's folder names its assistant
    assert read_start(str(run), ref, 2)[0] == run / "assistant"
    data = bytearray((shipped / "layers.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (run / "assistant" / "layers.safetensors").write_bytes(bytes(data))
    with pytest.raises(DistillError, match="differs from the sha256"):
        read_start(str(run), ref, 2)
