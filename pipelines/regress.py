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
      speedup_drop: 0.10         # relative drop of the speedup allowed ...
      noise_factor: 2.0          # ... or noise_factor x the measured relative spread, whichever is larger
      tokens_per_call_drop: 0.15 # relative drop of tokens per main-model call (acceptance) allowed
    runs:
      - {task: asr, pair: whisper-base, set: speech-real, limit: 12, dtype: float32}
      - {task: asr, pair: whisper-base, set: speech-real, policy: {name: constant, lookahead: 3}}

Every run is appended to the history (SQLite: one row per run, one per evaluation with its full tandem-eval/1
report). A run with no regression is accepted and becomes the next baseline; ``--accept ID`` accepts a run by
hand (an intended change), ``--pin ID`` (or ``baseline: ID``) compares with a fixed run.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import yaml

from .outputs import write_atomic

LOWER_IS_BETTER = {"wer", "cer"}
DEFAULT_THRESHOLDS = {
    "quality_drop": {"wer": 0.005, "cer": 0.005, "bleu": 1.0, "chrf": 1.0, "rouge1": 0.01, "rouge2": 0.01, "rougeL": 0.01},
    "identical_min": 1.0,
    "speedup_drop": 0.10,
    "noise_factor": 2.0,
    "tokens_per_call_drop": 0.15,
}
RUN_KEYS = {"task", "pair", "set", "limit", "dtype", "policy", "repeats"}


class RegressConfigError(ValueError):
    """The regression config cannot be used; the message names the field."""


@dataclass(frozen=True)
class EvalSpec:
    task: str
    pair: str
    set: str
    limit: int | None = None
    dtype: str | None = None
    policy: tuple[tuple[str, object], ...] = ()  # PolicyOptions fields
    repeats: int | None = None

    @property
    def key(self) -> str:
        """What identifies this evaluation across runs: the pair, the data and the dtype. Settings under test
        (the policy, the models file behind the pair name) are not part of it: changing them is what a
        regression run is for."""
        return f"{self.task}|{self.pair}|{self.set}|{self.limit or 'all'}|{self.dtype or 'pair'}"


@dataclass(frozen=True)
class Config:
    path: Path
    models: str | None
    out: Path
    repeats: int
    baseline: str | int
    thresholds: dict
    runs: tuple[EvalSpec, ...]


@dataclass(frozen=True)
class Finding:
    key: str
    what: str  # quality | identical | speedup | tokens_per_call
    line: str  # one line, naming the evaluation and the figures


def _fail(path: Path, where: str, problem: str) -> RegressConfigError:
    return RegressConfigError(f"{path}: {where}: {problem}")


