"""The batch job's decoding on a Ray actor pool (Ray Data): files in, one Transcript per file out.

The job's pending files (``pipelines.asr.batch.plan_batch``) become a Dataset of one row per file (its path as
bytes: any name the OS allows survives Arrow). ``Dataset.map_batches`` runs ``TranscribeActor`` in an
``ActorPoolStrategy`` pool: each actor loads the pair once (on a GPU when Ray gave it one) and decodes the
files of each batch with ``asr.transcribe``, as the in-process run does. The driver iterates the results as
they arrive and ``pipelines.asr.batch.run_batch`` writes them there: outputs, records, failures.tsv, the
folder's lock and resume are the in-process run's, and the output folder needs to exist on the driver only
(the inputs must be readable at the same path on every node).

A worker that dies (its actor killed, its process or node lost) costs its in-flight batch only: Ray restarts
the actor (``max_restarts``) and runs the batch again (``max_task_retries``). A batch still failing after
that is skipped (the Dataset's ``max_errored_blocks``), its files listed as failed, and the run goes on.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from ..asr import TranscribeOptions, Transcript, transcribe
from ..models.registry import Pair
from . import RayOptions, require_ray

LOST = "its Ray worker died on every try ({tries} tries); run again to retry it"


class TranscribeActor:
    """One decoding actor: the pair loaded once; called on a batch of paths (a pyarrow Table with a binary
    ``path`` column), returns a Table with one pickled Transcript per file (binary ``transcript``)."""

    def __init__(self, pair: Pair, options: TranscribeOptions, threads: int) -> None:
        import ray
        import torch

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        torch.set_num_threads(threads)
        from ..asr import WhisperRunner

        self.pair, self.options = pair, options
        device = "cuda" if ray.get_gpu_ids() else "cpu"
        with torch.device(device):  # transformers places the weights on the context's device
            self.runner = WhisperRunner(pair, options.dtype, options.device)

    def __call__(self, batch):
        import pyarrow as pa

        paths = [os.fsdecode(p) for p in batch.column("path").to_pylist()]
        results = transcribe(paths, self.pair, self.options, runner=self.runner)
        return pa.table({"transcript": pa.array([pickle.dumps(t) for t in results], pa.binary())})


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """ConnectionError within ``timeout`` seconds when nothing listens at a cluster address "host:port" or
    "ray://host:port" (``ray.init`` itself keeps retrying such an address for many minutes)."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConnectionError(f"{address!r} is not auto, local or a cluster address host:port")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host}:{port} ({exc.strerror or exc}); "
                              "is `ray start --head` running there?") from None


def connect(address: str) -> bool:
    """Join (or start) the Ray cluster ``address`` names (see RayOptions) unless this process already
    has; True when this call started Ray (the caller then ends it with ``ray.shutdown``). ConnectionError
    when an explicit address does not answer."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    if address not in ("auto", "local"):
        check_reachable(address)
    kwargs = {"include_dashboard": False} if address == "local" else {}
    ray.init(address=None if address == "auto" else address, logging_level=logging.WARNING,
             configure_logging=True, **kwargs)
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its execution notes; the batch job reports
    return True


def pool_size(options: RayOptions, tasks: int, resources: dict[str, float]) -> tuple[int, float]:
    """How many actors, and GPUs per actor: ``options.actors`` (else one per GPU, else one per
    ``threads_per_actor`` CPUs of ``resources``, Ray's cluster resources), at most ``tasks``."""
    gpus = options.num_gpus if options.num_gpus is not None else (1.0 if resources.get("GPU", 0) >= 1 else 0.0)
    if options.actors:
        actors = options.actors
    elif gpus:
        actors = int(resources.get("GPU", 0) // gpus)
    else:
        actors = int(resources.get("CPU", 1) // options.threads_per_actor)
    return max(1, min(actors, tasks)), gpus


def file_dataset(paths: tuple[Path, ...]):
    """A Dataset of one row (``path``: the name's bytes) and one block per file."""
    ray = require_ray()
    return ray.data.from_items([{"path": os.fsencode(p)} for p in paths], override_num_blocks=len(paths))


def transcribe_on_ray(todo: tuple[Path, ...], pair: Pair, transcribe_options: TranscribeOptions,
                      options: RayOptions) -> Iterator[Transcript]:
    """Decode the files ``todo`` (a planned job's pending ones) with ``pair`` on a Ray actor pool; one Transcript
    per file, in the order they finish. Lazy: Ray is joined (or started: its start-up counts in the run's wall
    time) on the first ``next``, and a Ray started here is shut down when the iterator ends or is closed. Raises
    what Ray raises when it cannot go on at all (an address nobody answers: ConnectionError; no actor could load
    the pair): files not yet written are then simply not recorded, and a second run does them."""
    ray = require_ray()
    started = connect(options.address)
    try:
        yield from _collect(_pool_dataset(ray, todo, pair, transcribe_options, options), todo,
                            options.max_task_retries + 1)
    finally:
        if started:
            ray.shutdown()


def _pool_dataset(ray, todo: tuple[Path, ...], pair: Pair, transcribe_options: TranscribeOptions, options: RayOptions):
    """The files as a Dataset mapped through an actor pool of TranscribeActor (rows: pickled Transcripts)."""
    per_task = options.files_per_task or transcribe_options.batch_size
    actors, gpus = pool_size(options, math.ceil(len(todo) / per_task), ray.cluster_resources())
    with warnings.catch_warnings():  # Ray 2.60 names no parameter for max_restarts: the remote args are the way
        warnings.simplefilter("ignore", DeprecationWarning)
        ds = file_dataset(todo).map_batches(
            TranscribeActor, fn_constructor_kwargs={"pair": pair, "options": transcribe_options,
                                                    "threads": options.threads_per_actor},
            batch_size=per_task, batch_format="pyarrow", zero_copy_batch=True,
            compute=ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
            num_cpus=options.threads_per_actor, num_gpus=gpus,
            max_restarts=options.max_restarts, max_task_retries=options.max_task_retries)
    ds.context.max_errored_blocks = -1  # a batch that fails on every try is listed as failed, the others go on
    ds.context.enable_progress_bars = False  # the batch job shows its own
    return ds


def _collect(ds, todo: tuple[Path, ...], tries: int) -> Iterator[Transcript]:
    """The Dataset's Transcripts as they arrive (each file once), then a failed one for each file whose
    batch never came back."""
    seen: set[str] = set()
    start = time.perf_counter()
    for row in ds.iter_rows():
        result = pickle.loads(row["transcript"])
        if result.path not in seen:
            seen.add(result.path)
            yield result
    for path in todo:
        if str(path) not in seen:
            yield Transcript(str(path), "", 0.0, time.perf_counter() - start, error=LOST.format(tries=tries))
