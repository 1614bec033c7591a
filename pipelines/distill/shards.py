"""Training features on disk (the run's working folder, not the repository): per shard the encoder output
(float16), prompts, labels and the teacher's top-k log-probabilities, built from the committed corpus
(``corpus``: audio synthesised again from the recipes, labels as committed) or, for shards the corpus does
not hold yet, by labelling new clips, which are then added to the corpus. Shard 0 is held out."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .corpus import Corpus, LabelledClip
from .options import HELDOUT_SHARD, DistillError, DistillOptions
from .speech import Sentences, audio_sha256, make_recipe, render
from .teacher import Teacher

GROUP = 16  # items encoded and decoded together


def shard_dir(out: Path, shard: int | str) -> Path:
    """A features shard's folder: a corpus shard by its number, another set by its name (``heldout.FORTUNES``)."""
    return out / "shards" / (shard if isinstance(shard, str) else f"{shard:05d}")


def shard_done(out: Path, shard: int | str) -> bool:
    return (shard_dir(out, shard) / "items.json").is_file()


def write_shard(out: Path, shard: int | str, hidden, mask, items, prompts, labels, topk_ids, topk_lp) -> None:
    final = shard_dir(out, shard)
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        np.save(tmp / "enc.npy", hidden)
        if mask is not None:
            np.save(tmp / "mask.npy", mask)
        np.save(tmp / "topk_ids.npy", topk_ids)
        np.save(tmp / "topk_lp.npy", topk_lp)
        meta = [{"kind": it["kind"], "text": it["text"], "voice": it.get("voice"), "prompt": p, "labels": y,
                 **({"sentences": [list(r) for r in it["recipe"].sentences]} if "recipe" in it else {})}
                for it, p, y in zip(items, prompts, labels)]
        (tmp / "items.json").write_text(json.dumps(meta))
    except BaseException:  # a full disk: the half-written shard goes, so its space is free again
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


@dataclass
class Shard:
    enc: np.ndarray  # memory-mapped (n, T, d) float16
    mask: np.ndarray | None
    items: list[dict]
    topk_ids: np.ndarray
    topk_lp: np.ndarray
    offsets: list[int]  # start of each item's label positions in the top-k arrays


def read_shard(out: Path, shard: int | str) -> Shard:
    d = shard_dir(out, shard)
    items = json.loads((d / "items.json").read_text())
    offsets, acc = [], 0
    for it in items:
        offsets.append(acc)
        acc += len(it["labels"])
    mask = np.load(d / "mask.npy") if (d / "mask.npy").is_file() else None
    return Shard(np.load(d / "enc.npy", mmap_mode="r"), mask, items, np.load(d / "topk_ids.npy"),
                 np.load(d / "topk_lp.npy"), offsets)


def featurise(teacher: Teacher, items: list[dict], max_new: int, labels: list[list[int]] | None = None):
    """Encoder output, mask, prompts, labels (decoded unless given) and top-k of a shard's items, in groups."""
    hidden, mask, prompts, out_labels, ids, lps = [], [], [], [], [], []
    for g in range(0, len(items), GROUP):
        h, m, p, y = teacher.features(items[g : g + GROUP], max_new, None if labels is None else labels[g : g + GROUP])
        i, lp = teacher.topk(h, m, p, y)
        hidden.append(h), mask.append(m), prompts.extend(p), out_labels.extend(y), ids.append(i), lps.append(lp)
    if mask[0] is not None:
        width = max(h.shape[1] for h in hidden)
        hidden = [np.pad(h, ((0, 0), (0, width - h.shape[1]), (0, 0))) for h in hidden]
        mask = [np.pad(m, ((0, 0), (0, width - m.shape[1]))) for m in mask]
    return (np.concatenate(hidden), None if mask[0] is None else np.concatenate(mask), prompts, out_labels,
            np.concatenate(ids), np.concatenate(lps))


class SpeechSource:
    """A shard's spoken items: rendered from the committed corpus where it holds the shard (labels given;
    clips whose sentences left the index skipped and counted), else drawn anew (labels to decode)."""

    def __init__(self, opts: DistillOptions, corpus: Corpus, sentences: Sentences, speaker, tmp: Path) -> None:
        self.opts, self.corpus, self.sentences, self.speaker, self.tmp = opts, corpus, sentences, speaker, tmp
        self.skipped = 0  # clips whose sentences left the index
        self.changed: list[str] = []  # "shard/clip" whose audio differs from when it was labelled

    def items(self, shard: int) -> tuple[list[dict], list[list[int]] | None]:
        tmp = self.tmp / f"tts{shard}.wav"
        text = self.sentences.text
        if self.corpus.has(shard):
            items, labels = [], []
            for i, clip in enumerate(self.corpus.read(shard)):
                if any(r not in text for r in clip.recipe.sentences):
                    self.skipped += 1
                    continue
                audio = render(clip.recipe, text, self.speaker, tmp)
                if not self.corpus.same_audio(shard, i, audio_sha256(audio)):
                    self.changed.append(f"{shard}/{i}")
                items.append(_item(clip.recipe, text, audio))
                labels.append(list(clip.labels))
            return items, labels
        rng = random.Random(self.opts.seed * 100_003 + shard)
        pool = self.sentences.heldout if shard == HELDOUT_SHARD else self.sentences.train
        size = self.opts.heldout if shard == HELDOUT_SHARD else self.opts.shard_size
        items = []
        for _ in range(size):
            spoken: dict = {}  # a window's sentences, synthesised once for its recipe and its audio
            recipe = make_recipe(rng, pool, text, self.speaker, tmp, spoken)
            items.append(_item(recipe, text, render(recipe, text, self.speaker, tmp, spoken)))
        return items, None


