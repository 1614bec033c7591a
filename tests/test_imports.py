"""The modules of pipelines/ import one another without a cycle.

The graph counts every import, those inside functions included (a
function-level import only postpones a cycle, it does not remove it); only
imports under ``if TYPE_CHECKING:`` are left out. Importing a package counts
as importing its ``__init__``, and ``from . import x`` as importing the
submodule x where there is one.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "pipelines"


def module_names(root=ROOT, package=PACKAGE):
    """Map each module's dotted name to its file."""
    names = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree):
    """Every Import/ImportFrom node, skipping ``if TYPE_CHECKING:`` bodies."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        todo.extend(ast.iter_child_nodes(node))


def _base(name, path, node):
    """The absolute module a ``from ... import`` names."""
    if not node.level:
        return node.module
    here = name.split(".")
    if path.name != "__init__.py":
        here.pop()
    here = here[:len(here) - (node.level - 1)]
    return ".".join(here + ([node.module] if node.module else []))


def _ancestors(name):
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _targets(name, path, node, names):
    """The modules an import statement runs, seen from module ``name``.

    Importing a.b.c runs a, a.b and a.b.c; packages above the importer are
    already being imported, so they count only when named themselves (taking
    a name from one's own package's ``__init__``).
    """
    if isinstance(node, ast.Import):
        explicit = {alias.name for alias in node.names}
    else:
        base = _base(name, path, node)
        submodules = {f"{base}.{alias.name}" for alias in node.names} & set(names)
        explicit = set(submodules)
        if len(submodules) < len(node.names) or base not in _ancestors(name):
            explicit.add(base)
    implicit = set().union(*map(_ancestors, explicit)) - _ancestors(name)
    return {target for target in explicit | implicit
            if target in names and target != name}


def import_graph(names=None):
    """Each module's set of the pipelines modules it imports."""
    names = module_names() if names is None else names
    return {name: set().union(*(_targets(name, path, node, names) for node in
                                _imports(ast.parse(path.read_text(), str(path)))))
            for name, path in names.items()}


def find_cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_graph_sees_the_package():
    graph = import_graph()
    assert "pipelines.engine.decoders" in graph
    assert "pipelines.cli" in graph
    assert any(graph.values())


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in pipelines/:\n" + "\n".join(
        " <-> ".join(component) for component in cycles)


def test_a_function_level_import_closes_a_cycle(tmp_path):
    pkg = tmp_path / "pipelines"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .c import run\n")
    (pkg / "sub" / "a.py").write_text("from .b import f\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pipelines.sub.c import C\n"
        "def f():\n    from . import a\n")
    (pkg / "sub" / "c.py").write_text("from . import b\nfrom pipelines.sub import helper\n")
    graph = import_graph(module_names(tmp_path))
    assert graph["pipelines.sub.b"] == {"pipelines.sub.a"}
    assert graph["pipelines.sub.c"] == {"pipelines.sub", "pipelines.sub.b"}
    assert sorted(find_cycles(graph)) == [["pipelines.sub", "pipelines.sub.c"],
                                          ["pipelines.sub.a", "pipelines.sub.b"]]
