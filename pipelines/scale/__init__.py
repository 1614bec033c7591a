"""Scale-out of the batch job (``pipelines.asr.batch``) on Ray: an optional extra, ``pip install -e '.[scale]'``.

Nothing here imports Ray at import time: ``require_ray`` does, and says which extra to install when it is
missing. ``RayOptions`` says where and how wide to run; ``pipelines.scale.ray_batch.transcribe_on_ray`` is
the decoding source that ``pipelines.asr.batch.run_batch`` writes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TandemError

__all__ = ["RayOptions", "RayUnavailableError", "require_ray"]


class RayUnavailableError(TandemError, ImportError):
    """Ray (Ray Data) is not installed in this environment."""


def require_ray():
    """The ``ray`` module with Ray Data importable; RayUnavailableError (one sentence naming the extra) if not."""
    try:
        import ray
        import ray.data  # noqa: F401  (ray[data]: pyarrow, pandas)
    except ImportError as exc:
        raise RayUnavailableError(f"--ray needs Ray Data, which is not installed ({exc.name or exc}): "
                                  "pip install -e '.[scale]'") from None
    return ray


@dataclass(frozen=True)
class RayOptions:
    """Where and how wide a Ray run decodes.

    address: "auto" (the cluster this machine belongs to, or $RAY_ADDRESS; else a new local one), "local"
    (always a new local one, ended with the run) or a cluster's address ("host:6379", "ray://host:10001").
    actors: decoding actors, each loading the pair once; None: one per GPU (``num_gpus`` each) when the
    cluster has GPUs, else one per ``threads_per_actor`` CPUs; never more than there are tasks.
    threads_per_actor: torch threads in each actor, and the CPUs Ray reserves for it.
    files_per_task: files handed to an actor at a time (None: the run's batch_size), the most a dying actor
    costs; each is retried on the restarted actor up to ``max_task_retries`` times after it restarted
    (up to ``max_restarts`` times), then listed as failed.
    num_gpus: GPUs per actor; None: 1 when the cluster has GPUs, else 0.
    """

    address: str = "auto"
    actors: int | None = None
    threads_per_actor: int = 1
    files_per_task: int | None = None
    num_gpus: float | None = None
    max_restarts: int = 3
    max_task_retries: int = 3

    def __post_init__(self) -> None:
        for name in ("actors", "files_per_task"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be 1 or more, not {value}")
        if self.threads_per_actor < 1:
            raise ValueError(f"threads_per_actor must be 1 or more, not {self.threads_per_actor}")
        if self.num_gpus is not None and self.num_gpus < 0:
            raise ValueError(f"num_gpus must be 0 or more, not {self.num_gpus}")
        if self.max_restarts < 0 or self.max_task_retries < 0:
            raise ValueError("max_restarts and max_task_retries must be 0 or more")
        if not self.address:
            raise ValueError("the Ray address must be auto, local or a cluster's address")

    def describe(self) -> str:
        """One line for the run's header, e.g. ``auto, 2 actors x 1 thread``."""
        actors = f"{self.actors} actors" if self.actors else "actors to fit the cluster"
        return f"{self.address}, {actors} x {self.threads_per_actor} thread{'s' if self.threads_per_actor > 1 else ''}"
