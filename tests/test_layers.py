"""The packages depend on each other in one direction, and no module imports in a circle.

``contract`` (stdlib only) <- ``loader`` (+ cuda.bindings) <- ``registry`` and ``comm`` <-
``kernels`` (comm's layout) <- ``compiler``. A library module may import only the packages below
it, and only their public API (never ``b12x_aot.<other>._private``); the CLIs may use every
package's public API. Every package may import ``contract``.
Read from the source with ``ast``, so the rule is kept without importing anything. Within a
package, an import deferred into a function counts toward a circle too.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT

# package -> the packages its library modules may import
ALLOWED: dict[str, frozenset[str]] = {
    "loader": frozenset(),
    "registry": frozenset({"loader"}),
    "comm": frozenset({"loader"}),
    "kernels": frozenset({"loader", "comm"}),
    "compiler": frozenset({"loader", "registry", "kernels"}),
    "contract": frozenset(),  # imports nothing of b12x_aot; every package may import it
    "ops": frozenset({"loader", "comm"}),  # the torch ops; nothing imports them
}
ENTRY_POINTS = ("cli.py", "__main__.py", "launch.py")


def _modules() -> Iterator[tuple[str, Path]]:
    for package in ALLOWED:
        for path in sorted((ROOT / package).rglob("*.py")):  # subpackages too
            yield package, path


def _name(path: Path) -> str:
    """The import name of a library module (a package's ``__init__`` keeps that name)."""
    return ".".join(("b12x_aot", *path.relative_to(ROOT).with_suffix("").parts))


def _imports(path: Path, package: str, *, top_level_only: bool = False) -> Iterator[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``path`` (relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = _top_level(tree) if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            here = _name(path).split(".")[:-1] if node.level else []  # the module's package
            base = ".".join(here[: len(here) - node.level + 1])
            module = ".".join(p for p in (base, node.module or "") if p)
            yield node.lineno, module
            for alias in node.names:  # "from . import _manifest" names a module
                yield node.lineno, f"{module}.{alias.name}"


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Statements that run at import, including ``if TYPE_CHECKING:`` blocks (a circle there
    still ties two modules together), but not imports deferred into functions."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If | ast.Try):
            pending.extend(node.body + node.orelse + getattr(node, "finalbody", []))


def test_no_upward_or_private_cross_package_imports() -> None:
    problems: dict[str, None] = {}  # ordered and without repeats
    for package, path in _modules():
        entry_point = path.name in ENTRY_POINTS
        for line, module in _imports(path, package):
            parts = module.split(".")
            if parts[0] != "b12x_aot" or len(parts) < 2 or parts[1] == package:
                continue
            other = parts[1]
            where = f"{path.relative_to(ROOT)}:{line}"
            if not entry_point and other not in ALLOWED[package] | {"contract"}:
                problems[f"{where}: {package} must not import {other}"] = None
            if len(parts) > 2 and parts[2].startswith("_"):
                problems[f"{where}: imports b12x_aot.{other}.{parts[2]}, a private module of {other}"] = None
    assert not problems, "\n".join(problems)


def test_the_rule_catches_what_it_should(tmp_path: Path) -> None:
    """The checker above finds an upward and a private import (so a pass means something)."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from b12x_aot.compiler import load_specs\n"
        "def f():\n    from b12x_aot.registry._schema import Variant\n"
    )
    found = [m for _, m in _imports(bad, "loader")]
    assert "b12x_aot.compiler" in found and "b12x_aot.registry._schema" in found


def _graph(*, top_level_only: bool = True) -> dict[str, set[str]]:
    names = {_name(path): (package, path) for package, path in _modules()}
    graph: dict[str, set[str]] = {}
    for name, (package, path) in names.items():
        deps = set()
        for _, module in _imports(path, package, top_level_only=top_level_only):
            init = f"{module.removesuffix('.__init__')}.__init__"  # a package: its __init__
            if module in names and module != name:
                deps.add(module)
            elif init in names and init != name and init.startswith(f"b12x_aot.{package}."):
                deps.add(init)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle a depth-first walk of ``graph`` closes, each as ``a -> b -> ... -> a``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*path[path.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_module_imports_in_a_circle() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _cycles_within_packages() -> list[list[str]]:
    """Circles among one package's modules, counting the imports deferred into functions too."""
    graph = _graph(top_level_only=False)
    within = {
        name: {dep for dep in deps if dep.split(".")[1] == name.split(".")[1]} for name, deps in graph.items()
    }
    return _cycles(within)


def test_no_package_imports_in_a_circle_even_inside_functions() -> None:
    """A module that imports a module importing it, if only inside a function, still ties the two:
    neither can be read, moved or tested without the other (an interface importing its own
    implementations to pick one, say). Give the shared piece its own module instead."""
    cycles = _cycles_within_packages()
    assert not cycles, "modules of one package that import each other:\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_the_circle_check_sees_imports_inside_functions(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The check above finds a circle that one import deferred into a function closes (so a pass
    means something), which the import-time check cannot see."""
    package = tmp_path / "compiler"
    package.mkdir()
    (package / "_base.py").write_text("def pick():\n    from ._impl import Impl\n    return Impl\n")
    (package / "_impl.py").write_text("from ._base import pick\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)  # what _modules() and _name() read
    circle = ["b12x_aot.compiler._base", "b12x_aot.compiler._impl", "b12x_aot.compiler._base"]
    assert _cycles_within_packages() == [circle]
    assert _cycles(_graph()) == []


def _outside_stdlib(module: str) -> bool:
    """Neither a stdlib module nor one of the contract's own."""
    own = f"{module}.".startswith("b12x_aot.contract.")
    return not own and module.split(".")[0] not in sys.stdlib_module_names


def test_contract_imports_only_the_stdlib() -> None:
    assert not _outside_stdlib("json") and not _outside_stdlib("b12x_aot.contract._keys")
    # the check flags what it should, so a pass means something
    assert _outside_stdlib("cuda.bindings") and _outside_stdlib("b12x_aot.loader")
    problems = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for package, path in _modules()
        if package == "contract"
        for line, module in _imports(path, package)
        if _outside_stdlib(module)
    ]
    assert not problems, "\n".join(problems)
