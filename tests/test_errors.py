"""One base for the errors a user can fix (pipelines.errors.TandemError), printed once by the command.

The error classes are found by reading every module of pipelines/ (not a hand list), so a new one that forgets
the base fails here."""

import ast
import importlib
from pathlib import Path

import pytest

from pipelines.errors import EXIT_OUTPUT, EXIT_USAGE, TandemError

ROOT = Path(__file__).resolve().parent.parent
# private helpers that are exceptions but never reach a user (each caught where it is raised)
PRIVATE = {"pipelines.models.registry._KeyGivenTwice",
           "pipelines.serve.http.APIError"}  # an HTTP answer in OpenAI's error shape, made by the server itself


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _base_names(node: ast.ClassDef) -> list[str]:
    return [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]


def error_classes() -> list[tuple[str, str]]:
    """(module, class) for every class in pipelines/ named ...Error or built on an exception class."""
    found = []
    for path in sorted((ROOT / "pipelines").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (
                    node.name.endswith("Error")
                    or any(b.endswith(("Error", "Exception", "Unavailable")) for b in _base_names(node))):
                found.append((_module(path), node.name))
    return found


def test_the_walk_finds_the_known_errors():
    names = {name for _, name in error_classes()}
    assert {"RegistryError", "DeviceError", "BatchError", "VadUnavailable", "TandemError", "_KeyGivenTwice"} <= names


@pytest.mark.parametrize("module, name", [c for c in error_classes() if c != ("pipelines.errors", "TandemError")])
def test_every_error_subclasses_tandem_error(module, name):
    try:
        cls = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:  # a module of an optional extra (serve: fastapi) not installed here
        pytest.skip(f"{module} needs {exc.name}, not installed")
    assert issubclass(cls, BaseException), f"{module}.{name} is not an exception"
    if f"{module}.{name}" in PRIVATE or name.startswith("_"):  # a module's own signal, caught where raised
        return
    assert issubclass(cls, TandemError), f"{module}.{name} must subclass pipelines.errors.TandemError"
    assert isinstance(cls.exit_code, int) and cls.exit_code > 0


def test_errors_keep_their_builtin_base():
    """Callers that caught the built-in before the common base still catch them."""
    from pipelines.asr.vad import VadUnavailable
    from pipelines.devices import DeviceError
    from pipelines.models.loading import ModelUnavailableError
    from pipelines.models.registry import RegistryError

    assert issubclass(RegistryError, ValueError) and issubclass(DeviceError, ValueError)
    assert issubclass(ModelUnavailableError, RuntimeError) and issubclass(VadUnavailable, ImportError)
    assert RegistryError.exit_code == EXIT_USAGE


def test_the_command_prints_one_line_and_exits_with_the_errors_code(monkeypatch, capsys):
    """main catches TandemError once: ``tandem: <message>`` on stderr, nothing on stdout, the error's status."""
    import pipelines.quality.sets as sets
    from pipelines.cli import main

    class DiskFull(TandemError, OSError):
        exit_code = EXIT_OUTPUT

    def full(name):
        raise DiskFull(f"{name}: no space left on the device")

    monkeypatch.setattr(sets, "set_dir", full)
    assert main(["data", "list"]) == EXIT_OUTPUT
    captured = capsys.readouterr()
    first = next(iter(sets.SETS))
    assert captured.err == f"tandem: {first}: no space left on the device\n"
    assert captured.out == ""



def test_transcribe_raises_and_the_command_prints(capsys):
    """run_transcribe raises for a run that cannot start (a bad option value here); main prints one line, exit 2."""
    from pipelines.cli import main

    assert main(["transcribe", "no-such-file.wav", "--lookahead", "sideways"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("tandem: unknown lookahead policy 'sideways'") and err.count("\n") == 1, err
