"""Starting and waiting for a real Streamlit server in tests (the browser test and the SIGTERM test)."""

from __future__ import annotations

import socket
import time
import urllib.request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, tries: int = 120) -> bool:
    """Poll Streamlit's health endpoint at ``url`` every 0.5 s (``tries`` times); True once it answers ok."""
    for _ in range(tries):
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=1).read() == b"ok":
                return True
        except OSError:
            time.sleep(0.5)
    return False
