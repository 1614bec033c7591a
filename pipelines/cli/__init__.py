"""The ``tandem`` command line: ``main`` parses (``parser.build_parser``), resolves the device once, runs the
command (``commands.cmd_*``) and turns the errors users can fix (``errors.TandemError``) into one line on
stderr and the error's exit status."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import EXIT_INTERRUPTED, TandemError
from .commands import serve, ui_command
from .parser import build_parser

__all__ = ["build_parser", "main", "serve", "ui_command"]


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


# Commands whose models may run on CUDA; the others run on the CPU ("auto" means the CPU for them): bench scale
# measures the batch job's throughput by CPU threads and Ray actors on one machine.
CUDA_COMMANDS = {"transcribe", "translate", "summarize", "eval", "regress", "demo", "ui", "serve", "distill",
                 ("bench", "asr"), ("bench", "shapes"), ("bench", "engine"), ("bench", "text")}


def _resolve_device(args: argparse.Namespace) -> str:
    """The command's device, resolved once (``devices.resolve_device``); DeviceError for one it cannot use."""
    from ..devices import ENV, DeviceError, resolve_device

    command = args.command if args.command != "bench" else ("bench", args.bench_command)
    requested = getattr(args, "device", None) or os.environ.get(ENV) or "auto"
    if command in CUDA_COMMANDS:
        return resolve_device(requested)
    if resolve_device(requested) != "cpu" and requested.strip().lower() != "auto":
        name = command if isinstance(command, str) else " ".join(command)
        raise DeviceError(f"tandem {name} runs on the CPU only so far: use --device cpu")
    return "cpu"


def _set_threads(n: int | None) -> None:
    import torch

    if n:
        torch.set_num_threads(n)


def _line_buffered() -> None:
    """Each printed line reaches a log file or pipe at once: Python block-buffers a redirected stdout, so a
    long run (``tandem distill ... > log``) would show its progress late and, stopped, lose its last lines."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(line_buffering=True)


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    _line_buffered()
    args = build_parser().parse_args(argv)
    _set_threads(args.threads)
    previous = os.environ.get("TANDEM_MODELS")
    try:
        args.device = _resolve_device(args)
        if args.models:  # every registry read of the command (benchmarks, Ray actors, the app) takes this file
            os.environ["TANDEM_MODELS"] = str(Path(args.models).resolve())
        return args.func(args)
    except TandemError as exc:  # the one place the library's errors are printed: one line, the kind's status
        print(f"tandem: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tandem: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:  # main() called in-process (tests, notebooks) leaves the environment as it found it
        if previous is None:
            os.environ.pop("TANDEM_MODELS", None)
        else:
            os.environ["TANDEM_MODELS"] = previous
