"""An OpenAI-compatible HTTP server over Tandem's engine (``tandem serve``; the ``serve`` extra).

``options`` (ServeOptions, checked before anything loads), ``scheduler`` (one worker thread owning the
models, batching queued requests), ``chat`` (chat completions on a decoder-only pair), ``formats`` (OpenAI's
response bodies), ``http`` (errors, auth, the upload cap), ``metrics`` (Prometheus), ``app`` (the FastAPI
app), ``server`` (load, then run under uvicorn). The server imports the engine and asr, never the reverse.
"""

from .options import ServeOptions, ServeOptionsError, is_loopback
from .server import ServeUnavailableError, load_served, require_serve, run_server

__all__ = ["ServeOptions", "ServeOptionsError", "ServeUnavailableError", "is_loopback", "load_served",
           "require_serve", "run_server"]