def load_config(path: str | Path) -> Config:
    """Read and validate a regression config (one place that validates)."""
    from .engine import POLICIES, PolicyOptions

    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RegressConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError:
        raise RegressConfigError(f"{path}: is not valid YAML") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("runs"), list) or not raw["runs"]:
        raise RegressConfigError(f"{path}: must be a mapping with a non-empty 'runs' list")
    unknown = set(raw) - {"models", "out", "repeats", "baseline", "thresholds", "runs"}
    if unknown:
        raise _fail(path, sorted(unknown)[0], "unknown key (expected models, out, repeats, baseline, thresholds, runs)")
    thresholds = json.loads(json.dumps(DEFAULT_THRESHOLDS))
    for k, v in (raw.get("thresholds") or {}).items():
        if k not in thresholds:
            raise _fail(path, f"thresholds.{k}", f"unknown threshold (expected {', '.join(thresholds)})")
        if k == "quality_drop":
            if not isinstance(v, dict) or not all(isinstance(x, (int, float)) and x >= 0 for x in v.values()):
                raise _fail(path, "thresholds.quality_drop", "must map metric names to non-negative numbers")
            thresholds[k].update(v)
        elif not isinstance(v, (int, float)) or v < 0:
            raise _fail(path, f"thresholds.{k}", "must be a non-negative number")
        else:
            thresholds[k] = float(v)
    runs = []
    for i, r in enumerate(raw["runs"]):
        where = f"runs[{i}]"
        if not isinstance(r, dict) or not {"task", "pair", "set"} <= set(r):
            raise _fail(path, where, "needs task, pair and set")
        if set(r) - RUN_KEYS:
            raise _fail(path, f"{where}.{sorted(set(r) - RUN_KEYS)[0]}", f"unknown key (expected {', '.join(sorted(RUN_KEYS))})")
        if r["task"] not in ("asr", "translate", "summarize"):
            raise _fail(path, f"{where}.task", f"{r['task']!r} is not asr, translate or summarize")
        policy = r.get("policy") or {}
        if not isinstance(policy, dict) or set(policy) - set(PolicyOptions.__dataclass_fields__):
            raise _fail(path, f"{where}.policy", f"must be a mapping of {', '.join(PolicyOptions.__dataclass_fields__)}")
        if "name" in policy and policy["name"] not in POLICIES:
            raise _fail(path, f"{where}.policy.name", f"{policy['name']!r} is not one of {', '.join(POLICIES)}")
        runs.append(EvalSpec(r["task"], str(r["pair"]), str(r["set"]), r.get("limit"), r.get("dtype"),
                             tuple(sorted(policy.items())), r.get("repeats")))
    base = path.parent
    models = raw.get("models")
    baseline = raw.get("baseline", "last")
    if baseline != "last" and not isinstance(baseline, int):
        raise _fail(path, "baseline", "must be 'last' or a run id")
    return Config(path, str((base / models).resolve()) if models else None, (base / raw.get("out", "reports/nightly")).resolve(),
                  int(raw.get("repeats", 3)), baseline, thresholds, tuple(runs))


# ----------------------------------------------------------------------------------------------------
# History (SQLite)


