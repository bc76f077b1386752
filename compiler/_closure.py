"""Source-closure hashes: a kernel module plus the project modules it imports, transitively.

Found by reading import statements with :mod:`ast` and locating files on disk, never by
importing, so planning loads no CuTe DSL. A closure holds modules of this project
(``b12x_aot.*``) and of the kernel module's own top-level package (kernels may live in a
package of their own); the DSL and the stdlib are covered by the toolchain fingerprint
instead. The closure follows explicit imports only: a package ``__init__`` that re-exports
names is not in it unless a module imports from the package itself, so kernel modules import
what they need from its defining module. A module that cannot be found or read is an error,
since leaving it out would make the hash lie.
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
            found.add(target)
            # "from pkg import name" may name a submodule.
            found.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
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
        pending.extend(_imports(name, path, tree, roots))
    return SourceClosure(tuple(sorted(seen.items())))
