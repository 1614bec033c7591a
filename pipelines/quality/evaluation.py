"""``tandem eval``: quality and latency of plain and assisted decoding for one (task, pair, set), in one run.

Quality: the task's metrics (WER/CER for asr, BLEU/chrF for translate, ROUGE for summarize), each with its
signature, for plain and for assisted decoding, and the share of items whose assisted output is identical
to plain greedy. Latency: both modes warmed up, then run interleaved (plain, assisted, plain, ...) over the
whole set ``repeats`` times; median, min and max per mode, and the speedup of the medians. Plus acceptance,
main-model calls per token, peak memory and an environment signature. Every task writes the same schema
(``SCHEMA`` below).
"""

from __future__ import annotations

import json
import platform
import resource
import statistics
import subprocess
import time
from pathlib import Path

from ..errors import TandemError

SCHEMA = "tandem-eval/1"
# {
#   "schema": "tandem-eval/1", "task": str, "pair": str, "set": str, "items": int, "dtype": str,
#   "policy": {"name", "lookahead", "max_lookahead"},  # the engine's lookahead policy
#   "quality": {"plain": {metric: {"name", "value", "signature", "n"}}, "assisted": {...}},
#   "identical_rate": float,                      # assisted output == plain output, share of items
#   "latency": {"plain": {"median_s", "min_s", "max_s", "runs_s": [...]}, "assisted": {...},
#               "speedup": float, "repeats": int},  # speedup = plain median / assisted median
#   "acceptance": float | null, "calls_per_token": float | null, "tokens": int,
#   "tokens_per_call_runs": [float, ...],          # tokens per main-model call, each assisted repeat
#   "peak_memory_mb": float, "environment": {...}
# }


