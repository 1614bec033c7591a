"""The held-out sets a Whisper student is measured on while it trains (issue 17): the corpus's held-out shard
0 (its own sentences; the committed corpus's shard 0 was labelled before it drew fortunes, so it holds
descriptions only) and, where the sentence index holds out fortunes (``speech.is_heldout``), ``--heldout``
clips (96 by default, as many as shard 0 holds) drawn from those fortunes with a fixed seed, labelled at run
time by the labelling teacher (the corpus's dtype) and kept as the run's features shard ``fortunes``. The best checkpoint is the one with the most tokens per main call averaged over the sets, so a
training that gains on the everyday words of fortunes while losing a little on descriptions is weighed on
both (the corpus draws the two about equally often). ``--curve`` keeps shard 0 alone, as its record does.

The fortunes are featurised by the labelling teacher (bfloat16 where the CPU has it), shard 0 by the run's
reader (float32 on a CPU without bfloat16): their hidden states may differ in the last bits, the labels not."""

from __future__ import annotations

import random
import time
from pathlib import Path

from .options import HELDOUT_SHARD, DistillOptions
from .shards import _item, featurise, shard_done, write_shard
from .speech import Sentences, make_recipe, render
from .teacher import Teacher

FORTUNES = "fortunes"  # the run's features shard of held-out fortunes (``shards.shard_dir``)
FORTUNES_SEED = 20261204


def fortune_items(sentences: Sentences, speaker, tmp: Path, n: int, seed: int = FORTUNES_SEED) -> list[dict]:
    """``n`` items (the corpus's mix of short clips and 30 s windows, ``speech.make_recipe``) drawn with
    ``seed`` from the held-out fortunes of ``sentences``, audio synthesised; [] where it holds out none."""
    pool = [r for r in sentences.heldout if r[0].startswith("fortunes/")]
    if not pool:
        return []
    rng, items = random.Random(seed), []
    for _ in range(n):
        spoken: dict = {}  # a window's sentences, synthesised once for its recipe and its audio
        recipe = make_recipe(rng, pool, sentences.text, speaker, tmp, spoken)
        items.append(_item(recipe, sentences.text, render(recipe, sentences.text, speaker, tmp, spoken)))
    return items


def build_fortunes(out: Path, teacher: Teacher, sentences: Sentences, speaker, tmp: Path, n: int,
                   deadline: float | None, log) -> bool:
    """The run's ``fortunes`` features shard (``n`` items, labelled by ``teacher``'s greedy decoding), unless
    it is on disk or the deadline (``time.time()`` seconds) has passed; returns whether the run has one."""
    if shard_done(out, FORTUNES):
        return True
    if deadline is not None and time.time() > deadline:
        log("held-out fortunes: not labelled (the budget is spent; --resume labels them)")
        return False
    items = fortune_items(sentences, speaker, tmp / "fortunes.wav", n)
    if not items:
        return False
    hidden, mask, prompts, labels, ids, lps = featurise(teacher, items, 440)
    write_shard(out, FORTUNES, hidden, mask, items, prompts, labels, ids, lps)
    log(f"held-out fortunes: {len(items)} items, {sum(map(len, labels))} label tokens")
    return True


def heldout_names(opts: DistillOptions) -> list[int | str]:
    """The held-out features shards a run measures its checkpoints on: shard 0, and ``fortunes`` when built in
    ``opts.out`` and the run is no ``--curve`` (a curve's record stays chosen on shard 0)."""
    return [HELDOUT_SHARD, *([FORTUNES] if not opts.curve and shard_done(opts.out, FORTUNES) else [])]


def selection_score(point: dict, other: dict) -> float:
    """A held-out point's tokens per main call, averaged over the held-out sets it shares with ``other``
    (shard 0's figures at the top level, the fortunes' under ``fortunes``): points measured on different sets
    (a run resumed after its fortunes were built) are compared on shard 0 alone."""
    sets = [point["tokens_per_call"]]
    if FORTUNES in point and FORTUNES in other:
        sets.append(point[FORTUNES]["tokens_per_call"])
    return sum(sets) / len(sets)


def is_better(point: dict, best: dict | None) -> bool:
    """Whether ``point`` beats the best point so far (``selection_score`` on the sets both were measured on)."""
    return best is None or selection_score(point, best) > selection_score(best, point)
