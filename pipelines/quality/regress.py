"""``tandem regress``: nightly quality and latency regression runs with a history, a baseline, thresholds,
a report with plots, and an exit code.

A config (YAML) names the evaluations to run and the thresholds:

    models: null                 # pair registry (default: the project's models.yaml); relative to the config
    out: reports/nightly         # history.sqlite, report.md, report.html and the plots; relative to the config
    repeats: 3                   # latency repeats per evaluation (interleaved plain/assisted)
    baseline: last               # "last" (the last accepted run) or a run id to pin
    thresholds:
      quality_drop: {wer: 0.005, cer: 0.005, bleu: 1.0, chrf: 1.0, rouge1: 0.01, rouge2: 0.01, rougeL: 0.01}
      identical_min: 1.0         # greedy: anything below 100% identical output is a regression
      speedup_drop: 0.10         # relative drop of the speedup always allowed (the floor) ...
      noise_factor: 2.0          # ... or noise_factor x the spread measured over the repeats, if larger
      tokens_per_call_drop: 0.15 # relative drop of tokens per main-model call allowed (fixed schedules)
    runs:
      - {task: asr, pair: whisper-base, set: speech-real, limit: 12, dtype: float32}
      - {task: asr, pair: whisper-base, set: speech-real, policy: {name: constant, lookahead: 3}}
      - {task: asr, pair: whisper-base, set: speech-long, temperature: [0]}   # no fallback

Every run is appended to the history (``history``: SQLite, one row per run, one per evaluation with
its full tandem-eval/1 report). A run with no regression is accepted and becomes the next baseline;
``--accept ID`` accepts a run by hand (an intended change), ``--pin ID`` (or ``baseline: ID``) compares
with a fixed run.

Comparisons know their noise and compare like with like:
    - each evaluation's baseline is the latest accepted run holding the same evaluation (task, pair, set,
      limit, dtype), measured on the same machine (CPU model, threads, device, library versions) when
      there is one; across machines only quality is compared, and the report says why;
    - the speedup may drop by max(floor, noise_factor x spread), the spread being the relative range of
      its per-repeat values in this run and in the baseline's; with one repeat there is no spread to
      measure, and it is then reported, not gated;
    - tokens per main call are gated (by the floor alone) on fixed-schedule evaluations (``policy: {name:
      constant, lookahead: 3}``), where they are the same on every run of the same code; the adaptive
      lookahead picks k from step costs measured in the run, so its tokens per call are reported, not gated;
    - an evaluation with no baseline says so, and the run becomes its baseline.
The whole config is validated before anything runs (``regress_config.load_config``): unknown keys, metric
names, numbers and their ranges, dtypes, limits, policies, pairs (present, fitting the task) and sets (known,
of the task).
Exit codes: 0 no regression, 1 a regression (and nothing else), 2 a config or run problem.
"""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path

from .history import (
    Finding,
    accept_run,
    baselines_for,
    heal_report,
    machine_of,
    open_history,
    render_report,
    store_run,
    tokens_per_call,
)
from .regress_config import (
    DEFAULT_THRESHOLDS,
    LOWER_IS_BETTER,
    Config,
    RegressConfigError,
    RegressRunError,
    load_config,
)

__all__ = ["DEFAULT_THRESHOLDS", "Config", "RegressConfigError", "RegressRunError", "accept", "compare", "load_config",
           "regress"]

# ----------------------------------------------------------------------------------------------------
# Comparison


def _spread(values: list[float]) -> float | None:
    """Relative range (max - min) / median of repeated measurements; None with fewer than two."""
    values = [v for v in values if v]
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def speedups(report: dict) -> list[float]:
    """The speedup of each repeat (plain / assisted of the same interleaved round)."""
    lat = report["latency"]
    return [p / a for p, a in zip(lat["plain"]["runs_s"], lat["assisted"]["runs_s"]) if a]


def _allowance(floor: float, factor: float, now: float | None, base: float | None) -> float | None:
    """max(floor, factor x the larger measured spread); None when neither run measured one."""
    spreads = [s for s in (now, base) if s is not None]
    return max(floor, factor * max(spreads)) if spreads else None


def _gate_drop(found: list[Finding], notes: list[str], what: Finding, now: float, old: float, allowed: float | None,
               why_not: str, unit: str) -> None:
    """A relative drop of ``now`` below ``old`` beyond ``allowed`` is a regression (``what`` names it); with no
    allowance (no noise measured) the figures are noted, not gated."""
    figures = f"{what.line} {now:.2f}{unit} vs baseline {old:.2f}{unit}"
    if allowed is None:
        notes.append(f"{figures} not gated ({why_not})")
    elif now < old * (1 - allowed):
        found.append(Finding(what.key, what.what, f"{figures} (dropped {1 - now / old:.0%} > allowed {allowed:.0%})"))


def label_of(key: str, report: dict) -> str:
    """An evaluation as its findings name it, with everything in its key (``EvalSpec.key``) that tells two runs of
    one pair and set apart: "asr whisper-base+distilled/speech-real [limit all, dtype pair, adaptive]"."""
    label = f"{report['task']} {report['pair']}/{report['set']}"
    parts = key.split("|")
    if len(parts) < 5:  # not an EvalSpec key
        return label
    return f"{label} [limit {parts[3]}, dtype {parts[4]}, {parts[5] if len(parts) > 5 else 'adaptive'}]"