def environment(dtype: str, device: str = "cpu") -> dict:
    from .. import __version__
    from .bench import environment as env

    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return {**env(), "tandem": __version__, "dtype": dtype, "device": device, "git_commit": commit,
            "platform": platform.platform(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _spread(runs: list[float]) -> dict:
    return {"median_s": statistics.median(runs), "min_s": min(runs), "max_s": max(runs), "runs_s": runs}


def _asr_runner(pair, items, dtype, policy, temperature=None, device="cpu"):
    from ..asr import TranscribeOptions, WhisperRunner, transcribe
    from .metrics import cer, wer

    runner = WhisperRunner(pair, dtype, device)
    paths = [i["audio_path"] for i in items]
    refs = [i["reference"] for i in items]

    def run(assisted: bool):
        extra = {} if temperature is None else {"temperature": tuple(temperature)}
        options = TranscribeOptions(use_assistant=assisted, batch_size=4, policy=policy, dtype=dtype, device=device,
                                    **extra)
        results = {r.path: r for r in transcribe(paths, pair, options, runner)}
        ordered = [results[p] for p in paths]
        bad = [r for r in ordered if not r.ok]
        if bad:
            raise RuntimeError(f"{bad[0].path}: {bad[0].error}")
        stats = (sum(r.tokens for r in ordered), sum(r.main_calls for r in ordered),
                 sum(r.drafted for r in ordered), sum(r.accepted for r in ordered))
        return [r.text for r in ordered], stats

    def score(texts):
        return {"wer": wer(texts, refs).to_dict(), "cer": cer(texts, refs).to_dict()}

    return run, score


def _text_runner(pair, task, items, dtype, policy, device="cpu"):
    from ..languages import code_in
    from ..text import TextOptions, TextRunner
    from .metrics import bleu, chrf, rouge

    runner = TextRunner(pair, dtype, device=device)
    refs = [i["reference"] for i in items]

    def run(assisted: bool):
        outs = []
        for item in items:
            src = tgt = None
            if task == "translate" and pair.languages:
                # translate-udhr's ISO 639-3 codes as the pair writes them (deu_Latn for NLLB, de for a chat pair)
                src = code_in(item.get("source_lang"), pair.languages)
                tgt = code_in(item.get("target_lang"), pair.languages)
            options = TextOptions(use_assistant=assisted, src=src, tgt=tgt, policy=policy)
            outs.append(runner.translate(item["input"], options) if task == "translate" else runner.summarize(item["input"], options))
        stats = (sum(r.tokens for r in outs), sum(r.main_calls for r in outs),
                 sum(r.drafted for r in outs), sum(r.accepted for r in outs))
        return [r.output for r in outs], stats

    def score(texts):
        if task == "translate":
            return {"bleu": bleu(texts, refs).to_dict(), "chrf": chrf(texts, refs).to_dict()}
        return {k: v.to_dict() for k, v in rouge(texts, refs).items()}

    return run, score


def take(items: list[dict], limit: int | None, languages: tuple[str, ...] | None = None) -> list[dict]:
    """The first ``limit`` items (all when None). In a set of several target languages the items are taken in
    turn from each language (only ``languages`` when given), so a limit samples every language."""
    if languages:
        items = [i for i in items if i.get("target_lang") in languages]
    groups: dict[str, list[dict]] = {}
    for item in items:
        groups.setdefault(item.get("target_lang", ""), []).append(item)
    if len(groups) < 2:
        return items[:limit] if limit else items
    turns = [g[i] for i in range(max(map(len, groups.values()))) for g in groups.values() if i < len(g)]
    return turns[:limit] if limit else turns


class EvalRequestError(TandemError, ValueError):
    """A pair and a set that cannot be evaluated for the task; the message says why."""


SET_TASKS = {"speech": "asr", "translate": "translate", "summarize": "summarize"}  # set name prefix -> task


def task_of_set(set_name: str) -> str:
    """The task a set is for, from its name's prefix (``speech-real`` -> ``asr``); EvalRequestError for a name
    that names none."""
    task = SET_TASKS.get(set_name.split("-")[0])
    if task is None:
        raise EvalRequestError(f"set {set_name!r} names no task: speech-*, translate-* or summarize-*")
    return task


def check_request(task: str, pair, set_name: str | None) -> None:
    """EvalRequestError unless ``pair`` (a registry Pair) and the built set ``set_name`` (None: items given) are
    both of ``task``; checked before anything is built or loaded."""
    from ..models.registry import a_task
    from .sets import SETS

    if wrong := pair.task_mismatch(task):
        raise EvalRequestError(f"pair {pair.name!r} is {wrong}")
    if set_name is not None and set_name in SETS and SET_TASKS.get(set_name.split("-")[0]) != task:
        raise EvalRequestError(f"set {set_name!r} is not {a_task(task)} set (--task {task})")


def evaluate(task: str, pair_name: str, set_name: str, limit: int | None = None, repeats: int = 3,
             dtype: str | None = None, models: str | None = None, items: list[dict] | None = None,
             policy=None, temperature: tuple[float, ...] | None = None, device: str = "cpu") -> dict:
    """Run one evaluation and return the report (see SCHEMA). ``policy``: the engine's PolicyOptions
    (default: its own default); ``device``: where the models run ("cpu", "cuda:0": devices.resolve_device)."""
    from ..devices import resolve_dtype
    from ..engine import PolicyOptions
    from ..models.registry import load_registry
    from .sets import build_set, read_manifest

    pair = load_registry(models).get(pair_name)
    check_request(task, pair, set_name if items is None else None)
    if items is None:
        build_set(set_name)
        items = read_manifest(set_name)
    items = take(items, limit)
    dtype = resolve_dtype(device, dtype, pair.dtype)
    policy = policy or PolicyOptions()
    run, score = (_asr_runner(pair, items, dtype, policy, temperature, device) if task == "asr"
                  else _text_runner(pair, task, items, dtype, policy, device))

    run(False), run(True)  # warm-up: caches, lazy imports, first-call allocations
    outputs: dict[bool, list[str]] = {}
    stats: dict[bool, tuple] = {}
    runs: dict[bool, list[float]] = {False: [], True: []}
    per_call: list[float] = []  # tokens per main-model call of each assisted repeat (the adaptive lookahead varies)
    for _ in range(max(1, repeats)):
        for assisted in (False, True):  # interleaved, so drift hits both modes alike
            start = time.perf_counter()
            outputs[assisted], stats[assisted] = run(assisted)
            runs[assisted].append(time.perf_counter() - start)
        t, c = stats[True][0], stats[True][1]
        if c:
            per_call.append(t / c)
    tokens, calls, drafted, accepted = stats[True]
    plain, assisted = _spread(runs[False]), _spread(runs[True])
    return {
        "schema": SCHEMA, "task": task, "pair": pair.name, "set": set_name, "items": len(items), "dtype": dtype,
        "policy": {"name": policy.name, "lookahead": policy.lookahead, "max_lookahead": policy.max_lookahead},
        "quality": {"plain": score(outputs[False]), "assisted": score(outputs[True])},
        "identical_rate": sum(a == b for a, b in zip(outputs[True], outputs[False])) / len(items),
        "latency": {"plain": plain, "assisted": assisted, "speedup": plain["median_s"] / assisted["median_s"],
                    "repeats": max(1, repeats)},
        "acceptance": accepted / drafted if drafted else None,
        "calls_per_token": calls / tokens if tokens else None,
        "tokens_per_call_runs": per_call,
        "tokens": tokens,
        "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "environment": environment(dtype, device),
    }


def format_report(r: dict) -> str:
    lines = [f"{r['task']} | pair {r['pair']} | set {r['set']} ({r['items']} items) | {r['dtype']} on {r['environment']['device']}"]
    for mode in ("plain", "assisted"):
        q = ", ".join(f"{k} {v['value']:.4f}" for k, v in r["quality"][mode].items())
        lat = r["latency"][mode]
        lines.append(f"  {mode:8s} {q} | median {lat['median_s']:.2f} s (min {lat['min_s']:.2f}, max {lat['max_s']:.2f})")
    acc = f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-"
    cpt = f"{r['calls_per_token']:.2f}" if r["calls_per_token"] is not None else "-"
    lines.append(f"  speedup {r['latency']['speedup']:.2f}x | identical {100 * r['identical_rate']:.0f}% | acceptance {acc} "
                 f"| main calls/token {cpt} | peak memory {r['peak_memory_mb']:.0f} MB")
    sig = next(iter(r["quality"]["plain"].values()))["signature"]
    lines.append(f"  signature: {sig}")
    return "\n".join(lines)


def write_report(report: dict, path: str | Path) -> None:
    from ..paths import write_atomic

    write_atomic(Path(path), json.dumps(report, indent=1))
