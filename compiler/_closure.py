"""Source-closure hashes: a kernel module plus the project modules it imports, transitively.

Found by reading import statements with :mod:`ast` and locating files on disk, never by
importing, so planning loads no CuTe DSL. A closure holds modules of this project
(``b12x_aot.*``) and of the kernel module's own top-level package (kernels may live in a
package of their own); the DSL and the stdlib are covered by the toolchain fingerprint
instead. The closure follows explicit imports. ``from package import name``, where the
package's ``__init__`` only re-exports ``name`` from one of its own modules
(``from ._geometry import Geometry``), follows the re-export to that module and leaves the
``__init__`` out: a kernel that imports ``cdiv`` from ``b12x_aot.contract`` depends on the
module that defines it, not on every module the contract exports. A name the ``__init__``
defines itself keeps the ``__init__`` (and so its own imports) in the closure. A module that
cannot be found or read is an error, since leaving it out would make the hash lie.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from pathlib import Path

from b12x_aot.registry import SourceClosure

from .errors import ClosureError

__all__ = ["PROJECT_PACKAGE", "source_closure"]

PROJECT_PACKAGE = "b12x_aot"


def _origin(module: str) -> Path | None:
    """The source file of a module, found on disk without running any of its packages."""
    parts = module.split(".")
    # b12x_aot is a namespace mapped per subpackage; other packages are found at the top.
    depth = 2 if parts[0] == PROJECT_PACKAGE else 1
    if len(parts) < depth:
        return None
    try:
        spec = importlib.util.find_spec(".".join(parts[:depth]))
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not spec.submodule_search_locations:  # a plain top-level module
        return (
            Path(spec.origin)
            if len(parts) == depth and spec.origin not in (None, "built-in", "frozen")
            else None
        )
    path = Path(next(iter(spec.submodule_search_locations)))
    for part in parts[depth:]:
        path = path / part
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _read(module: str, path: Path) -> tuple[bytes, ast.AST]:
    """A module's source and its syntax tree; unreadable or broken source is an error."""
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ClosureError(
            f"cannot read {path} (module {module}) for its source hash: {exc.strerror}"
        ) from None
    try:
        return source, ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise ClosureError(f"{path}:{exc.lineno}: syntax error in module {module}: {exc.msg}") from None


def _reexports(package: str) -> dict[str, str] | None:
    """Names a package's ``__init__`` imports from its own modules (name -> module), or None
    when the module is not a package."""
    path = _origin(package)
    if path is None or path.name != "__init__.py":
        return None
    out: dict[str, str] = {}
    for node in _read(package, path)[1].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{package}.{node.module}"
    return out


def _imports(module: str, path: Path, tree: ast.AST, roots: frozenset[str]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.split(".")[0] not in roots:
                continue
            names = [alias.name for alias in node.names]
            exports = _reexports(target) if target != module else None
            if exports is not None and "*" not in names and all(n in exports for n in names):
                found.update(exports[n] for n in names)  # the defining modules, not the __init__
                # ... or the re-exported name is itself a module (`from .utils import swizzle`)
                found.update(f"{exports[n]}.{n}" for n in names)
                continue
            found.add(target)
            # "from pkg import name" may name a submodule.
            found.update(f"{target}.{n}" for n in names if n != "*")
    return {m for m in found if m.split(".")[0] in roots}


def source_closure(module: str) -> SourceClosure:
    """Hash ``module`` and every project module it imports. Raises :class:`ClosureError`."""
    roots = frozenset({PROJECT_PACKAGE, module.split(".")[0]})
    seen: dict[str, str] = {}
    pending = [module]
    while pending:
        name = pending.pop()
        if name in seen or name == PROJECT_PACKAGE:
            continue
        path = _origin(name)
        if path is None:
            if name == module:
                raise ClosureError(
                    f"kernel module {name!r} cannot be found; check the spec's 'kernel' entry "
                    "and that the project is installed (pip install -e .)"
                )
            continue  # "from pkg import attr" where attr is not a module
        source, tree = _read(name, path)
        seen[name] = hashlib.sha256(source).hexdigest()
        pending.extend(_imports(name, path, tree, roots))
    return SourceClosure(tuple(sorted(seen.items())))
