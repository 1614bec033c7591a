"""A Whisper assistant trained on from another (``--start``): what its card carries from its start (the start's
training, newest first, as ``history``) and its own point of the corpus's learning-curve record, counted over its
lineage: every distinct clip the start and this run trained on, their steps and training time together."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .curve import (
    CurvePoint,
    device_name,
    labelling_cost,
    name_rows,
    real_shard,
    record_points,
    shipped_point,
    start_row,
)
from .options import HELDOUT_SHARD, DistillError, DistillOptions, parse_shards, shard_ranges
from .teacher import Teacher


def start_records(opts: DistillOptions, teacher: Teacher) -> dict:
    """What a run that went on from an assistant (``--start``) writes on its card: ``start`` (its folder,
    relative to the project where it lies inside, and its layers' sha256) and, from the start's own card where
    it has one, ``history``: the start's training (its best point, curve, items, options and vocabulary
    record), then the trainings it went on from, newest first."""
    from ..paths import PROJECT_ROOT
    from .student import read_start

    folder, meta = read_start(opts.start, teacher.ref, opts.layers)
    where = folder.resolve()
    shown = where.relative_to(PROJECT_ROOT) if where.is_relative_to(PROJECT_ROOT) else folder
    records: dict = {"start": {"folder": str(shown), "sha256": meta["sha256"]}}
    card = read_card(folder)
    if card:
        own = {k: card[k] for k in ("training", "curve", "items", "options", "start", "vocabulary") if k in card}
        records["history"] = [{"what": f"the start, layers sha256 {meta['sha256'][:12]}", **own},
                              *card.get("history", [])]
    return records


def read_card(folder: Path) -> dict:
    """An exported assistant's card.json ({} where it has none or it cannot be read)."""
    try:
        return json.loads((folder / "card.json").read_text())
    except (OSError, ValueError):
        return {}


def lineage_point(opts: DistillOptions, teacher: Teacher, reader: Teacher, state: dict, corpus_folder: Path,
                  log) -> tuple[list[dict], dict | None]:
    """The best checkpoint of a ``--start`` run measured as the curve's students are (``curve.measure_size``:
    shard 0 and speech-real, labelled by ``reader``), recorded in the corpus's learning-curve record as the size of
    its lineage; returns the card's rows and the shipped assistant (``curve.name_rows``), the shipped one named as
    this run's start where it is."""
    import time

    from .shards import read_shard
    from .student import start_folder
    from .training import load_best

    from_folder = start_folder(opts.start, teacher.ref)
    was = start_row(read_card(from_folder))
    before = set(parse_shards(was["shards"]))
    added = sum(len(read_shard(opts.out, s).items) for s in opts.training_shards if s not in before)
    shards = sorted(before | set(opts.training_shards))
    design = load_best(teacher, opts, opts.out / "train")
    real = real_shard(reader)
    heldout = read_shard(opts.out, HELDOUT_SHARD)
    seconds, devices = labelling_cost(corpus_folder, shards)
    # its size: the start's distinct clips and this run's clips the start never trained on; steps, clips seen
    # and training seconds: the start's and this run's summed
    point = CurvePoint(was["clips"] + added, was["steps"] + state["step"], was["clips_seen"] + state["seen"],
                       design.evaluate(heldout), design.evaluate(real), seconds, devices,
                       round((was.get("train_seconds") or 0) + state["seconds"], 1), device_name(teacher), design.init_layers,
                       len(design.vocab), design.cost(teacher.model.config), None, design.kind,
                       time.strftime("%Y-%m-%d", time.gmtime()))
    mine = {**asdict(point), "shards": shard_ranges(shards),
            "source": f"went on from {from_folder.name} ({was['clips']:,} clips, {was['steps']} steps): "
                      f"{state.get('items', 0):,} clips, {added:,} of them new, {state['step']} steps"}
    sizes = record_points(corpus_folder, [mine], opts.heldout, log)
    shipped = shipped_point(teacher, heldout, real)
    started = shipped_folder(teacher) == from_folder.resolve()
    rows, shipped = name_rows(sizes, mine, shipped, "start of this assistant, shipped" if started else "shipped")
    log(f"this assistant's point: {point.clips:,} clips in its lineage, held-out {point.heldout.agreement:.1%} / "
        f"{point.heldout.tokens_per_call:.2f} tokens per call, speech-real {point.real.agreement:.1%} / "
        f"{point.real.tokens_per_call:.2f}")
    return rows, shipped


def shipped_folder(teacher: Teacher) -> Path | None:
    """The folder of the assistant shipped for the teacher's main model (None where none is)."""
    from .student import start_folder

    try:
        return start_folder("shipped", teacher.ref).resolve()
    except DistillError:
        return None
