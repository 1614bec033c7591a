"""The nightly history (SQLite) and the report rendered from it.

One row per run (when, config, commit, status, findings, notes, the report it produced) and one per
evaluation (its full tandem-eval/1 report). The database runs in WAL mode with a busy timeout, so a reader
holding it open (a dashboard, a ``sqlite3`` shell) never makes a run fail. The report files are rendered
from the history only, after the run's rows are committed, and every ``tandem regress`` first re-renders
the report of the history's last run when the files on disk show an older one: a run killed between the
commit and the report leaves them disagreeing only until the next invocation.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..paths import write_atomic

# What makes two speed measurements comparable: the same machine, threads, device and libraries.
MACHINE_FIELDS = ("cpu", "threads", "device", "torch", "transformers", "python")


@dataclass(frozen=True)
class Finding:
    key: str
    what: str  # quality | identical | speedup | tokens_per_call
    line: str  # one line, naming the evaluation and the figures


def tokens_per_call(report: dict | None) -> float | None:
    """An evaluation report's tokens per main-model call (1 / its calls_per_token); None when it has none."""
    cpt = report.get("calls_per_token") if report else None
    return 1.0 / cpt if cpt else None


def machine_of(report: dict) -> dict:
    env = report.get("environment") or {}
    return {k: env.get(k) for k in MACHINE_FIELDS}


def open_history(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=60.0)  # wait for a writer rather than fail
    db.execute("PRAGMA journal_mode=WAL")  # readers never block the nightly's commit
    db.executescript("""
        CREATE TABLE IF NOT EXISTS runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT, started TEXT, config TEXT, git_commit TEXT,
            status TEXT, accepted INTEGER, baseline INTEGER, findings TEXT);
        CREATE TABLE IF NOT EXISTS results (
            run_id INTEGER, key TEXT, task TEXT, pair TEXT, set_name TEXT, speedup REAL, identical_rate REAL,
            tokens_per_call REAL, acceptance REAL, quality TEXT, report TEXT);
    """)
    columns = {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    if "notes" not in columns:  # histories written before notes and per-evaluation baselines
        db.execute("ALTER TABLE runs ADD COLUMN notes TEXT")
        db.execute("ALTER TABLE runs ADD COLUMN baselines TEXT")
        db.commit()
    return db


def baselines_for(db: sqlite3.Connection, keys: list[str], machine: dict[str, dict], pinned: int | None
                  ) -> dict[str, tuple[int, dict, bool]]:
    """Per evaluation key: (run id, its report, same machine) of the baseline: from the pinned run, or the
    latest accepted run holding that evaluation, preferring one measured on the same machine."""
    if pinned is not None:
        rows = db.execute("SELECT run_id, key, report FROM results WHERE run_id = ?", (pinned,)).fetchall()
    else:
        rows = db.execute("SELECT r.run_id, r.key, r.report FROM results r JOIN runs u ON u.id = r.run_id "
                          "WHERE u.accepted = 1 ORDER BY r.run_id DESC").fetchall()
    found: dict[str, tuple[int, dict, bool]] = {}
    for run_id, key, rep in rows:
        if key not in keys:
            continue
        report = json.loads(rep)
        same = machine_of(report) == machine[key]
        if key not in found or (same and not found[key][2]):
            found[key] = (int(run_id), report, same)
    return found


def store_run(db: sqlite3.Connection, started: str, config: str, commit: str | None, findings: list[Finding],
              notes: list[str], baselines: dict[str, int], results: dict[str, dict]) -> int:
    """One transaction: the run and its evaluations. A run with no regression is accepted (it becomes the
    baseline of its evaluations)."""
    with db:
        cur = db.execute(
            "INSERT INTO runs (started, config, git_commit, status, accepted, baseline, findings, notes, baselines) "
            "VALUES (?,?,?,?,?,?,?,?,?)",
            (started, config, commit, "fail" if findings else "pass", 0 if findings else 1,
             max(baselines.values(), default=None), json.dumps([f.line for f in findings]), json.dumps(notes),
             json.dumps(baselines)))
        run_id = int(cur.lastrowid)
        for key, r in results.items():
            db.execute("INSERT INTO results VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (run_id, key, r["task"], r["pair"], r["set"], r["latency"]["speedup"], r["identical_rate"],
                        tokens_per_call(r), r["acceptance"], json.dumps(r["quality"]), json.dumps(r)))
    return run_id


def accept_run(db: sqlite3.Connection, run_id: int) -> bool:
    with db:
        return db.execute("UPDATE runs SET accepted = 1 WHERE id = ?", (run_id,)).rowcount > 0


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


