"""A spec's expressions tried once on its own param values, before anything is planned.

An expression can be in the grammar and still never evaluate: ``element + 1`` adds an int to
a string param, ``'a' * (1 << 30)`` makes a value past the language's bounds. Each one is
evaluated over sample combinations (per param, its first value of each type; every runtime
name 1) and is a fault at its line when it fails on every sample with an
:class:`ExpressionError`. One that fails only on some samples depends on the values: the
planner then gives each variant its verdict. Arithmetic errors (a zero divisor) always do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from b12x_aot.contract import Expr, ExpressionError

from ._spec_yaml import Faults

__all__ = ["check_expressions"]

_SAMPLES = 16  # combinations tried; a param of one type gives one


def _samples(params: tuple[tuple[str, tuple[Any, ...]], ...], arch: str) -> list[dict[str, Any]]:
    firsts = [list({v.__class__: v for v in reversed(values)}.values()) for _, values in params]
    names = [name for name, _ in params]
    combos = itertools.islice(itertools.product(*firsts), _SAMPLES)
    return [{"arch": arch, **dict(zip(names, combo, strict=True))} for combo in combos]


def _expressions(geometry: Any, constraints: tuple[Expr, ...]) -> Iterator[tuple[tuple[Any, ...], Expr]]:
    for i, c in enumerate(constraints):
        yield ("constraints", i), c
    for field in ("grid", "block", "cluster"):
        for i, e in enumerate(getattr(geometry, field) or ()):
            yield ("launch", field, i), e
    if geometry.smem is not None:
        yield ("launch", "smem"), geometry.smem
    for i, e in enumerate(geometry.requires):
        yield ("launch", "requires", i), e


def check_expressions(
    params: tuple[tuple[str, tuple[Any, ...]], ...],
    arch: str,
    runtime: tuple[str, ...],
    geometry: Any,
    constraints: tuple[Expr, ...],
    faults: Faults,
) -> None:
    """Add a fault for each expression (``let`` included) that no sample evaluates, and one
    when substituting the lets makes an expression past the language's length bound."""
    try:
        geometry.expanded()
    except ExpressionError as exc:
        faults.add(("launch", "let"), f"{exc.reason} (lets that read each other more than once grow fast)")
    envs = [{**env, **dict.fromkeys(runtime, 1)} for env in _samples(params, arch)]
    failed: dict[tuple[Any, ...], tuple[Expr, ExpressionError]] = {}
    passed: set[tuple[Any, ...]] = set()

    def attempt(where: tuple[Any, ...], expr: Expr, env: Mapping[str, Any]) -> Any:
        try:
            value = expr.evaluate(env)
        except ExpressionError as exc:
            failed.setdefault(where, (expr, exc))
            return 1
        except ArithmeticError:
            value = 1
        passed.add(where)
        return value

    for env in envs:
        for name, expr in geometry.let:  # in order: each reads the ones before it
            env[name] = attempt(("launch", "let", name), expr, env)
        for where, expr in _expressions(geometry, constraints):
            attempt(where, expr, env)
    names = {name for name, _ in params}
    for where, (expr, exc) in failed.items():
        if where not in passed:
            shown = ", ".join(f"{n}={envs[0][n]!r}" for n in sorted(expr.names & names))
            faults.add(where, f"does not evaluate: {exc.reason}" + (f" (with {shown})" if shown else ""))
