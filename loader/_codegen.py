"""What the generated launch code of one variant is made of: names, values and closures.

Prepared launches generate their ``__call__`` and ``checked`` per variant ABI (as Triton's
binder does), so a call runs straight-line code. That source is assembled only from fixed
templates, the positional names ``a0``, ``a1``, ..., integer and boolean literals, the
expression grammar's own operators, and names bound in its environment: no text from a spec
ever reaches it. An expression over params and scalar arguments becomes inline Python of that
kind (``Expr.python``: params folded, scalar arguments by position), or, where it cannot, a
call of a closure that the whitelisted evaluator in ``_expr`` compiled, over the argument
tuple ``A``.
"""

from __future__ import annotations

from typing import Any

from ._expr import Expr, cdiv
from ._index import IndexEntry
from .errors import ExpressionError

__all__ = ["Codegen"]


class Codegen:
    """Source fragments for one variant's generated functions, and the environment they need."""

    __slots__ = ("env", "names", "params", "positions", "uses_args")

    def __init__(self, entry: IndexEntry, env: dict[str, Any]) -> None:
        self.params = entry.params
        self.positions = {a.name: i for i, a in enumerate(entry.args) if not a.is_pointer}
        self.names = [f"a{i}" for i in range(len(entry.args))]
        self.env = env
        self.uses_args = False  # whether a fragment reads the tuple ``A``

    @property
    def signature(self) -> str:
        """``a0, a1, ..., `` for a ``def`` line or a call."""
        return "".join(f"{n}, " for n in self.names)

    @property
    def args_line(self) -> str:
        """The line that binds ``A``, when some fragment reads it."""
        return f"    A = ({self.signature})\n" if self.uses_args else ""

    def value(self, expr: Expr) -> str:
        """Source that evaluates ``expr`` over this call's arguments."""
        source = expr.python(self.params, self.positions)
        if source is not None:
            self.env["_cdiv"] = cdiv
            return source
        folded = expr.compile(self.params, self.positions)
        if not callable(folded):  # Expr.python folds every int and bool: this one is neither
            raise ExpressionError(expr.source, f"must evaluate to an integer (got {folded!r})")
        name = f"_x{len(self.env)}"  # unique in the environment every generated function shares
        self.env[name] = folded
        self.uses_args = True
        return f"{name}(A)"

    def values(self, exprs: tuple[Expr, ...]) -> str:
        """A tuple display of ``exprs`` (``(d0,)`` for one)."""
        parts = [self.value(e) for e in exprs]
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