def _row(key: str, now: dict, base: dict | None, base_id: int | None) -> list[str]:
    q = ", ".join(f"{k} {v['value']:.4f}" for k, v in now["quality"]["assisted"].items())
    bq = ", ".join(f"{k} {v['value']:.4f}" for k, v in base["quality"]["assisted"].items()) if base else "-"
    tpc, btpc = tokens_per_call(now), tokens_per_call(base) if base else None
    return [key.replace("|", " "), f"run {base_id}" if base_id else "none", q, bq, f"{now['latency']['speedup']:.2f}x",
            f"{base['latency']['speedup']:.2f}x" if base else "-", f"{now['identical_rate']:.0%}",
            f"{tpc:.2f}" if tpc else "-", f"{btpc:.2f}" if btpc else "-"]


def _machine_line(run_id: int, report: dict) -> list[str]:
    env = report.get("environment") or {}
    return [str(run_id), str(env.get("date") or "-"), str(env.get("git_commit") or "-")[:12], str(env.get("cpu") or "-"),
            str(env.get("threads") or "-"), str(env.get("device") or "-"), f"torch {env.get('torch')}",
            f"transformers {env.get('transformers')}"]


def _table(head: list[str], rows: list[list[str]]) -> tuple[list[str], str]:
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    htm = ("<table border=1 cellpadding=4><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
           + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")
    return md, htm


def render_report(db: sqlite3.Connection, out: Path, run_id: int) -> tuple[Path, Path]:
    """report.md and report.html of ``run_id`` from the history (plots embedded; the PNGs are also written
    next to them). The first line of report.md names the run, so a stale report is recognised."""
    status, findings, notes, baselines = db.execute(
        "SELECT status, findings, notes, baselines FROM runs WHERE id = ?", (run_id,)).fetchone()
    findings, notes, baselines = json.loads(findings or "[]"), json.loads(notes or "[]"), json.loads(baselines or "{}")
    results = {key: json.loads(rep) for key, rep in db.execute("SELECT key, report FROM results WHERE run_id = ?", (run_id,))}
    base_reports = {}
    for key, base_id in baselines.items():
        row = db.execute("SELECT report FROM results WHERE run_id = ? AND key = ?", (base_id, key)).fetchone()
        if row:
            base_reports[key] = json.loads(row[0])
    verdict = f"FAIL: {len(findings)} regression(s)" if status == "fail" else "PASS: no regression"
    if status != "fail" and len(baselines) < len(results):
        verdict += f"; {len(results) - len(baselines)} of {len(results)} evaluations had no baseline (this run is now theirs)"
    head = ["evaluation", "baseline", "quality (assisted)", "baseline quality", "speedup", "baseline speedup", "identical",
            "tokens/call", "baseline tokens/call"]
    rows = [_row(k, r, base_reports.get(k), baselines.get(k)) for k, r in results.items()]
    machines = [_machine_line(run_id, next(iter(results.values())))] if results else []
    for key, base_id in sorted(set(baselines.items()), key=lambda kv: kv[1]):
        if key in base_reports and str(base_id) not in {m[0] for m in machines}:
            machines.append(_machine_line(base_id, base_reports[key]))
    md_rows, htm_rows = _table(head, rows)
    md_mach, htm_mach = _table(["run", "date", "commit", "cpu", "threads", "device", "torch", "transformers"], machines)
    md = [f"# Tandem regression run {run_id}", "", verdict, ""]
    md += [f"- {line}" for line in findings + notes] + [""]
    md += md_rows + ["", "## Runs compared", ""] + md_mach + ["", "## History", ""]
    htm = [f"<h1>Tandem regression run {run_id}</h1>", f"<p><b>{html.escape(verdict)}</b></p>"]
    items = [f"<li>{html.escape(line)}</li>" for line in findings + notes]
    htm += ["<ul>" + "".join(items) + "</ul>"] if items else []
    htm += [htm_rows, "<h2>Runs compared</h2>", htm_mach, "<h2>History</h2>"]
    series = _history_series(db)
    for i, key in enumerate(results):
        png = plot_series(key, series.get(key, []))
        name = f"plot-{i + 1}.png"
        write_atomic(out / name, png)
        md.append(f"![{key}]({name})")
        htm.append(f"<p>{html.escape(key)}</p><img alt='{html.escape(key)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>")
    md_path, html_path = out / "report.md", out / "report.html"
    write_atomic(html_path, "<!doctype html><meta charset=utf-8><title>Tandem regression</title>"
                 "<body style='font-family:sans-serif;max-width:1100px'>" + "\n".join(htm) + "</body>")
    write_atomic(md_path, "\n".join(md) + "\n")
    return md_path, html_path


def heal_report(db: sqlite3.Connection, out: Path) -> None:
    """Re-render the report when it does not show the history's last run (a run killed after its commit)."""
    row = db.execute("SELECT MAX(id) FROM runs").fetchone()
    if not row or row[0] is None:
        return
    try:
        first = (out / "report.md").read_text(encoding="utf-8").splitlines()[0]
    except (OSError, IndexError):
        first = ""
    if first != f"# Tandem regression run {row[0]}":
        render_report(db, out, int(row[0]))