def _item(recipe, text, audio) -> dict:
    return {"kind": recipe.kind, "text": " ".join(text[r] for r in recipe.sentences), "recipe": recipe,
            "voice": {"voice": recipe.voice, **dict(recipe.settings)}, "audio": audio}


def synthesised_ahead(make, todo: list[int], deadline: float | None):
    """Yield (shard, items, labels or None) for ``todo`` in order, until the deadline; the next shard's audio
    is synthesised while this one is labelled (flite and Piper run beside the model)."""
    if not todo:
        return
    with ThreadPoolExecutor(1) as pool_ex:
        future = pool_ex.submit(make, todo[0])
        for k, s in enumerate(todo):
            if deadline is not None and time.time() > deadline:
                future.cancel()
                return
            items, labels = future.result()
            if k + 1 < len(todo):
                future = pool_ex.submit(make, todo[k + 1])
            if not items:
                raise DistillError(f"shard {s}: no item left (every clip's sentences left Debian's index)")
            yield s, items, labels


def build_features(opts: DistillOptions, teacher: Teacher, make, shards: list[int], max_new: int, deadline: float | None,
                   log, corpus: Corpus | None = None, reader: Teacher | None = None) -> int:
    """Build the training features of ``shards`` not yet on disk; ``make(shard)`` gives (items, labels or None).
    New labels (``teacher``) are added to ``corpus`` (when given) shard by shard, before the shards it holds
    are encoded (a run stopped by its budget has grown the committed corpus as far as it could: the features
    stay in this folder only); items already labelled are encoded by ``reader`` (default ``teacher``).
    Returns the shards done."""
    todo = [s for s in shards if not shard_done(opts.out, s)]
    if corpus is not None:  # a stable sort: the shards to label first, each part in order
        todo.sort(key=corpus.has)
    for s, items, labels in synthesised_ahead(make, todo, deadline):
        t0 = time.perf_counter()
        fresh = labels is None
        hidden, mask, prompts, labels, ids, lps = featurise(teacher if fresh else reader or teacher, items, max_new, labels)
        seconds = time.perf_counter() - t0
        if fresh and corpus is not None:
            add_labelled(corpus, s, items, labels, made(teacher, seconds, corpus))
        write_shard(opts.out, s, hidden, mask, items, prompts, labels, ids, lps)
        log(f"shard {s}: {len(items)} items, {sum(map(len, labels))} label tokens, "
            f"{seconds:.1f} s {'labelling' if fresh else 'encoding (labels from the corpus)'}")
    return sum(shard_done(opts.out, s) for s in shards)


def grow_corpus(teacher: Teacher, make, shards: list[int], max_new: int, deadline: float | None, log,
                corpus: Corpus) -> int:
    """Label the ``shards`` the corpus does not hold and add them to it; no training features (``--label-only``:
    a run that only grows the corpus skips the teacher's top-k pass and the encoder output on disk).
    Returns the shards of ``shards`` the corpus holds."""
    todo = [s for s in shards if not corpus.has(s)]
    for s, items, _ in synthesised_ahead(make, todo, deadline):
        t0 = time.perf_counter()
        labels = [y for g in range(0, len(items), GROUP) for y in teacher.labels(items[g : g + GROUP], max_new)]
        seconds = time.perf_counter() - t0
        add_labelled(corpus, s, items, labels, made(teacher, seconds, corpus))
        log(f"shard {s}: {len(items)} items, {sum(map(len, labels))} label tokens, {seconds:.1f} s labelling")
    return sum(corpus.has(s) for s in shards)


def add_labelled(corpus: Corpus, shard: int, items: list[dict], labels: list[list[int]], made: dict) -> None:
    corpus.add(shard, [LabelledClip(it["recipe"], tuple(y)) for it, y in zip(items, labels)],
               [audio_sha256(it["audio"]) for it in items[:2]], made)


def made(teacher: Teacher, seconds: float, corpus: Corpus) -> dict:
    """When, where and how fast a shard was labelled (the corpus manifest keeps it)."""
    from ..devices import cpu_info

    return {"date": time.strftime("%Y-%m-%d"), "device": teacher.device, "cpu": cpu_info()[1],
            "seconds": round(seconds, 1), "synthesis": corpus.synthesis,
            **({"drafter": teacher.drafter} if teacher.drafter else {})}
