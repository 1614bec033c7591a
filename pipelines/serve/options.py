"""What ``tandem serve`` is asked to do, checked once before any model loads (``ServeOptions``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..errors import TandemError


class ServeOptionsError(TandemError, ValueError):
    """The server cannot start with these options (one sentence saying which and why)."""


def is_loopback(host: str) -> bool:
    """True for a host that only this machine can reach: localhost, 127.0.0.0/8, ::1."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    asr_pair: str | None = None  # the registry's pair for /v1/audio/*; None: the registry's asr default
    text_pair: str | None = None  # a chat (decoder-only) text pair for /v1/chat/completions; None: none served
    max_batch: int = 8  # files (their windows) decoded together
    max_wait_ms: float = 10.0  # how long the worker waits for more requests to fill a batch it could start
    api_key: str | None = None  # Bearer token every /v1 request must send; required off loopback
    max_upload_mb: float = 25.0  # OpenAI's own cap on audio uploads
    use_assistant: bool = True  # False: plain decoding with the pair's main model (tandem bench serve's baseline)
    device: str = "cpu"
    dtype: str | None = None
    models: str | None = None  # the registry file (None: the project's models.yaml or $TANDEM_MODELS)

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ServeOptionsError(f"--port must be from 1 to 65535, not {self.port}")
        if self.max_batch < 1:
            raise ServeOptionsError(f"--max-batch must be at least 1, not {self.max_batch}")
        if not 0 <= self.max_wait_ms <= 60_000:
            raise ServeOptionsError(f"--max-wait-ms must be from 0 to 60000, not {self.max_wait_ms}")
        if not 0 < self.max_upload_mb <= 4096:
            raise ServeOptionsError(f"--max-upload-mb must be above 0 and at most 4096, not {self.max_upload_mb}")
        if self.api_key is not None and not self.api_key.strip():
            raise ServeOptionsError("--api-key must not be empty")
        if not is_loopback(self.host) and not self.api_key:
            raise ServeOptionsError(f"--host {self.host} can be reached from other machines: give --api-key KEY "
                                    "(clients send it as a Bearer token), or bind 127.0.0.1")

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)
