"""The one base of the errors a user can fix, and the exit status each kind gives.

The library raises these and never prints them; the ``tandem`` command catches ``TandemError`` once
(``pipelines.cli.main``), prints ``tandem: <message>`` on one line to stderr and exits with ``exit_code``.
Every error class a user can meet subclasses ``TandemError`` (and, where callers already catch it, the
built-in it used to be: ``ValueError``, ``RuntimeError``, ``ImportError``, ``OSError``).
"""

from __future__ import annotations

# Exit statuses of the ``tandem`` command (as in sysexits' spirit, kept small): 0 done; 1 the run finished
# but something in it failed or regressed (a file in a batch, a regression); 2 the request was refused before
# or while running (bad options, input, registry, model, device); 3 a budget ran out (distill --budget-minutes);
# 4 the output side failed (no space left, a read-only or vanished folder): what finished is kept;
# 130 interrupted (Ctrl-C).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_BUDGET = 3
EXIT_OUTPUT = 4
EXIT_INTERRUPTED = 130


class TandemError(Exception):
    """An error the user can fix; its message is one line that says what and how.

    ``exit_code`` is the ``tandem`` command's exit status for it (``EXIT_USAGE`` unless a subclass says)."""

    exit_code: int = EXIT_USAGE
