"""The learning curve by corpus size: for each size N, a student trained from the same initialisation on the
first N training clips of the corpus for the same number of optimizer steps (so that only the number of
distinct clips changes), measured on the synthetic held-out shard and on a real-speech set (speech-real: the
main model's own greedy tokens on it, in the labelling dtype where the device runs it natively, else in
float32: ``features_teacher``), with the device and the time labelling and
training took. Each run's points join the corpus's learning-curve record (``curve.json`` beside its manifest,
committed with it), so the curve grows with the corpus from run to run; the largest size's student is exported
with the whole record on its card."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..paths import write_atomic
from .options import HELDOUT_SHARD, DistillError, DistillOptions, HeldOut, shard_ranges
from .shards import GROUP, Shard, read_shard
from .student import draft_cost, evaluate_heldout
from .teacher import Teacher
from .training import load_best, train

REAL_SET = "speech-real"
RECORD = "curve.json"  # the corpus folder's learning-curve record: every point measured on this corpus


@dataclass(frozen=True)
class CurvePoint:
    clips: int  # distinct training clips (the first N of the corpus)
    steps: int  # optimizer steps, batch ``batch_size``
    clips_seen: int
    heldout: HeldOut  # synthetic held-out shard (its own sentences)
    real: HeldOut  # speech-real, teacher forcing on the main model's greedy tokens
    label_seconds: float  # the labelling time of these clips (the corpus manifest's, all devices)
    label_devices: tuple[str, ...]  # where they were labelled ("cpu: Intel(R) Xeon(R) Processor", "cuda: ...")
    train_seconds: float
    device: str  # where the student was trained
    layers: tuple[int, ...] = ()  # the main decoder's layers it started from
    draft_vocab: int = 0  # tokens its head drafts
    draft_cost: float = 0.0  # multiply-adds of a drafted token / those of a main step (``draft_cost``)
    start: HeldOut | None = None  # held-out before training (for ``init=first``: the main model's early exit)
    drafter: str = "student"  # the design: a shallow student, or "medusa" (heads on the main's hidden state)
    measured: str = ""  # UTC date of the measurement (YYYY-MM-DD)


def real_shard(teacher: Teacher, set_name: str = REAL_SET, max_new: int = 440) -> Shard:
    """A built speech set as an evaluation shard: encoder output and the teacher's greedy tokens for each clip
    of at most 30 s (DataBuildError when the set is not built)."""
    from ..audio import SAMPLE_RATE, load_audio
    from ..quality.sets import read_manifest

    audio = [load_audio(it["audio_path"]) for it in read_manifest(set_name)]
    items = [{"kind": "clip", "audio": a} for a in audio if len(a) <= 30 * SAMPLE_RATE]
    if not items:
        raise DistillError(f"{set_name}: no clip of at most 30 s")
    hidden, meta = [], []
    for g in range(0, len(items), GROUP):
        h, _, prompts, labels = teacher.features(items[g : g + GROUP], max_new)
        hidden.append(h)
        meta += [{"prompt": p, "labels": y} for p, y in zip(prompts, labels)]
    offsets = np.cumsum([0] + [len(m["labels"]) for m in meta]).tolist()
    empty = np.zeros((offsets[-1], 0))  # no top-k targets: evaluation only
    return Shard(np.concatenate(hidden), None, meta, empty.astype(np.int32), empty.astype(np.float16), offsets[:-1])


def labelling_cost(corpus_folder: Path, shards: list[int]) -> tuple[float, tuple[str, ...]]:
    """Seconds the corpus manifest records for labelling ``shards``, and where (and with which pair's
    assistant drafting, where one did) they were labelled."""
    entries = json.loads((corpus_folder / "manifest.json").read_text())["shards"]
    made = [entries[str(s)].get("made", {}) for s in shards if str(s) in entries]
    return (round(sum(m.get("seconds", 0.0) for m in made), 1),
            tuple(sorted({f"{m.get('device', '?')}: {m.get('cpu', '?')}"
                          + (f", drafted by {m['drafter']}" if m.get("drafter") else "") for m in made})))


def shards_for(clips: int, shard_size: int) -> list[int]:
    """The training shards that hold the first ``clips`` clips."""
    return list(range(1, -(-clips // shard_size) + 1))


def start_row(card: dict) -> dict:
    """An assistant's own point of the learning curve by corpus size: its card's row named "this assistant" (the
    run that trained it measured it); for a card without one, what its options and best point say (size, steps,
    clips seen, training seconds; ``shards`` the training shards)."""
    mine = next((p for p in card.get("sizes") or [] if is_own(p.get("role") or "")), None)
    opts = card.get("options") or {}
    shards = opts.get("shards") or shards_for(opts.get("clips", 0), opts.get("shard_size", 64))
    if mine:
        return {"shards": shard_ranges(shards), **mine}
    best = card.get("training") or {}
    return {"clips": card.get("items") or best.get("distinct_clips") or opts.get("clips", 0),
            "steps": opts.get("steps") or best.get("step", 0),
            "clips_seen": best.get("clips_seen", 0), "train_seconds": best.get("cpu_seconds"),
            "shards": shard_ranges(shards)}


def is_own(role: str) -> bool:
    """Whether a card's row with this ``role`` is the card's own assistant ("this assistant", "this assistant,
    shipped"), not its start ("start of this assistant, shipped") or another point."""
    return role == "this assistant" or role.startswith("this assistant,")


def measure_size(opts: DistillOptions, teacher: Teacher, clips: int, real: Shard, corpus_folder: Path | None,
                 deadline: float | None, log) -> CurvePoint | None:
    """Train and measure one size (resumable: its folder ``curve/N`` keeps checkpoints and the point);
    None when the deadline came first."""
    folder = opts.out / "curve" / str(clips)
    done = folder / "point.json"
    if done.is_file():
        stored = json.loads(done.read_text())
        # a point written before points carried their date: the day its file was written
        stored["measured"] = stored.get("measured") or time.strftime("%Y-%m-%d", time.gmtime(done.stat().st_mtime))
        point = point_from_json(stored)
        if point.steps != opts.steps:  # "the same steps each": a size measured at other steps is not reused
            raise DistillError(f"{done}: {clips} clips were trained for {point.steps} steps, this curve asks for "
                               f"{opts.steps}: give the same --steps/--epochs and largest size, or another --out")
        return point
    shards = shards_for(clips, opts.shard_size)
    state = train(opts, teacher, shards, deadline, log, folder)
    if not state["finished"]:
        return None
    design = load_best(teacher, opts, folder)
    heldout = design.evaluate(read_shard(opts.out, HELDOUT_SHARD))
    on_real = design.evaluate(real)
    seconds, devices = labelling_cost(corpus_folder, shards) if corpus_folder else (0.0, ())
    start = state["curve"][0] if state["curve"] and state["curve"][0]["step"] == 0 else None
    point = CurvePoint(sum(len(read_shard(opts.out, s).items) for s in shards), state["step"], state["seen"], heldout,
                       on_real, seconds, devices, round(state["seconds"], 1), device_name(teacher),
                       design.init_layers, len(design.vocab), design.cost(teacher.model.config),
                       None if start is None else HeldOut(start["agreement"], start["tokens_per_call"], start["coverage"],
                                                          tuple(start.get("per_head", ()))), design.kind,
                       time.strftime("%Y-%m-%d", time.gmtime()))
    write_atomic(done, json.dumps(asdict(point), indent=1))
    log(f"curve {clips} clips: held-out {heldout.agreement:.1%} / {heldout.tokens_per_call:.2f} tokens per call, "
        f"{REAL_SET} {on_real.agreement:.1%} / {on_real.tokens_per_call:.2f}, {point.train_seconds} s training")
    return point


def point_from_json(d: dict) -> CurvePoint:
    def held(h: dict) -> HeldOut:
        return HeldOut(**{**h, "per_head": tuple(h.get("per_head", ()))})

    return CurvePoint(**{**d, "heldout": held(d["heldout"]), "real": held(d["real"]),
                         "label_devices": tuple(d["label_devices"]), "layers": tuple(d.get("layers", ())),
                         "start": held(d["start"]) if d.get("start") else None})


def shipped_point(teacher: Teacher, heldout: Shard, real: Shard) -> dict | None:
    """The assistant shipped for this main model (``pipelines/assistants/``), measured as the curve's students
    are: a row to compare the curve with; None when none is shipped for it."""
    from .student import load_layers, make_student, start_folder

    try:
        folder = start_folder("shipped", teacher.ref)
    except DistillError:  # none is shipped for it
        return None
    if not all((folder / f).is_file() for f in ("assistant.json", "card.json", "layers.safetensors")):
        return None
    meta = json.loads((folder / "assistant.json").read_text())
    card = json.loads((folder / "card.json").read_text())
    own = start_row(card)
    student = make_student(teacher.model, meta["layers"]).float().to(teacher.device)
    load_layers(student, folder)
    student.eval()
    vocab = meta["draft_vocab"]
    return {"name": folder.name, "clips": own["clips"], "steps": own["steps"], "clips_seen": own["clips_seen"],
            "layers": meta.get("init_layers"), "draft_vocab": len(vocab),
            "draft_cost": draft_cost(teacher.model.config, meta["layers"], len(vocab)),
            "heldout": asdict(evaluate_heldout(student, heldout, vocab)), "real": asdict(evaluate_heldout(student, real, vocab))}


def point_key(p: dict) -> tuple:
    """What makes two points the same measurement: size, steps and drafter design (its layers, draft
    vocabulary, and for Medusa the number of heads)."""
    return (p["clips"], p["steps"], p.get("drafter", "student"), tuple(p.get("layers") or ()), p.get("draft_vocab", 0),
            len(p["heldout"].get("per_head") or ()))


def record_points(corpus_folder: Path, points: list[dict], heldout: int, log) -> list[dict]:
    """Join ``points`` (``CurvePoint``s as dicts) to the corpus's learning-curve record ``corpus_folder/curve.json``
    (written atomically; a point of the same ``point_key`` replaces the recorded one) and return every recorded
    point, by size, then steps, date and design. A record made with another number of held-out clips (another shard 0), or one
    that cannot be read or written, is left as it is (a line in ``log`` says why) and only ``points`` are
    returned."""
    path = corpus_folder / RECORD
    try:
        record = json.loads(path.read_text()) if path.exists() else {"heldout": heldout, "sizes": []}
        if record["heldout"] != heldout:
            log(f"{path}: measured on {record['heldout']} held-out clips, this run on {heldout}: the record is "
                "left as it is")
            return points
        new = {point_key(p) for p in points}
        sizes = sorted([p for p in record["sizes"] if point_key(p) not in new] + points,
                       key=lambda p: (p["clips"], p["steps"], p.get("measured") or "", point_key(p)))
        write_atomic(path, json.dumps({**record, "sizes": sizes}, indent=1) + "\n")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # never costs the run that just trained
        log(f"{path}: not a learning-curve record ({type(e).__name__}: {e}): left as it is, this run's points kept "
            "in its own curve.json")
        return points
    return sizes


def name_rows(sizes: list[dict], mine: dict, shipped: dict | None,
              shipped_role: str = "shipped") -> tuple[list[dict], dict | None]:
    """The card's rows: ``sizes`` with ``mine`` (the exported point) and the shipped assistant (``shipped_point``)
    named by their ``role`` (the shipped one's ``shipped_role``, e.g. "start of this assistant, shipped");
    ``shipped`` comes back None where it is a recorded point (one row, not two)."""
    now = shipped and point_key(shipped)
    roles = {point_key(mine): "this assistant"}
    if now:
        roles[now] = f"this assistant, {shipped_role}" if now in roles else shipped_role
    rows = [{**p, "role": roles[point_key(p)]} if point_key(p) in roles else p for p in sizes]
    if shipped and now not in {point_key(p) for p in sizes}:
        return rows, {**shipped, "role": shipped_role}
    return rows, None


def learning_curve(opts: DistillOptions, label_teacher: Teacher, train_teacher: Teacher, corpus_folder: Path | None,
                   deadline: float | None, log) -> tuple[list[CurvePoint], dict | None, list[dict]] | None:
    """Every size of ``opts.curve`` (ascending), the shipped assistant measured alike (``shipped_point``), and
    the corpus's record with these points joined (``record_points``; this run's points alone without a corpus
    folder). None when the deadline came first (``--resume`` goes on)."""
    real = real_shard(label_teacher)
    points = []
    for clips in sorted(opts.curve):
        point = measure_size(opts, train_teacher, clips, real, corpus_folder, deadline, log)
        if point is None:
            return None
        points.append(point)
    shipped = shipped_point(train_teacher, read_shard(opts.out, HELDOUT_SHARD), real)
    own = [asdict(p) for p in points]
    (opts.out / "curve.json").write_text(json.dumps({"sizes": own, "shipped": shipped}, indent=1))
    (opts.out / "curve.md").write_text("\n".join(curve_table(own, shipped)) + "\n")
    sizes = own if corpus_folder is None else record_points(corpus_folder, own, opts.heldout, log)
    return points, shipped, sizes


def curve_table(points: list[dict], shipped: dict | None = None) -> list[str]:
    """Markdown rows of the learning curve by corpus size (and drafter design: the layers it started from,
    its draft vocabulary, its cost per drafted token relative to a main step). ``points``: ``CurvePoint``s as
    dicts, a point's ``role`` ("this assistant") and ``source`` (where a point typed in from elsewhere comes
    from) said after its size; the first line says whether they share one number of steps. ``shipped``: ``shipped_point``'s dict,
    a last row named by its ``role`` ("shipped" unless given, e.g. "previously shipped" on the card of the
    assistant that replaced it)."""
    same = len({p["steps"] for p in points}) <= 1
    lines = [("Each student: the same optimizer steps, trained on the first N clips" if same else
              "Each student: trained on the first N clips for the optimizer steps of its row (runs of their own)")
             + f"; held-out: the corpus's shard 0 "
             f"(synthetic, its own sentences); {REAL_SET}: its clips with the main model's greedy tokens; teacher "
             "forcing, tokens per main call simulated at lookahead 5 (Medusa heads: as many as the heads), before "
             "training in brackets; draft cost: multiply-adds of a drafted token / a main step's.", "",
             "| clips | from layers | draft vocab | draft cost | steps (clips seen) | held-out agreement | "
             f"held-out tokens/call | {REAL_SET} agreement | {REAL_SET} tokens/call | labelling s (where) | "
             "training s (where) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        start = f" ({p['start']['tokens_per_call']:.2f})" if p.get("start") else ""
        design = (f"Medusa heads x{len(p['heldout'].get('per_head', ()))}" if p.get("drafter") == "medusa"
                  else str(list(p.get("layers", ()))))
        said = "; ".join(x for x in (p.get("role"), p.get("source")) if x)
        clips = f"{p['clips']:,}" + (f" ({said})" if said else "")
        when = f", measured {p['measured']}" if p.get("measured") else ""
        labelled = ("not in this corpus" if p["label_seconds"] is None
                    else f"{p['label_seconds']:,.0f} ({'; '.join(p['label_devices'])})")
        lines.append(f"| {clips} | {design} | {p.get('draft_vocab', 0):,} | "
                     f"{p.get('draft_cost', 0):.2f} | {p['steps']} ({p['clips_seen']:,}) | {p['heldout']['agreement']:.1%} | "
                     f"{p['heldout']['tokens_per_call']:.2f}{start} | {p['real']['agreement']:.1%} | "
                     f"{p['real']['tokens_per_call']:.2f} | {labelled} | "
                     f"{'not kept' if p['train_seconds'] is None else format(p['train_seconds'], ',.0f')} "
                     f"({p['device']}{when}) |")
    if shipped:
        p = shipped
        lines.append(f"| {p['clips']:,} (the {p.get('role', 'shipped')} {p['name']}, its card) | {p['layers']} | "
                     f"{p['draft_vocab']:,} | "
                     f"{p['draft_cost']:.2f} | {p['steps']} ({p['clips_seen']:,}) | {p['heldout']['agreement']:.1%} | "
                     f"{p['heldout']['tokens_per_call']:.2f} | {p['real']['agreement']:.1%} | {p['real']['tokens_per_call']:.2f} "
                     "| see its card | see its card |")
    return lines


def device_name(teacher: Teacher) -> str:
    """Where the teacher runs, as the curve records it ("cpu: Intel(R) Xeon(R) Processor", "cuda:0: NVIDIA H200")."""
    return f"{teacher.device}: {_where(teacher)}"


def _where(teacher: Teacher) -> str:
    from ..devices import cpu_info

    if teacher.device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(teacher.device)
    return cpu_info()[1]
