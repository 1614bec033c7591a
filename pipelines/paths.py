"""Where Tandem keeps what it builds (one cache root, configurable by ``TANDEM_CACHE``), the lock a build
holds, and how a file is written in one piece (``write_atomic``); an output that cannot be written (a full
disk, a quota, a read-only or vanished folder) is an ``OutputWriteError`` naming the path and the reason."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import EXIT_OUTPUT, TandemError

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


# what the user reads for an output-side failure, by errno (others: the OS's own words)
OUTPUT_REASONS = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "read-only file system", errno.ENOENT: "folder removed while writing",
                  errno.ENOTDIR: "folder replaced while writing", errno.EACCES: "permission denied",
                  errno.EPERM: "permission denied", errno.EIO: "input/output error", errno.EFBIG: "file too large"}


class OutputWriteError(TandemError, OSError):
    """An output could not be written: ``reason`` (a few words) on ``path``, and what to do (``advice``, which
    a command may widen with what was kept: "9 of 12 files finished and kept; free space and run the same
    command to resume"). An OSError too, so code that catches those still does; exit status ``EXIT_OUTPUT``."""

    exit_code = EXIT_OUTPUT

    def __init__(self, path: str | os.PathLike, reason: str, advice: str = "", code: int | None = None) -> None:
        self.path, self.reason, self.advice = Path(path), reason, advice
        super().__init__(code or 0, reason)
        self.errno, self.strerror, self.filename = code, reason, os.fspath(path)

    def __str__(self) -> str:
        return f"{self.reason} on {display(self.path)}" + (f": {self.advice}" if self.advice else "")

    def advise(self, advice: str, path: str | os.PathLike | None = None) -> OutputWriteError:
        """The same failure with ``advice`` (and, given, ``path``: the folder a command wrote to)."""
        return OutputWriteError(self.path if path is None else path, self.reason, advice, self.errno)


def advice_for(reason: str) -> str:
    """What a user does about ``reason`` before running the same command again."""
    return {"no space left": "free space", "disk quota exceeded": "free space in the quota",
            "read-only file system": "make it writable", "permission denied": "make it writable",
            }.get(reason, "check the folder")


def as_output_error(exc: OSError, path: str | os.PathLike) -> OutputWriteError:
    """``exc`` (raised writing ``path``) as an OutputWriteError: the reason in words, the path it hit."""
    if isinstance(exc, OutputWriteError):
        return exc
    reason = OUTPUT_REASONS.get(exc.errno) or (exc.strerror or str(exc)).lower()
    return OutputWriteError(exc.filename or path, reason, f"{advice_for(reason)} and run the same command again",
                            exc.errno)


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Code under it writes ``path`` (a file or a folder): an OSError becomes an OutputWriteError naming it."""
    try:
        yield
    except OSError as exc:
        raise as_output_error(exc, path) from exc


# errors that only writing gives (no read fails so): under ``output_guard`` any of them is the output's
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
SQLITE_DISK = {"database or disk is full": "no space left", "attempt to write a readonly database":
               "read-only file system", "disk I/O error": "input/output error"}


@contextmanager
def output_guard(folder: str | os.PathLike, advice: str | None = None) -> Iterator[None]:
    """A command's writes into ``folder`` (history, report, shards, checkpoints): a full disk, a quota or a
    read-only file system met anywhere under it (an OSError of those kinds, SQLite's "database or disk is
    full", torch.save's "file write failed" on a full disk) becomes an OutputWriteError naming the path and
    the reason, with ``advice`` (default: free space and run the same command again)."""
    import sqlite3

    def fail(path, reason: str, code: int | None = None) -> OutputWriteError:
        return OutputWriteError(path, reason, advice or f"{advice_for(reason)} and run the same command again", code)

    try:
        yield
    except OutputWriteError as exc:
        raise (exc.advise(advice) if advice else exc) from None
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        raise fail(exc.filename or folder, OUTPUT_REASONS[exc.errno], exc.errno) from exc
    except sqlite3.OperationalError as exc:
        reason = next((words for text, words in SQLITE_DISK.items() if text in str(exc)), None)
        if reason is None:
            raise
        raise fail(folder, "no space left" if _full(folder) else reason) from exc
    except RuntimeError as exc:  # torch.save's writer: "file write failed", "unexpected pos 640 vs 534"
        if not any(words in str(exc) for words in ("write failed", "inline_container", "PytorchStreamWriter")):
            raise
        raise fail(folder, "no space left" if _full(folder) else f"write failed ({exc})") from exc


def _full(folder: str | os.PathLike) -> bool:
    """Whether ``folder``'s file system (its nearest existing parent's) has less than a page left for an
    unprivileged writer: what a library that does not say ENOSPC (SQLite, torch.save) met."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 4096


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write to a temporary file beside ``path`` and rename it into place (readers see the old or the new
    file, never half of one); the file takes the user's umask. OutputWriteError when it cannot be written
    (nothing of it is left: no temporary file, the old file as it was)."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8") if isinstance(text, str) else text)
                os.fchmod(f.fileno(), FILE_MODE)
            os.replace(tmp, path)
        except BaseException:
            try:
                Path(tmp).unlink(missing_ok=True)
            except OSError:  # a folder gone read-only or away: nothing more to clean
                pass
            raise
