"""``tandem serve``: load the pairs once, then run the app under uvicorn until SIGINT or SIGTERM (uvicorn's
graceful shutdown: no new connections, requests in flight finished within the grace period, exit 0)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import TandemError
from .options import ServeOptions, ServeOptionsError

GRACE_SECONDS = 30.0


class ServeUnavailableError(TandemError, RuntimeError):
    """The ``serve`` extra is not installed."""


def require_serve() -> None:
    """ServeUnavailableError naming the extra when FastAPI, uvicorn, python-multipart or prometheus_client
    is missing."""
    import importlib.util

    missing = [m for m in ("fastapi", "uvicorn", "multipart", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise ServeUnavailableError(f"tandem serve needs {', '.join(missing)}: pip install -e '.[serve]'")


def load_served(options: ServeOptions, asr=None, chat=None):
    """The pairs ``options`` name, loaded (or the ``asr`` (runner, pair) and/or ``chat`` engine given, as
    tests do), with their scheduler and metrics: an ``app.Served``. ServeOptionsError for a pair of the wrong task."""
    require_serve()
    from ..asr import WhisperRunner
    from ..models.pairs import check_pair
    from ..models.registry import load_registry
    from .app import Served
    from .chat import ChatEngine, ChatInputError
    from .metrics import Metrics
    from .scheduler import Scheduler

    registry = load_registry(options.models)
    if asr is None and chat is None:
        pair = registry.get(options.asr_pair) if options.asr_pair else registry.default("asr")
        if wrong := pair.task_mismatch("asr"):
            raise ServeOptionsError(f"--model {pair.name!r} is {wrong}")
        text_pair = registry.get(options.text_pair) if options.text_pair else None
        if text_pair is not None and text_pair.task not in ("translate", "summarize"):
            raise ServeOptionsError(f"--text-model {text_pair.name!r} is not a text pair")
        check_pair(pair)
        asr = (WhisperRunner(pair, options.dtype, options.device), pair)
        if text_pair is not None:
            from ..text import TextRunner

            try:
                chat = ChatEngine(TextRunner(text_pair, options.dtype, device=options.device))
            except ChatInputError as exc:
                raise ServeOptionsError(f"--text-model: {exc}") from None
    holder = {}
    metrics = Metrics(lambda: holder["s"].queued, lambda: holder["s"].running)
    scheduler = Scheduler(asr, chat.complete if chat else None, options.max_batch, options.max_wait_ms,
                          on_batch=lambda kind, rows: metrics.batches.labels(kind).observe(rows))
    holder["s"] = scheduler
    return Served(options, scheduler, metrics, asr, chat)


def run_server(options: ServeOptions) -> int:
    """Load, then serve until stopped; the exit status."""
    require_serve()
    import uvicorn

    from .app import create_app

    served = load_served(options)
    app = create_app(served, GRACE_SECONDS)
    names = ", ".join(served.asr_names() + ((served.chat.name,) if served.chat else ()))
    print(f"Tandem OpenAI-compatible server on http://{options.host}:{options.port}/v1 ({names}; "
          f"batches of up to {options.max_batch}, on {options.device}; Ctrl-C stops it)", flush=True)
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level="info",
                            timeout_graceful_shutdown=int(GRACE_SECONDS))
    with sigterm_noted():
        uvicorn.Server(config).run()
    if not getattr(app.state, "drained", True):  # False: the worker outlived the grace period
        print(f"tandem serve: the worker was still decoding {GRACE_SECONDS:g} s after the app began to shut down",
              flush=True)
        return 1
    return 0


@contextmanager
def sigterm_noted() -> Iterator[None]:
    """A SIGTERM handler that does nothing, around ``uvicorn.Server.run``.

    uvicorn captures SIGINT and SIGTERM for its graceful shutdown, and afterwards restores the handlers it
    found and raises each captured signal again (``Server.capture_signals``), so that the program around it
    decides what the signal means once the server has stopped. With Python's default SIGTERM action that is
    death by the signal (exit 143) after a clean shutdown; this handler, the one uvicorn restores and
    re-raises into, takes it as done: the shutdown SIGTERM asked for has happened. SIGINT keeps Python's
    handler (KeyboardInterrupt: ``tandem: interrupted``, 130). Off the main thread (no signals there):
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
