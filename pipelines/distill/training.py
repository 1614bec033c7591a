"""Training a drafter on the shards, whatever its design (``Design``: the shallow student of ``student``, or the
Medusa-style heads of ``medusa``): AdamW, warm-up then cosine decay by step, the held-out estimate every
``eval_every`` steps on each held-out set (``heldout``), the best checkpoint by tokens per call averaged over
them (``heldout.is_better``). Checkpoints are atomic; a run stops at its budget
and ``--resume`` goes on from the last one."""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import numpy as np

from .corpus import default_corpus
from .heldout import heldout_names, is_better
from .options import DistillError, DistillOptions, HeldOut
from .shards import Shard, read_shard
from .student import StudentDesign, corpus_vocabulary, draft_vocabulary
from .teacher import Teacher


class Design(Protocol):
    """A drafter as training sees it."""

    kind: str  # "student" or "medusa"
    init_layers: tuple[int, ...]  # the main decoder's layers it started from (Medusa heads: none)
    vocab: list[int]  # the tokens it drafts (sorted ids)
    params: list  # the trainable tensors

    def loss(self, shards: dict[int, Shard], picks: list[tuple[int, int]]): ...  # scalar tensor, mean per position

    def evaluate(self, shard: Shard) -> HeldOut: ...  # teacher-forced agreement and tokens per main call

    def state(self) -> dict: ...  # the trainable tensors by name (checkpoints)

    def load(self, state: dict) -> None: ...

    def mode(self, training: bool) -> None: ...

    def cost(self, config) -> float: ...  # multiply-adds per drafted token / a main step's (``student.draft_cost``)


def make_design(opts: DistillOptions, teacher: Teacher, vocab: list[int]) -> Design:
    """The drafter ``opts.drafter`` names, in float32 on the teacher's device."""
    if opts.drafter == "medusa":
        from .medusa import MedusaDesign

        return MedusaDesign(teacher, opts, vocab)
    if opts.drafter != "student":
        raise DistillError(f"drafter {opts.drafter!r}: student or medusa")
    return StudentDesign(teacher, opts, vocab)


def draft_always(teacher: Teacher) -> list[int]:
    """Tokens every draft vocabulary keeps: Whisper's special and timestamp tokens (from end-of-text up), a
    text model's special tokens."""
    if teacher.is_whisper:
        return list(range(teacher.tokenizer.convert_tokens_to_ids(teacher.tokenizer.eos_token) or 0,
                          teacher.model.config.vocab_size))
    return list(teacher.tokenizer.all_special_ids)


def training_vocabulary(opts: DistillOptions, teacher: Teacher, shards_ids: list[int]) -> list[int]:
    """The draft vocabulary of a training on ``shards_ids``: their most frequent label tokens
    (``draft_vocabulary``), or, going on from an assistant (``opts.start``), the whole committed corpus's
    (``corpus_vocabulary``: the clips it learnt from as well as these)."""
    size, always = teacher.model.config.vocab_size, draft_always(teacher)
    if opts.start is None:
        return draft_vocabulary(opts.out, shards_ids, opts.draft_vocab, size, always)
    return corpus_vocabulary(opts.corpus or default_corpus(teacher.ref), opts.draft_vocab, size, always)


def _save_checkpoint(path: Path, state: dict) -> None:
    import torch

    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written checkpoint left behind, the last whole one kept
        tmp.unlink(missing_ok=True)
        raise


def rounded(h: HeldOut) -> dict:
    """A held-out estimate as a curve point's fields (4 decimals; Medusa's per-head agreement where measured)."""
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(h).items() if v != ()}


