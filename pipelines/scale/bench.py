"""``tandem bench scale``: the batch job's throughput in this process vs on a local Ray actor pool.

Each row runs the whole job (``pipelines.asr.batch.transcribe_files``: decoding and writing txt files into a
fresh temporary folder) on the same files: in this process with 1 thread and with every core, then on a new
local Ray instance per row with 1 and 2 actors of ``threads_per_actor`` threads. Wall time counts from the
call to the last file, so it includes loading the pair (and for Ray, starting Ray, its workers and each
actor's copy of the pair); ``start_s`` is Ray's own start (``ray.init``), ``first_s`` the time to the first
file; a Ray row's ``overhead_s`` is its ``first_s`` less the in-process 1-thread row's (Ray's start, its
workers', and the actors' own copies of the pair, before the first file is back). Files come back a batch
at a time, so on a few files ``first_s`` is most of the wall time: the rate a long run approaches is nearer
``files / (wall - overhead)``.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass

from ..asr import TranscribeOptions, Transcript
from ..asr.batch import transcribe_files
from . import RayOptions


@dataclass(frozen=True)
class ScaleRow:
    system: str  # "in-process, 2 threads", "ray, 2 actors x 1 thread"
    files: int
    audio_s: float  # seconds of audio decoded
    wall_s: float  # call to last file, start-up included
    start_s: float | None  # ray.init alone (None in-process)
    first_s: float  # call to the first file (model load, and Ray's start-up)
    overhead_s: float | None  # Ray rows: first_s less the in-process 1-thread row's
    files_per_min: float  # files / wall
    audio_per_wall: float  # seconds of audio per second of wall time (hours of audio per hour)


def _timed_run(paths: list[str], pair, options: TranscribeOptions, ray: RayOptions | None) -> tuple[list[Transcript], float, float]:
    """The job on ``paths`` into a temporary folder: its results, wall seconds and seconds to the first file."""
    start = time.perf_counter()
    first: list[float] = []
    with tempfile.TemporaryDirectory(prefix="tandem-bench-scale-") as out:
        run = transcribe_files(paths, pair, options, out, ("txt",), ray=ray,
                               on_result=lambda r: first or first.append(time.perf_counter() - start))
    return list(run.results), time.perf_counter() - start, first[0] if first else float("nan")


def _row(system: str, results: list[Transcript], wall: float, first: float, start_s: float | None,
         base_first: float | None = None) -> ScaleRow:
    audio = sum(r.duration for r in results if r.ok)
    overhead = first - base_first if base_first is not None else None
    return ScaleRow(system, len(results), audio, wall, start_s, first, overhead, len(results) / wall * 60, audio / wall)


def _in_process(paths, pair, options, threads: int) -> ScaleRow:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results, wall, first = _timed_run(paths, pair, options, None)
    finally:
        torch.set_num_threads(before)
    return _row(f"in-process, {threads} thread{'s' if threads > 1 else ''}", results, wall, first, None)


def _on_ray(paths, pair, options, actors: int, threads: int, base_first: float) -> ScaleRow:
    import ray

    from .ray_batch import connect

    start = time.perf_counter()
    connect("local")
    start_s = time.perf_counter() - start
    try:
        results, wall, first = _timed_run(paths, pair, options, RayOptions("local", actors=actors, threads_per_actor=threads))
    finally:
        ray.shutdown()
    return _row(f"ray, {actors} actor{'s' if actors > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}",
                results, wall + start_s, first + start_s, start_s, base_first)


def bench_scale(pair_name: str | None = None, set_name: str = "speech-real", limit: int = 12, batch_size: int = 4,
                actor_counts: tuple[int, ...] = (1, 2), threads_per_actor: int = 1, json_path: str | None = None,
                log=print) -> dict:
    """Rows in-process (1 thread, every core) and on Ray (``actor_counts`` actors), same files and options;
    logs a table and returns (and with ``json_path`` writes) ``{"environment", "pair", "rows": [...]}``."""
    from ..models.registry import load_registry
    from ..quality.bench import environment, write_report
    from ..quality.sets import build_set, read_manifest

    registry = load_registry()
    pair = registry.get(pair_name) if pair_name else registry.default("asr")
    build_set(set_name)
    paths = [i["audio_path"] for i in read_manifest(set_name)[:limit]]
    options = TranscribeOptions(batch_size=batch_size)
    log(f"environment: {environment()}; load average {os.getloadavg()[0]:.2f} at the start")
    log(f"pair: {pair.name}; {len(paths)} files of {set_name}; batch {batch_size}")
    log(f"{'system':28s} {'files':>5s} {'audio s':>8s} {'wall s':>7s} {'ray.init s':>10s} {'first s':>8s} "
        f"{'overhead s':>10s} {'files/min':>9s} {'audio/wall':>10s}")
    rows = []
    cores = os.cpu_count() or 1
    for threads in sorted({1, cores}):
        rows.append(_in_process(paths, pair, options, threads))
        _log_row(rows[-1], log)
    for actors in actor_counts:
        rows.append(_on_ray(paths, pair, options, actors, threads_per_actor, rows[0].first_s))
        _log_row(rows[-1], log)
    log(f"load average {os.getloadavg()[0]:.2f} at the end")
    report = {"environment": environment(), "pair": pair.name, "set": set_name, "batch_size": batch_size,
              "rows": [asdict(r) for r in rows]}
    return write_report(report, json_path, log)


def _log_row(r: ScaleRow, log) -> None:
    init, over = (f"{x:10.1f}" if x is not None else f"{'-':>10s}" for x in (r.start_s, r.overhead_s))
    log(f"{r.system:28s} {r.files:5d} {r.audio_s:8.1f} {r.wall_s:7.1f} {init} {r.first_s:8.1f} {over} "
        f"{r.files_per_min:9.1f} {r.audio_per_wall:10.2f}")
