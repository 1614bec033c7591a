"""``tandem bench serve``: the server under load, through its real HTTP API with the official ``openai`` client.

One in-process server (uvicorn in a thread, on a free loopback port) per configuration: continuous batching
(``--max-batch`` rows) or one request at a time (``max_batch`` 1), with or without the pair's assistant;
the pair is loaded once and shared. For each number of clients N, N client threads send the set's files,
each client one request at a time (the next when its answer is in), until every file was sent once.

    requests/s    = files / wall seconds (first request sent to last answer in)
    audio s/s     = the files' audio seconds / wall seconds
    p50, p95      = nearest-rank percentiles of the requests' latencies (upload to answer, client side)
    identical     = every transcript equals the first configuration's (one at a time, no assistant)
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from .options import ServeOptions

ALIAS = "whisper-1"


@dataclass(frozen=True)
class ServeBenchRow:
    batching: str  # "batched" (up to max_batch rows) or "one-at-a-time"
    assistant: bool
    clients: int
    max_batch: int
    requests: int
    audio_seconds: float
    wall_seconds: float
    requests_per_second: float
    audio_per_wall: float  # audio seconds transcribed per wall second
    p50_seconds: float
    p95_seconds: float
    identical: bool  # every transcript equals the first configuration's


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``q`` percent of ``values`` at or below it."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app, port: int | None = None, timeout: float = 120) -> Iterator[str]:
    """Run ``app`` under uvicorn in a thread on 127.0.0.1 (a free port unless given); yields its base URL
    once ``/health`` answers; the server stops on leaving. RuntimeError when it does not come up."""
    import urllib.request

    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline or not thread.is_alive():
                    raise RuntimeError("the benchmark's server did not come up") from None
                time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(60)


def send_files(url: str, files: list[Path], clients: int) -> tuple[float, list[float], list[str]]:
    """``clients`` threads send ``files`` (each once, a client one request at a time) to ``url``'s
    ``/v1/audio/transcriptions``; the wall seconds, each file's latency and text, in ``files``' order."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused-on-loopback", max_retries=0, timeout=3600)
    latencies, texts = [0.0] * len(files), [""] * len(files)

    def one(i: int) -> None:
        start = time.perf_counter()
        with open(files[i], "rb") as f:
            texts[i] = client.audio.transcriptions.create(model=ALIAS, file=f, language="en").text
        latencies[i] = time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(len(files))))
    return time.perf_counter() - start, latencies, texts


def bench_serve(pair_name: str | None, set_names: tuple[str, ...] = ("speech-real",), limit: int = 16,
                clients: tuple[int, ...] = (1, 4, 16), max_batch: int = 16, json_path: str | None = None,
                device: str = "cpu", models: str | None = None, asr=None, files: list[tuple[Path, float]] | None = None,
                log=print) -> list[ServeBenchRow]:
    """Benchmark the server (module docstring): one row per configuration and number of clients.

    ``asr``: a loaded ``(runner, pair)`` (tests), else ``pair_name`` (None: the registry's asr default) is
    loaded; ``files``: ``(path, audio seconds)`` pairs, else the first ``limit`` files of each set."""
    from ..asr import WhisperRunner
    from ..models.registry import load_registry
    from ..quality.bench import environment, write_report
    from .app import create_app
    from .server import load_served

    if asr is None:
        registry = load_registry(models)
        pair = registry.get(pair_name) if pair_name else registry.default("asr")
        asr = (WhisperRunner(pair, None, device), pair)
    files = files if files is not None else set_files(set_names, limit)
    paths, audio = [p for p, _ in files], sum(d for _, d in files)
    configs = [(1, False), (1, True), (max_batch, False), (max_batch, True)]
    log(f"tandem bench serve: {asr[1].name}, {len(files)} files ({audio:.1f} s of audio), clients "
        f"{', '.join(map(str, clients))}; batched = up to {max_batch} rows")
    rows: list[ServeBenchRow] = []
    reference: list[str] | None = None
    for batch, assisted in configs:
        options = ServeOptions(max_batch=batch, device=device, models=models, use_assistant=assisted)
        with serving(create_app(load_served(options, asr=asr))) as url:
            send_files(url, paths[:1], 1)  # warm-up, not timed
            for n in clients:
                wall, latencies, texts = send_files(url, paths, n)
                reference = reference or texts
                rows.append(ServeBenchRow(
                    "batched" if batch > 1 else "one-at-a-time", assisted, n, batch, len(paths), round(audio, 2),
                    round(wall, 3), round(len(paths) / wall, 3), round(audio / wall, 3),
                    round(percentile(latencies, 50), 3), round(percentile(latencies, 95), 3), texts == reference))
                log(format_row(rows[-1]))
    for line in gains(rows):
        log(line)
    write_report({"benchmark": "serve", "pair": asr[1].name, "files": [str(p) for p in paths],
                  "environment": environment(device), "rows": [asdict(r) for r in rows]}, json_path, log)
    return rows


def set_files(set_names: tuple[str, ...], limit: int) -> list[tuple[Path, float]]:
    """The first ``limit`` files of each set (built when missing): (path, audio seconds)."""
    from ..quality.sets import build_set, read_manifest

    files = []
    for name in set_names:
        build_set(name)
        files += [(Path(i["audio_path"]), float(i["duration"])) for i in read_manifest(name)[:limit]]
    return files


def format_row(r: ServeBenchRow) -> str:
    return (f"  {r.batching:<13} {'assisted' if r.assistant else 'plain':<8} clients {r.clients:>2}: "
            f"{r.requests_per_second:6.2f} req/s  {r.audio_per_wall:6.2f} audio s/s  p50 {r.p50_seconds:6.2f} s  "
            f"p95 {r.p95_seconds:6.2f} s  {'identical' if r.identical else 'DIFFERENT'}")


def gains(rows: list[ServeBenchRow]) -> list[str]:
    """Audio throughput of batching over one-at-a-time, and of the assistant over plain decoding, at each
    number of clients (ratios of ``audio_per_wall``)."""
    by = {(r.batching, r.assistant, r.clients): r.audio_per_wall for r in rows}
    lines = []
    for n in sorted({r.clients for r in rows}):
        for assisted in (False, True):
            if (one := by.get(("one-at-a-time", assisted, n))) and (many := by.get(("batched", assisted, n))):
                lines.append(f"  clients {n:>2}, {'assisted' if assisted else 'plain'}: batching x{many / one:.2f}")
        for batching in ("one-at-a-time", "batched"):
            if (plain := by.get((batching, False, n))) and (helped := by.get((batching, True, n))):
                lines.append(f"  clients {n:>2}, {batching}: the assistant x{helped / plain:.2f}")
    return lines


def parse_counts(text: str) -> tuple[int, ...]:
    """``1,4,16`` -> (1, 4, 16); ValueError unless whole numbers from 1, comma-separated."""
    counts = tuple(int(x) for x in text.split(",") if x.strip())
    if not counts or min(counts) < 1:
        raise ValueError(text)
    return counts


def cmd_bench_serve(args) -> int:
    """``tandem bench serve`` (its argparse namespace: pair, sets, limit, clients, max_batch, json)."""
    from .server import require_serve

    require_serve()
    sets = tuple(x.strip() for x in args.sets.split(",") if x.strip())
    bench_serve(args.pair, sets, args.limit, args.clients, args.max_batch, args.json, device=args.device,
                models=args.models)
    return 0