def lr_at(step: int, steps_total: int, lr: float) -> float:
    """Warm-up (5% of the steps, at most 100) then cosine decay to 0, by step."""
    warm = max(1, min(100, steps_total // 20))
    if step < warm:
        return lr * (step + 1) / warm
    return lr * 0.5 * (1 + np.cos(np.pi * min(1.0, (step - warm) / max(1, steps_total - warm))))


def train(opts: DistillOptions, teacher: Teacher, shards_ids: list[int], deadline: float | None, log,
          folder: Path | None = None) -> dict:
    """Train (or go on training) the drafter ``opts.drafter`` on the features of ``shards_ids`` for
    ``opts.steps`` optimizer steps (default: ``opts.epochs`` over them), checkpoints in ``folder`` (default:
    the run's ``train``); returns the training state summary. DistillError when ``folder`` was trained towards
    another number of steps."""
    import torch
    from tqdm import tqdm

    out = folder or opts.out / "train"
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint.pt"
    vocab = training_vocabulary(opts, teacher, shards_ids)
    design = make_design(opts, teacher, vocab)
    optim = torch.optim.AdamW(design.params, lr=opts.lr, weight_decay=0.01)
    shards = {s: read_shard(opts.out, s) for s in shards_ids}
    heldout = {name: read_shard(opts.out, name) for name in heldout_names(opts)}
    order = [(s, i) for s in shards_ids for i in range(len(shards[s].items))]
    steps_total = opts.steps if opts.steps is not None else max(1, int(opts.epochs * len(order) / opts.batch_size))
    state = {"step": 0, "seen": 0, "best": None, "curve": [], "seconds": 0.0, "steps_total": steps_total}
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=False, map_location=teacher.device)
        planned = saved["state"].get("steps_total", steps_total)
        if planned != steps_total:  # the learning-rate schedule and the curve's "same steps" depend on it
            raise DistillError(f"{out} was trained towards {planned} steps, this run asks for {steps_total}: "
                               "give the same --steps/--epochs (and --curve's largest size), or another --out")
        design.load(saved["student"])
        optim.load_state_dict(saved["optim"])
        state = saved["state"]
        log(f"resumed at step {state['step']} ({state['seen']} clips seen)")

    bar = tqdm(total=steps_total, initial=state["step"], desc="distil", unit="step")
    t_run = time.perf_counter()

    def measure() -> None:  # the held-out point of this step; the best checkpoint by tokens per call
        nonlocal t_run
        design.mode(False)
        h, *others = [design.evaluate(shard) for shard in heldout.values()]
        design.mode(True)
        state["seconds"] += time.perf_counter() - t_run
        t_run = time.perf_counter()
        point = {"step": state["step"], "clips_seen": state["seen"], "distinct_clips": min(state["seen"], len(order)),
                 "loss": None if loss is None else round(float(loss), 4),
                 **rounded(h),
                 **{name: rounded(o) for name, o in zip(list(heldout)[1:], others)},
                 "cpu_seconds": round(state["seconds"], 1)}
        state["curve"].append(point)
        bar.set_postfix(agree=f"{h.agreement:.1%}", tpc=f"{h.tokens_per_call:.2f}")
        log(json.dumps(point))
        if is_better(point, state["best"]):
            state["best"] = point
            _save_checkpoint(out / "best.pt", {"student": design.state(), "vocab": vocab, "drafter": design.kind})

    loss = None
    if state["step"] == 0 and not state["curve"]:
        measure()  # where training starts from (for an early exit, the main model's own first layers)
        _save_checkpoint(ckpt, {"student": design.state(), "optim": optim.state_dict(), "state": state})
    design.mode(True)
    while state["step"] < steps_total:
        if deadline is not None and time.time() > deadline:
            log("budget reached: stopping (resume with --resume)")
            break
        epoch, pos = divmod(state["step"] * opts.batch_size, len(order))
        perm = list(order)
        random.Random(opts.seed + epoch).shuffle(perm)
        picks = perm[pos : pos + opts.batch_size]
        for g in optim.param_groups:
            g["lr"] = lr_at(state["step"], steps_total, opts.lr)
        loss = design.loss(shards, picks)
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(design.params, 1.0)
        optim.step()
        state["step"] += 1
        state["seen"] += len(picks)
        bar.update(1)
        loss = loss.detach()
        bar.set_postfix(loss=f"{float(loss):.3f}")
        if state["step"] % opts.eval_every == 0 or state["step"] == steps_total:
            measure()
            _save_checkpoint(ckpt, {"student": design.state(), "optim": optim.state_dict(), "state": state})
    bar.close()
    state["vocab_size"], state["items"] = len(vocab), len(order)
    state["finished"] = state["step"] >= steps_total
    return state


def load_best(teacher: Teacher, opts: DistillOptions, folder: Path) -> Design:
    """The drafter of a training folder's best checkpoint (float32, on the teacher's device, in eval mode)."""
    import torch

    best = torch.load(folder / "best.pt", weights_only=False, map_location=teacher.device)
    if best.get("drafter", "student") != opts.drafter:
        raise DistillError(f"{folder / 'best.pt'} holds a {best.get('drafter', 'student')} drafter, this run asks for "
                           f"--drafter {opts.drafter}: choose another --out")
    design = make_design(opts, teacher, best["vocab"])
    design.load(best["student"])
    design.mode(False)
    return design
