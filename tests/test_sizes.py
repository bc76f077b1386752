"""Library modules stay small enough to read: none over 500 lines, no function over 100.

Every module of the library packages and their subpackages is read with ``ast``, so nothing is
imported. A function's length runs from its ``def`` line to its last line (docstring included,
decorators not); a nested function counts on its own and inside its parent. A failure names
each module or function over its limit, with its size: split it by what its parts do.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from .conftest import ROOT
from .test_layers import ALLOWED

PACKAGES = tuple(ALLOWED)  # every library package the layer rules know
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100


def _functions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function under ``node``, with its qualified name (``Class.method``, ``outer.inner``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                yield name, child
            yield from _functions(child, f"{name}.")
        else:
            yield from _functions(child, prefix)


def oversized(path: Path) -> list[str]:
    """What in ``path`` is over its limit, one line each: the module, then its functions."""
    source = path.read_text()
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{shown}: {lines} lines (at most {MAX_MODULE_LINES})")
    for name, fn in _functions(ast.parse(source, filename=str(path))):
        length = fn.end_lineno - fn.lineno + 1
        if length > MAX_FUNCTION_LINES:
            found.append(f"{shown}:{fn.lineno}: {name} is {length} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_no_library_module_or_function_is_over_its_limit() -> None:
    modules = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert any(path.parent.name == "w4a16" for path in modules)  # subpackages are walked
    problems = [problem for path in modules for problem in oversized(path)]
    assert not problems, "split these:\n" + "\n".join(problems)


def test_the_check_names_a_long_module_and_a_long_method(tmp_path: Path) -> None:
    body = "\n".join(f"        x = {i}" for i in range(99))
    fits = tmp_path / "fits.py"
    fits.write_text(f"class K:\n    def fine(self):\n{body}\n")  # 100 lines: at the limit
    assert oversized(fits) == []
    long = tmp_path / "long.py"
    long.write_text(f"class K:\n    def run(self):\n{body}\n        x = 99\n" + "\n" * 400)
    assert oversized(long) == [
        f"{long}: 502 lines (at most 500)",
        f"{long}:2: K.run is 101 lines (at most 100)",
    ]