def compare(key: str, now: dict, base: dict | None, same_machine: bool, th: dict) -> tuple[list[Finding], list[str]]:
    """Regressions of one evaluation against its baseline, and notes (what was not compared, and why).
    The identical rate needs no baseline."""
    found, notes = [], []
    label = label_of(key, now)
    if now["identical_rate"] < th["identical_min"]:
        found.append(Finding(key, "identical", f"{label}: identical output {now['identical_rate']:.1%} < "
                                               f"{th['identical_min']:.0%} (assisted differs from plain greedy)"))
    if base is None:
        notes.append(f"NEW: {label}: no baseline to compare with; this run becomes its baseline")
        return found, notes
    for metric, score in now["quality"]["assisted"].items():
        old = base["quality"]["assisted"].get(metric)
        allowed = th["quality_drop"].get(metric)
        if old is None or allowed is None:
            continue
        drop = score["value"] - old["value"] if metric in LOWER_IS_BETTER else old["value"] - score["value"]
        if drop > allowed + 1e-12:
            found.append(Finding(key, "quality", f"{label}: {metric} {score['value']:.4f} vs baseline {old['value']:.4f} "
                                                 f"(worse by {drop:.4f} > allowed {allowed})"))
    if not same_machine:
        diff = ", ".join(f"{k} {base_env!r} -> {now_env!r}" for k, now_env, base_env in
                         ((k, machine_of(now)[k], machine_of(base)[k]) for k in machine_of(now)) if now_env != base_env)
        notes.append(f"{label}: speed not compared (baseline measured on another machine or setting: {diff}); quality compared")
        return found, notes
    adaptive = now.get("policy", {}).get("name") == "adaptive"
    # speedup: a drop beyond max(floor, noise_factor x the spread of the per-repeat speedups, now and baseline)
    allowed = _allowance(th["speedup_drop"], th["noise_factor"], _spread(speedups(now)), _spread(speedups(base)))
    _gate_drop(found, notes, Finding(key, "speedup", f"{label}: speedup"), now["latency"]["speedup"],
               base["latency"]["speedup"], allowed, "one repeat measures no noise: set repeats to 3 or more", "x")
    # tokens per call: a fixed schedule gives the same figure on every run of the same code (the floor alone
    # gates it); the adaptive lookahead picks k from step costs measured in this run, so its figure moves
    # with timing from night to night (2.49 -> 2.18 on unchanged code) more than across one run's repeats:
    # reported, not gated (an acceptance drop is caught by the fixed-schedule evaluations)
    t_now, t_old = tokens_per_call(now), tokens_per_call(base)
    if t_now and t_old:
        _gate_drop(found, notes, Finding(key, "tokens_per_call", f"{label}: tokens per main call"), t_now, t_old,
                   None if adaptive else th["tokens_per_call_drop"],
                   "the adaptive lookahead's choices depend on timing; a fixed-schedule evaluation gates acceptance", "")
    return found, notes


# ----------------------------------------------------------------------------------------------------


def regress(config: Config, pin: int | None = None, log=print, device: str = "cpu"
            ) -> tuple[int, list[Finding], list[str], Path]:
    """Run every evaluation on ``device`` ("cpu", "cuda:0": devices.resolve_device), compare each with its
    baseline (speed only with one measured on the same machine and device), store the run, write the report.
    Returns (run id, regressions, notes, report.html path). Raises RegressRunError when an evaluation cannot run."""
    from ..engine import PolicyOptions
    from ..models.loading import ModelUnavailableError
    from .evaluation import evaluate
    from .sets import DataBuildError

    db = open_history(config.out / "history.sqlite")
    heal_report(db, config.out)
    pinned = pin if pin is not None else (None if config.baseline == "last" else int(config.baseline))
    if pinned is not None and db.execute("SELECT 1 FROM runs WHERE id = ?", (pinned,)).fetchone() is None:
        raise RegressConfigError(f"baseline run {pinned} is not in the history {config.out / 'history.sqlite'}")
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    results: dict[str, dict] = {}
    for spec in config.runs:
        log(f"evaluating {spec.key}")
        try:
            results[spec.key] = evaluate(spec.task, spec.pair, spec.set, limit=spec.limit, repeats=spec.repeats or config.repeats,
                                         dtype=spec.dtype, models=config.models, policy=PolicyOptions(**dict(spec.policy)),
                                         temperature=spec.temperature, device=device)
        except (ModelUnavailableError, DataBuildError) as exc:
            raise RegressRunError(f"{spec.key.replace('|', ' ')}: {exc}") from None
    machines = {key: machine_of(r) for key, r in results.items()}
    bases = baselines_for(db, list(results), machines, pinned)
    findings, notes = [], []
    for key, r in results.items():
        base = bases.get(key)
        f, n = compare(key, r, base[1] if base else None, bool(base and base[2]), config.thresholds)
        findings += f
        notes += n
    commit = next(iter(results.values()))["environment"].get("git_commit")
    run_id = store_run(db, started, str(config.path), commit, findings, notes, {k: b[0] for k, b in bases.items()}, results)
    _, html_path = render_report(db, config.out, run_id)
    db.close()
    return run_id, findings, notes, html_path


def accept(config: Config, run_id: int) -> str:
    """Accept a run by hand (an intended change): the baseline for "last" is the latest accepted run holding an
    evaluation, so it becomes the baseline unless a later run is accepted already. Returns what happened, in one
    sentence."""
    db = open_history(config.out / "history.sqlite")
    try:
        if not accept_run(db, run_id):
            raise RegressConfigError(f"run {run_id} is not in the history {config.out / 'history.sqlite'}")
        later = [r for (r,) in db.execute("SELECT id FROM runs WHERE accepted = 1 AND id > ? ORDER BY id", (run_id,))]
    finally:
        db.close()
    if later:
        return (f"run {run_id} accepted, but later accepted runs ({', '.join(map(str, later))}) stay the baseline "
                f"of what they measured; compare with run {run_id} instead: tandem regress --pin {run_id}")
    return f"run {run_id} accepted: it is now the baseline"
