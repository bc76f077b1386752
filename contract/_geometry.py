"""Launch geometry: grid, block, dynamic shared memory and cluster, as spec expressions.

A spec declares what it knows; the compiler reads the rest from the launch the kernel's host
function issues (``compiler._host_launch``) and records every variant's geometry whole, so the
loader always finds all of it. Block, shared memory and cluster may read only compile-time
params; the grid may also read the runtime values: scalar arguments and the symbols tensor
arguments bind. ``let`` names intermediate values (``tiles_n: "cdiv(n, tile_n)"``), in order,
each readable by the ones after it and by every other expression; they are substituted before
evaluation, so the loader's generated launch code sees plain expressions. ``requires`` are the
launch's preconditions (``num_tokens >= 0``): a checked launch refuses a call that breaks one.
A legacy registry kernel's host function evaluates the spec's grid itself (``kernels._base``),
over traced values.
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
    """The parts of the geometry that compile-time params fix. At planning, a part the spec
    leaves to the kernel's host function is None; a recorded variant has all of them."""

    block: tuple[int, int, int] | None
    smem: int | None
    cluster: tuple[int, int, int] | None  # None: no cluster, or clusters of one CTA (the same launch)

    @property
    def threads(self) -> int | None:
        return None if self.block is None else self.block[0] * self.block[1] * self.block[2]


def _sources(exprs: Sequence[Expr] | None) -> list[str] | None:
    return None if exprs is None else [e.source for e in exprs]


class Geometry(NamedTuple):
    """A spec's launch expressions (a NamedTuple for the loader's import budget, see _abi).
    ``grid``, ``block`` and ``smem`` are None where the spec leaves them to the kernel."""

    grid: Dim3 | None
    block: Dim3 | None
    smem: Expr | None
    cluster: Dim3 | None = None
    requires: tuple[Expr, ...] = ()
    let: tuple[tuple[str, Expr], ...] = ()

    @classmethod
    def parse(
        cls,
        grid: Sequence[str | int] | None,
        block: Sequence[str | int] | None,
        smem: str | int | None = 0,
        cluster: Sequence[str | int] | None = None,
        requires: Sequence[str] = (),
        let: Sequence[tuple[str, str | int]] = (),
    ) -> Geometry:
        return cls(
            grid=_dim3(grid, "grid") if grid is not None else None,
            block=_dim3(block, "block") if block is not None else None,
            smem=Expr.parse(smem) if smem is not None else None,
            cluster=_dim3(cluster, "cluster") if cluster is not None else None,
            requires=tuple(Expr.parse(r) for r in requires),
            let=tuple((name, Expr.parse(e)) for name, e in let),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Geometry:
        return cls.parse(
            data["grid"],
            data["block"],
            data.get("smem", 0),
            data.get("cluster"),
            data.get("requires", ()),
            [tuple(item) for item in data.get("let", ())],
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "grid": _sources(self.grid),
            "block": _sources(self.block),
            "smem": self.smem.source if self.smem is not None else None,
            "cluster": _sources(self.cluster) if self.cluster else None,
            "requires": [e.source for e in self.requires],
        }
        if self.let:  # left out when empty: the contract hashes of specs without lets stay
            out["let"] = [[name, e.source] for name, e in self.let]
        return out

    def expanded(self) -> Geometry:
        """The same geometry with every ``let`` substituted into the expressions that read it."""
        if not self.let:
            return self
        bound: dict[str, Expr] = {}
        for name, expr in self.let:
            bound[name] = expr.substitute(bound)

        def sub(exprs: Sequence[Expr] | None) -> Any:
            return None if exprs is None else tuple(e.substitute(bound) for e in exprs)

        return Geometry(
            sub(self.grid),
            sub(self.block),
            self.smem.substitute(bound) if self.smem is not None else None,
            sub(self.cluster),
            sub(self.requires),
        )

    def static_names(self) -> frozenset[str]:
        """Names that block, smem and cluster read: these must all be compile-time params."""
        geometry = self.expanded()
        exprs = [
            *(geometry.block or ()),
            *([geometry.smem] if geometry.smem else []),
            *(geometry.cluster or ()),
        ]
        return frozenset().union(*(e.names for e in exprs))

    def bind_static(self, params: Mapping[str, Any]) -> StaticGeometry:
        """Evaluate block, smem and cluster; each must come out a non-negative int. A cluster of
        one CTA is no cluster: such variants launch the plain way."""
        geometry = self.expanded()

        def as_int(expr: Expr, what: str) -> int:
            value = expr.evaluate(params)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ExpressionError(expr.source, f"{what} must evaluate to an int >= 0 (got {value!r})")
            return value

        block = tuple(as_int(e, "block") for e in geometry.block) if geometry.block else None
        cluster = tuple(as_int(e, "cluster") for e in geometry.cluster) if geometry.cluster else None
        if cluster == (1, 1, 1):
            cluster = None
        smem = as_int(geometry.smem, "smem") if geometry.smem is not None else None
        return StaticGeometry(block, smem, cluster)  # type: ignore[arg-type]

    def grid_of(
        self, env: Mapping[str, Any], functions: Mapping[str, Callable[..., Any]] | None = None
    ) -> tuple[Any, Any, Any]:
        """Evaluate the grid over params and runtime values (ints or traced DSL values)."""
        grid = self.expanded().grid
        if grid is None:
            raise ExpressionError("grid", "the spec leaves the grid to the kernel's host function")
        return tuple(e.evaluate(env, functions) for e in grid)  # type: ignore[return-value]
