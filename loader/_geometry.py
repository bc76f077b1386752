"""Launch geometry: grid, block, dynamic shared memory and cluster, as spec expressions.

Declared once in the spec, evaluated in two places: by the kernel's DSL host function at
compile time (over traced runtime scalars) and by the loader at every launch (over ints).
Block, shared memory and cluster may read only compile-time params; the grid may also read
the runtime scalar arguments. ``requires`` are the launch's preconditions over params and
scalars (``num_tokens >= 0``): a checked launch refuses a call that breaks one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ._expr import Expr
from .errors import ExpressionError

__all__ = ["Geometry", "StaticGeometry"]

Dim3 = tuple[Expr, Expr, Expr]


def _dim3(values: Sequence[str | int], what: str) -> Dim3:
    if len(values) != 3:
        raise ExpressionError(str(list(values)), f"{what} must have exactly 3 entries")
    return tuple(Expr.parse(v) for v in values)  # type: ignore[return-value]


class StaticGeometry(NamedTuple):
    """The parts of the geometry that compile-time params fix."""

    block: tuple[int, int, int]
    smem: int
    cluster: tuple[int, int, int] | None  # None: no cluster, or clusters of one CTA (the same launch)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


class Geometry(NamedTuple):
    """A spec's launch expressions (a NamedTuple for the loader's import budget, see _abi)."""

    grid: Dim3
    block: Dim3
    smem: Expr
    cluster: Dim3 | None = None
    requires: tuple[Expr, ...] = ()

    @classmethod
    def parse(
        cls,
        grid: Sequence[str | int],
        block: Sequence[str | int],
        smem: str | int = 0,
        cluster: Sequence[str | int] | None = None,
        requires: Sequence[str] = (),
    ) -> Geometry:
        return cls(
            grid=_dim3(grid, "grid"),
            block=_dim3(block, "block"),
            smem=Expr.parse(smem),
            cluster=_dim3(cluster, "cluster") if cluster is not None else None,
            requires=tuple(Expr.parse(r) for r in requires),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Geometry:
        return cls.parse(
            data["grid"], data["block"], data.get("smem", 0), data.get("cluster"), data.get("requires", ())
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "grid": [e.source for e in self.grid],
            "block": [e.source for e in self.block],
            "smem": self.smem.source,
            "cluster": [e.source for e in self.cluster] if self.cluster else None,
            "requires": [e.source for e in self.requires],
        }

    def static_names(self) -> frozenset[str]:
        """Names that block, smem and cluster read: these must all be compile-time params."""
        exprs = [*self.block, self.smem, *(self.cluster or ())]
        return frozenset().union(*(e.names for e in exprs))

    def bind_static(self, params: Mapping[str, Any]) -> StaticGeometry:
        """Evaluate block, smem and cluster; each must come out a non-negative int. A cluster of
        one CTA is no cluster: such variants launch the plain way."""

        def as_int(expr: Expr, what: str) -> int:
            value = expr.evaluate(params)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ExpressionError(expr.source, f"{what} must evaluate to an int >= 0 (got {value!r})")
            return value

        block = tuple(as_int(e, "block") for e in self.block)
        cluster = tuple(as_int(e, "cluster") for e in self.cluster) if self.cluster else None
        if cluster == (1, 1, 1):
            cluster = None
        return StaticGeometry(block, as_int(self.smem, "smem"), cluster)  # type: ignore[arg-type]

    def grid_of(
        self, env: Mapping[str, Any], functions: Mapping[str, Callable[..., Any]] | None = None
    ) -> tuple[Any, Any, Any]:
        """Evaluate the grid over params and runtime scalars (ints or traced DSL values)."""
        return tuple(e.evaluate(env, functions) for e in self.grid)  # type: ignore[return-value]
