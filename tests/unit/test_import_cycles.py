"""hvdtrain's modules import each other without a cycle: every import, read from the source (those
inside functions too, which only postpone a cycle, and those under ``if TYPE_CHECKING:``, which
never run but still tie the two modules' designs together; issue 42), makes an edge, and the
graph must have no loop. A cycle makes the order of imports matter and ties the layers together
(cli -> compare/command -> compare/simulate -> cli was one)."""

from __future__ import annotations

import ast
from pathlib import Path

import hvdtrain


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name (a package by its own)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join([package, *parts])] = path
    return names


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(nodes, type_only: bool = True):
    """Every import statement among ``nodes``, at any depth; those under ``if TYPE_CHECKING:``
    only with ``type_only``."""
    for node in nodes:
        if not type_only and _is_type_checking(node):
            yield from _imports(node.orelse, type_only)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        else:
            yield from _imports(ast.iter_child_nodes(node), type_only)


def imported_modules(name: str, path: Path, modules: dict[str, Path],
                     type_only: bool = True) -> set[str]:
    """The package's modules that module ``name`` (its source at ``path``) imports."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8")).body, type_only):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the module's own package, then level - 1 up
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            # `from package import module` imports the module; `from module import name` the module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                       for alias in node.names]
        for target in targets:
            while target and target not in modules:  # `import a.b.c`: the deepest module known
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path, package: str, type_only: bool = True) -> dict[str, set[str]]:
    modules = module_names(root, package)
    return {name: imported_modules(name, path, modules, type_only)
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle, as the modules along it with the first repeated at the end, or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: dict[str, int] = {}

    def visit(node: str) -> list[str] | None:
        on_path[node] = len(path)
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return path[on_path[nxt]:] + [nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        del on_path[node]
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_hvdtrain_has_no_import_cycle_among_the_imports_that_run():
    graph = import_graph(Path(hvdtrain.__file__).parent, "hvdtrain", type_only=False)
    assert "hvdtrain.train_flags" in graph["hvdtrain.cli"]  # the graph sees the imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_hvdtrain_has_no_import_cycle_type_only_imports_included():
    graph = import_graph(Path(hvdtrain.__file__).parent, "hvdtrain")
    running = import_graph(Path(hvdtrain.__file__).parent, "hvdtrain", type_only=False)
    assert any(graph[name] - running[name] for name in graph)  # it sees the type-only ones
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_and_named(tmp_path):
    """The finder itself: a cycle through a function-level relative import is named, and one
    under TYPE_CHECKING is an edge like any other (unless the graph leaves type-only imports
    out)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import thing\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from . import a\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}  # the type-only import
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    assert find_cycle(import_graph(pkg, "pkg", type_only=False)) is None
    (pkg / "c.py").write_text("import pkg.a\n")
    assert find_cycle(import_graph(pkg, "pkg")) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("")
    assert find_cycle(import_graph(pkg, "pkg")) is None
