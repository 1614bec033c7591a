"""``docs/cli.md``, generated from the parser: every command, its options, their aliases and defaults.

``python -m pipelines.cli.docs > docs/cli.md`` writes it; ``tests/test_docs_cli.py`` fails when the file
differs from what the parser gives, so the reference cannot drift from ``--help``. The rendering reads the
parser's actions (not argparse's help text, whose layout changes between Python versions).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from .parser import build_parser

HEADER = """# `tandem` command reference

Generated from the parser by `python -m pipelines.cli.docs > docs/cli.md` (a test checks that it is
current). Every command also takes `--device auto|cpu|cuda|cuda:N` after its name. `tandem CMD --help`
says the same as this page. Aliases are older or other spellings of the same option; they keep working.
"""


def iter_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("tandem",),
                  help_text: str = "") -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every (command path, one-line help, parser) under ``parser``, depth first in the parser's order."""
    yield path, help_text, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, child in action.choices.items():
                yield from iter_commands(child, path + (name,), helps.get(name, ""))


def _cell(text: str) -> str:
    # argparse's help strings escape % as %%; the table shows the text as --help prints it
    return text.replace("%%", "%").replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    if action.default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
        return ""
    value = action.default
    if isinstance(value, (tuple, list)):
        value = ",".join(str(v) for v in value) if value else ""
    return f"`{value}`" if value != "" else ""


def _spelling(action: argparse.Action) -> str:
    metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices else None)
    if action.nargs == 0:
        return ", ".join(f"`{o}`" for o in action.option_strings)
    metavar = metavar or action.dest.upper()
    return ", ".join(f"`{o} {metavar}`" for o in action.option_strings)


def render_command(path: tuple[str, ...], help_text: str, parser: argparse.ArgumentParser) -> list[str]:
    """One command's section: heading, its help, its positional arguments and options as a table."""
    lines = [f"## `{' '.join(path)}`", ""]
    if help_text or parser.description:
        lines += [_cell(help_text or parser.description), ""]
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        if action.dest == "device" and len(path) > 1:  # every command's --device: said once, in the header
            continue
        if isinstance(action, argparse._SubParsersAction):
            names = ", ".join(f"`{n}`" for n in action.choices)
            rows.append((f"`{action.metavar or 'COMMAND'}`", "", f"one of {names}"))
        elif not action.option_strings:
            rows.append((f"`{action.metavar or action.dest}`", "", action.help or ""))
        else:
            aliases = [f"`{o}`" for a in parser._actions if a is not action and a.dest == action.dest
                       and a.help == argparse.SUPPRESS for o in a.option_strings]
            spelled = _spelling(action) + (f" (alias {', '.join(aliases)})" if aliases else "")
            rows.append((spelled, _default(action), action.help or ""))
    if rows:
        lines += ["| argument | default | meaning |", "|---|---|---|"]
        lines += [f"| {_cell(a)} | {_cell(d)} | {_cell(h)} |" for a, d, h in rows]
        lines.append("")
    return lines


def render_cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole reference as Markdown (``docs/cli.md``'s text)."""
    parser = parser or build_parser()
    lines = [HEADER]
    for path, help_text, command in iter_commands(parser):
        lines += render_command(path, help_text, command)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render_cli_reference(), end="")
