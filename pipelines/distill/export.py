"""The assistant from the best checkpoint: for Whisper the distinct layers only (bfloat16 safetensors), the
draft vocabulary, a checksum and a card (``pipelines/models/embedded.py`` assembles a ``WhisperForCausalLM`` around
the main model's embeddings); for text models a full transformers folder with the same tokenizer."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

from .heldout import FORTUNES
from .lineage import start_records
from .options import TOPK, DistillOptions, shard_ranges
from .teacher import Teacher
from .training import load_best


def export(opts: DistillOptions, teacher: Teacher, state: dict, log, folder: Path | None = None,
           sizes: list[dict] | None = None, shipped: dict | None = None) -> Path:
    """Write the assistant from the best checkpoint of ``folder`` (default: the run's ``train``) into
    ``out/assistant``; ``sizes``: the learning curve by corpus size, every point the corpus's record holds
    (``curve.record_points``, this assistant's row and the shipped one's with ``role``), shown on the card with
    ``shipped``, the shipped assistant measured in the same run where it is not a recorded point. A run that
    went on from an assistant (``--start``) carries its start's card forward (``lineage.start_records``)."""
    import torch

    best = load_best(teacher, opts, folder or opts.out / "train")
    student, vocab = best.student, best.vocab
    final = opts.out / "assistant"
    tmp = final.with_name(f"assistant.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    card = {
        "main": str(teacher.ref), "layers": opts.layers, "init_layers": student.config.distill_init_layers,
        "draft_vocab_size": len(vocab), "training": state.get("best"), "curve": state.get("curve"),
        **({"items": state["items"]} if "items" in state else {}),
        **(start_records(opts, teacher) if opts.start is not None else {}),
        **({"sizes": sizes, "shipped": shipped} if sizes else {}),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
    }
    if teacher.is_whisper:
        from safetensors.torch import save_file

        dec = student.model.decoder
        tensors = {f"layers.{k}": v.to(torch.bfloat16).cpu().contiguous() for k, v in dec.layers.state_dict().items()}
        tensors.update({f"layer_norm.{k}": v.to(torch.bfloat16).cpu().contiguous() for k, v in dec.layer_norm.state_dict().items()})
        save_file(tensors, tmp / "layers.safetensors")
        digest = hashlib.sha256((tmp / "layers.safetensors").read_bytes()).hexdigest()
        (tmp / "assistant.json").write_text(json.dumps({
            "base": teacher.ref.id, "layers": opts.layers, "init_layers": student.config.distill_init_layers,
            "draft_vocab": vocab, "sha256": digest}, indent=1))
    else:
        student.config.draft_vocab = vocab if len(vocab) < student.config.vocab_size else None
        student.save_pretrained(tmp)
        teacher.tokenizer.save_pretrained(tmp)
    (tmp / "card.json").write_text(json.dumps(card, indent=1))
    (tmp / "CARD.md").write_text(card_text(card))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    log(f"assistant written to {final}")
    return final


def training_items(card: dict) -> str:
    """How many clips it trained on, and which of the corpus's shards where the run named them."""
    opts = card["options"]
    if not opts.get("shards"):
        return f"{opts['clips']} training items"
    return f"{card.get('items', '?')} training items (corpus shards {shard_ranges(opts['shards'])})"


def curve_rows(curve: list[dict]) -> list[str]:
    """The training's held-out points as a table: shard 0 and, where measured, the held-out fortunes
    (``heldout.FORTUNES``; the best checkpoint is chosen on their average)."""
    fortunes = any(FORTUNES in p for p in curve)
    rows = ["| step | clips seen | agreement | tokens per main call (k=5) |"
            + (" fortunes: agreement | fortunes: tokens per call |" if fortunes else "") + " CPU s |",
            "|---|---|---|---|" + ("---|---|" if fortunes else "") + "---|"]
    for p in curve:
        held = p.get(FORTUNES)
        both = (f" {held['agreement']:.1%} | {held['tokens_per_call']:.2f} |" if held else " - | - |") if fortunes else ""
        rows.append(f"| {p['step']} | {p['clips_seen']} | {p['agreement']:.1%} | {p['tokens_per_call']:.2f} |{both} "
                    f"{p['cpu_seconds']} |")
    return rows


def card_text(card: dict) -> str:
    best = card.get("training") or {}
    lines = [
        f"# Distilled assistant for {card['main']}", "",
        f"- decoder layers: {card['layers']} (initialised from the main model's layers {card['init_layers']})",
        "- encoder, token/position embeddings and output head: the main model's own (shared, frozen, not stored)",
        f"- draft vocabulary: {card['draft_vocab_size']} tokens (verification stays over the full vocabulary)"
        + (f"; since {card['vocabulary']['date']}: {card['vocabulary']['counted_over']} ({card['vocabulary']['how']}; "
           f"{card['vocabulary']['measured']})" if card.get("vocabulary") else ""),
        f"- data: {', '.join(card['options']['data'])}; {training_items(card)}, {card['options']['heldout']} held out",
        *([f"- trained on from the assistant {card['start']['folder']} (layers sha256 {card['start']['sha256']})"]
          if card.get("start") else []),
        "- labels: the main model's own greedy output (Tandem's engine); loss CE + "
        f"{card['options']['kl_weight']} x KL to the teacher's top-{TOPK}",
        f"- best held-out point: {json.dumps(best)}", "", "## Learning curve (held-out)", "",
        *curve_rows(card.get("curve") or []),
    ]
    for earlier in card.get("history") or []:  # the trainings it went on from (``--start``), newest first
        lines += ["", f"## Earlier training: {earlier['what']}", "",
                  f"- data: {training_items(earlier) if 'options' in earlier else '?'}; best held-out point: "
                  f"{json.dumps(earlier.get('training'))}", "", *curve_rows(earlier.get("curve") or [])]
    if card.get("sizes"):
        from .curve import curve_table

        lines += ["", "## Learning curve by corpus size", "",
                  "Every point measured on this corpus, run after run (its record: `curve.json` beside the corpus's "
                  "manifest).", "", *curve_table(card["sizes"], card.get("shipped"))]
    return "\n".join(lines) + "\n"


#