def open_history(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE IF NOT EXISTS runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT, started TEXT, config TEXT, git_commit TEXT,
            status TEXT, accepted INTEGER, baseline INTEGER, findings TEXT);
        CREATE TABLE IF NOT EXISTS results (
            run_id INTEGER, key TEXT, task TEXT, pair TEXT, set_name TEXT, speedup REAL, identical_rate REAL,
            tokens_per_call REAL, acceptance REAL, quality TEXT, report TEXT);
    """)
    return db


def baseline_run(db: sqlite3.Connection, pinned: str | int) -> int | None:
    if pinned != "last":
        row = db.execute("SELECT id FROM runs WHERE id = ?", (int(pinned),)).fetchone()
        if row is None:
            raise RegressConfigError(f"baseline run {pinned} is not in the history")
        return int(row[0])
    row = db.execute("SELECT id FROM runs WHERE accepted = 1 ORDER BY id DESC LIMIT 1").fetchone()
    return int(row[0]) if row else None


def results_of(db: sqlite3.Connection, run_id: int) -> dict[str, dict]:
    return {key: json.loads(rep) for key, rep in db.execute("SELECT key, report FROM results WHERE run_id = ?", (run_id,))}


# ----------------------------------------------------------------------------------------------------
# Comparison


def tokens_per_call(report: dict) -> float | None:
    cpt = report.get("calls_per_token")
    return 1.0 / cpt if cpt else None


def relative_noise(report: dict) -> float:
    """The measured spread of the speedup: (max - min) / median of each mode's repeated latency, summed
    (the speedup is a ratio of the two, so their relative spreads add)."""
    lat = report["latency"]
    return sum((lat[m]["max_s"] - lat[m]["min_s"]) / lat[m]["median_s"] for m in ("plain", "assisted") if lat[m]["median_s"])


def compare(key: str, now: dict, base: dict | None, th: dict) -> list[Finding]:
    """Regressions of one evaluation against its baseline (identical rate needs no baseline)."""
    found = []
    label = f"{now['task']} {now['pair']}/{now['set']}"
    if now["identical_rate"] < th["identical_min"]:
        found.append(Finding(key, "identical", f"{label}: identical output {now['identical_rate']:.1%} < "
                                               f"{th['identical_min']:.0%} (assisted differs from plain greedy)"))
    if base is None:
        return found
    for metric, score in now["quality"]["assisted"].items():
        old = base["quality"]["assisted"].get(metric)
        allowed = th["quality_drop"].get(metric)
        if old is None or allowed is None:
            continue
        drop = score["value"] - old["value"] if metric in LOWER_IS_BETTER else old["value"] - score["value"]
        if drop > allowed + 1e-12:
            found.append(Finding(key, "quality", f"{label}: {metric} {score['value']:.4f} vs baseline {old['value']:.4f} "
                                                 f"(worse by {drop:.4f} > allowed {allowed})"))
    # speedup: a drop beyond both the fixed threshold and the measured noise of this run and the baseline
    s_now, s_old = now["latency"]["speedup"], base["latency"]["speedup"]
    noise = max(relative_noise(now), relative_noise(base))
    allowed = max(th["speedup_drop"], th["noise_factor"] * noise)
    if s_now < s_old * (1 - allowed):
        found.append(Finding(key, "speedup", f"{label}: speedup {s_now:.2f}x vs baseline {s_old:.2f}x "
                                             f"(dropped {1 - s_now / s_old:.0%} > allowed {allowed:.0%}, noise {noise:.0%})"))
    t_now, t_old = tokens_per_call(now), tokens_per_call(base)
    if t_now and t_old and t_now < t_old * (1 - th["tokens_per_call_drop"]):
        found.append(Finding(key, "tokens_per_call", f"{label}: tokens per main call {t_now:.2f} vs baseline {t_old:.2f} "
                                                     f"(dropped {1 - t_now / t_old:.0%} > allowed {th['tokens_per_call_drop']:.0%})"))
    return found


# ----------------------------------------------------------------------------------------------------
# Report


def _history_series(db: sqlite3.Connection) -> dict[str, list[tuple[int, dict]]]:
    series: dict[str, list[tuple[int, dict]]] = {}
    for run_id, key, rep in db.execute("SELECT run_id, key, report FROM results ORDER BY run_id"):
        series.setdefault(key, []).append((run_id, json.loads(rep)))
    return series


def plot_series(key: str, points: list[tuple[int, dict]]) -> bytes:
    """Speedup and the first quality metric (assisted) over runs, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r, _ in points]
    metric = next(iter(points[-1][1]["quality"]["assisted"]))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3))
    a.plot(runs, [p["latency"]["speedup"] for _, p in points], marker="o")
    a.axhline(1.0, color="grey", lw=0.8, ls="--")
    a.set_title("speedup (plain / assisted)")
    a.set_xlabel("run")
    b.plot(runs, [p["quality"]["assisted"][metric]["value"] for _, p in points], marker="o", color="tab:green")
    b.set_title(f"{metric} (assisted)")
    b.set_xlabel("run")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(key.replace("|", "  "), fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _row(key: str, now: dict, base: dict | None) -> list[str]:
    q = ", ".join(f"{k} {v['value']:.4f}" for k, v in now["quality"]["assisted"].items())
    bq = ", ".join(f"{k} {v['value']:.4f}" for k, v in base["quality"]["assisted"].items()) if base else "-"
    tpc = tokens_per_call(now)
    return [key.replace("|", " "), q, bq, f"{now['latency']['speedup']:.2f}x",
            f"{base['latency']['speedup']:.2f}x" if base else "-", f"{now['identical_rate']:.0%}",
            f"{tpc:.2f}" if tpc else "-"]


def write_report(out: Path, run_id: int, base_id: int | None, results: dict[str, dict], baseline: dict[str, dict],
                 findings: list[Finding], db: sqlite3.Connection) -> tuple[Path, Path]:
    """report.md and report.html (plots embedded; the PNGs are also written next to them)."""
    head = ["evaluation", "quality (assisted)", "baseline quality", "speedup", "baseline speedup", "identical", "tokens/call"]
    rows = [_row(k, r, baseline.get(k)) for k, r in results.items()]
    verdict = "PASS: no regression" if not findings else f"FAIL: {len(findings)} regression(s)"
    md = [f"# Tandem regression run {run_id}", "", f"{verdict}; baseline: run {base_id if base_id else '(none yet)'}", ""]
    md += [f"- {f.line}" for f in findings] + ([""] if findings else [])
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", "## History", ""]
    htm = [f"<h1>Tandem regression run {run_id}</h1>", f"<p><b>{html.escape(verdict)}</b>; baseline: run {base_id or '(none yet)'}</p>"]
    htm += ["<ul>" + "".join(f"<li>{html.escape(f.line)}</li>" for f in findings) + "</ul>"] if findings else []
    htm += ["<table border=1 cellpadding=4><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    htm += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows] + ["</table>", "<h2>History</h2>"]
    series = _history_series(db)
    for i, key in enumerate(results):
        png = plot_series(key, series.get(key, []))
        name = f"plot-{i + 1}.png"
        write_atomic(out / name, png)
        md.append(f"![{key}]({name})")
        htm.append(f"<p>{html.escape(key)}</p><img alt='{html.escape(key)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
    md_path, html_path = out / "report.md", out / "report.html"
    write_atomic(md_path, "\n".join(md) + "\n")
    write_atomic(html_path, "<!doctype html><meta charset=utf-8><title>Tandem regression</title>"
                 "<body style='font-family:sans-serif;max-width:1000px'>" + "\n".join(htm) + "</body>")
    return md_path, html_path


# ----------------------------------------------------------------------------------------------------


def regress(config: Config, pin: int | None = None, log=print) -> tuple[int, list[Finding], Path]:
    """Run every evaluation, store it, compare with the baseline, write the report.
    Returns (run id, regressions, report.html path)."""
    from .engine import PolicyOptions
    from .evaluation import evaluate

    db = open_history(config.out / "history.sqlite")
    base_id = baseline_run(db, pin if pin is not None else config.baseline)
    baseline = results_of(db, base_id) if base_id else {}
    results: dict[str, dict] = {}
    for spec in config.runs:
        log(f"evaluating {spec.key}")
        results[spec.key] = evaluate(spec.task, spec.pair, spec.set, limit=spec.limit, repeats=spec.repeats or config.repeats,
                                     dtype=spec.dtype, models=config.models, policy=PolicyOptions(**dict(spec.policy)))
    findings = [f for k, r in results.items() for f in compare(k, r, baseline.get(k), config.thresholds)]
    commit = next(iter(results.values()))["environment"].get("git_commit")
    cur = db.execute("INSERT INTO runs (started, config, git_commit, status, accepted, baseline, findings) VALUES (?,?,?,?,?,?,?)",
                     (dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), str(config.path), commit,
                      "fail" if findings else "pass", 0 if findings else 1, base_id, json.dumps([f.line for f in findings])))
    run_id = int(cur.lastrowid)
    for key, r in results.items():
        db.execute("INSERT INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                   (run_id, key, r["task"], r["pair"], r["set"], r["latency"]["speedup"], r["identical_rate"],
                    tokens_per_call(r), r["acceptance"], json.dumps(r["quality"]), json.dumps(r)))
    db.commit()
    _, html_path = write_report(config.out, run_id, base_id, results, baseline, findings, db)
    db.close()
    return run_id, findings, html_path


def accept(config: Config, run_id: int) -> None:
    """Accept a run by hand (an intended change): it becomes the baseline for "last"."""
    db = open_history(config.out / "history.sqlite")
    if db.execute("UPDATE runs SET accepted = 1 WHERE id = ?", (run_id,)).rowcount == 0:
        raise RegressConfigError(f"run {run_id} is not in the history {config.out / 'history.sqlite'}")
    db.commit()
    db.close()
