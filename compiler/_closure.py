"""Source-closure hashes: a kernel module plus the project modules it imports, transitively.

Found by reading import statements with :mod:`ast` and locating files on disk, never by
importing, so planning loads no CuTe DSL. Only modules of this project (``b12x_aot.*``) belong
to a closure; the DSL and the stdlib are covered by the toolchain fingerprint instead. The
closure follows explicit imports only: a package ``__init__`` that re-exports names is not in
it unless a module imports from the package itself. So kernel modules import what they need
from its defining module. A module that cannot be found or read is an error, since leaving it
out would make the hash lie.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .errors import ClosureError

__all__ = ["PROJECT_PACKAGE", "SourceClosure", "source_closure"]

PROJECT_PACKAGE = "b12x_aot"


@dataclass(frozen=True, slots=True)
class SourceClosure:
    """``files`` are ``(module name, sha256 of its source)``, sorted by module name."""

    files: tuple[tuple[str, str], ...]

    @property
    def hash(self) -> str:
        h = hashlib.sha256()
        for module, digest in self.files:
            h.update(f"{module}\0{digest}\n".encode())
        return h.hexdigest()


def _origin(module: str) -> Path | None:
    """The source file of a project module, found on disk without importing it."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != PROJECT_PACKAGE:
        return None
    try:
        # Imports only the b12x_aot namespace; the subpackage's __init__ does not run.
        spec = importlib.util.find_spec(".".join(parts[:2]))
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)))
    for part in parts[2:]:
        path = path / part
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(module: str, path: Path, tree: ast.AST) -> set[str]:
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
            found.add(target)
            # "from pkg import name" may name a submodule.
            found.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    return {m for m in found if m == PROJECT_PACKAGE or m.startswith(PROJECT_PACKAGE + ".")}


def source_closure(module: str) -> SourceClosure:
    """Hash ``module`` and every project module it imports. Raises :class:`ClosureError`."""
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
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise ClosureError(
                f"cannot read {path} (module {name}) for its source hash: {exc.strerror}"
            ) from None
        try:
            tree = ast.parse(source, filename=str(path))
        except SyntaxError as exc:
            raise ClosureError(f"{path}:{exc.lineno}: syntax error in module {name}: {exc.msg}") from None
        seen[name] = hashlib.sha256(source).hexdigest()
        pending.extend(_imports(name, path, tree))
    return SourceClosure(tuple(sorted(seen.items())))
