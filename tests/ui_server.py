"""Starting and waiting for a real Streamlit server in tests (the browser test and the SIGTERM test).

Tests wait for outcomes, not for a number of seconds: they poll until the thing happens, within PATIENCE_S, a
bound far above any normal run, so that a busy machine (a shared CI runner, a second suite beside this one)
is slower but never fails."""

from __future__ import annotations

import socket
import time
import urllib.request


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PATIENCE_S = 600.0  # the overall bound of every wait for an outcome in these tests


def wait_until(done, patience: float = PATIENCE_S, every: float = 0.25) -> bool:
    """Poll ``done()`` every ``every`` seconds until it is true (True) or ``patience`` seconds pass (False)."""
    deadline = time.monotonic() + patience
    while True:
        if done():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(every)


def wait_healthy(url: str, proc=None, patience: float = PATIENCE_S) -> bool:
    """Poll Streamlit's health endpoint at ``url`` until it answers ok (True), the server process ``proc`` has
    exited, or ``patience`` seconds pass (False)."""

    def healthy() -> bool:
        if proc is not None and proc.poll() is not None:
            raise _Exited
        try:
            return urllib.request.urlopen(f"{url}/_stcore/health", timeout=5).read() == b"ok"
        except OSError:
            return False

    try:
        return wait_until(healthy, patience, every=0.5)
    except _Exited:
        return False


class _Exited(Exception):
    """The server process ended before it answered."""
