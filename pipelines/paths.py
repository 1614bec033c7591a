"""Where Tandem keeps what it builds (one cache root, configurable by ``TANDEM_CACHE``), the lock a build
holds, and how a file is written in one piece (``write_atomic``)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The repository root (this file lives in <root>/pipelines/). Used to find models.yaml and data/.
PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """The cache root: ``$TANDEM_CACHE``, else ``$XDG_CACHE_HOME/tandem``, else ``~/.cache/tandem``."""
    explicit = os.environ.get("TANDEM_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tandem"


def models_dir() -> Path:
    """Converted embedded models live here, one folder each."""
    return cache_root() / "models"


def data_dir() -> Path:
    """Built evaluation sets live here, one folder each with a ``manifest.jsonl``."""
    return cache_root() / "data"


def downloads_dir() -> Path:
    """Registry artefacts fetched by the data builders (source tarballs, npm packages, apt lists)."""
    return cache_root() / "downloads"


def display(path: str | os.PathLike) -> str:
    """A path as printable UTF-8 text: bytes a file name may hold that are not UTF-8 are shown as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


@contextmanager
def build_lock(final: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (``fcntl.flock`` on ``.<name>.lock`` beside ``final``) while building
    ``final``: two processes that need the same model or set at once (Ray actors, parallel test workers, two
    commands) build it once; the second waits and then finds it built. Where ``fcntl`` is missing
    (Windows) nothing is locked and builds stay atomic, only possibly done twice."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(final.parent / f".{final.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _file_mode() -> int:
    """0666 less the process's umask: what a plain ``open(..., "w")`` would give."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it into place (readers see the old or the new
    file, never half of one); the file takes the user's umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
            os.fchmod(f.fileno(), FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
