"""Expanding specs into variants, and the planner checks that run before any compile.

Every combination of a spec's params, for every arch, is one variant. A combination that a
spec constraint (over the params and ``arch``) makes false is pruned: counted per arch and
constraint, never materialized, as a matrix of millions of combinations may hold a few
hundred variants. The constraints are tested as the params are bound, in spec order, so a
false one drops every combination under it at once (each count names the first constraint
found false that way). A variant is rejected before compiling, with its reason, when its
block has a thread count the arch does not allow, or when its dynamic shared memory exceeds
the arch's opt-in limit (what the spec leaves to the kernel is checked once it is compiled).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from b12x_aot.contract import Arg, Expr, ExpressionError, StaticGeometry, VariantId, cdiv, tdiv, tmod

from ._arch import ARCHS
from ._spec import ARCH_NAME, Spec
from .errors import SpecError, SpecFault

__all__ = ["Expansion", "Pruned", "Rejection", "Variant", "expand", "parse_where"]


@dataclass(frozen=True, slots=True)
class Variant:
    """One (spec, arch, params) combination: its identity, resolved launch ABI and, for a
    variant the planner accepts, its static geometry (evaluated once, here)."""

    spec: Spec
    id: VariantId
    args: tuple[Arg, ...]
    static: StaticGeometry | None = None

    @property
    def key(self) -> str:
        return self.id.key

    @property
    def label(self) -> str:
        return self.id.label


@dataclass(frozen=True, slots=True)
class Rejection:
    variant: Variant
    stage: str  # geometry, threads, smem
    reason: str


@dataclass(frozen=True, slots=True)
class Pruned:
    """The combinations of one spec and arch that one constraint (its verdict: ``reason``) pruned."""

    family: str
    abi: int
    arch: str
    reason: str
    count: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Expansion:
    accepted: list[Variant]
    rejected: list[Rejection]
    pruned: list[Pruned]  # per arch, most combinations first
    tested: int = 0  # constraint evaluations the walk made: bounded by the combinations it reached


def parse_where(items: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` into a dict; raises ``ValueError`` naming a malformed item."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--where takes param=value (got {item!r})")
        if name.strip() in out:
            raise ValueError(
                f"--where {name.strip()} is given twice ({out[name.strip()]} and {value.strip()}); "
                "give one value per param (run the command once per value)"
            )
        out[name.strip()] = value.strip()
    return out


def _filter(spec: Spec, where: Mapping[str, str]) -> list[tuple[str, tuple[Any, ...]]]:
    """The spec's param matrix narrowed by ``where`` (values compared as text)."""
    params: list[tuple[str, tuple[Any, ...]]] = []
    for name, values in spec.params:
        if name in where:
            chosen = tuple(v for v in values if str(v) == where[name])
            if not chosen:
                raise SpecError(
                    spec.path,
                    [
                        SpecFault(
                            0,
                            f"params.{name}",
                            f"--where {name}={where[name]} is not in this spec's matrix "
                            f"{list(values)}; add it there to build it",
                        )
                    ],
                )
            values = chosen
        params.append((name, values))
    return params


# Past these a plan is refused: no build compiles a million variants of one spec, and a matrix
# that needs a hundred million combinations tested wants constraints on its first params.
MAX_VARIANTS = 1_000_000
MAX_TESTED = 100_000_000


class _Constraints:
    """A spec's constraints, each tested once the params it reads are bound, on the list
    ``values`` (``[arch, first param, second, ...]``) of what the walk has bound so far.

    Each is compiled once: to inline Python over ``values`` where ``Expr.python`` can write it
    (integer params), else to the evaluator's closure. No verdict is kept per combination, so
    memory does not grow with the matrix; ``tested`` counts the evaluations."""

    def __init__(self, spec: Spec, names: Sequence[str]) -> None:
        # depth d: the constraints whose names the first d params (and arch) bind; a spec's
        # constraints read only its params and arch (load_spec refuses other names).
        position = {name: i + 1 for i, name in enumerate(names)}
        position[ARCH_NAME] = 0
        self.names = [ARCH_NAME, *names]
        strings = frozenset(
            [ARCH_NAME, *(n for n, values in spec.params if any(isinstance(v, str) for v in values))]
        )
        self.at_depth: list[list[tuple[Expr, Callable[[Sequence[Any]], Any], str]]] = [
            [] for _ in range(len(names) + 1)
        ]
        for c in spec.constraints:
            depth = max((position[n] for n in c.names), default=0)
            test = _compiled(c, position, strings)
            self.at_depth[depth].append((c, test, f"constraint {c.source!r} is false"))
        self.tested = 0

    def why_not(self, depth: int, values: Sequence[Any]) -> str | None:
        """Why the bound ``values`` fail the constraints that depth ``depth`` binds (the first
        in spec order), or None."""
        for constraint, test, false in self.at_depth[depth]:
            self.tested += 1
            try:
                if not test(values):
                    return false
            except (ExpressionError, ArithmeticError, TypeError):  # the evaluator says why
                verdict = self._verdict(constraint, dict(zip(self.names, values, strict=False)))
                if verdict is not None:
                    return verdict
        return None

    @staticmethod
    def _verdict(constraint: Expr, params: Mapping[str, Any]) -> str | None:
        try:
            if not constraint.evaluate(params):
                return f"constraint {constraint.source!r} is false"
        except (ExpressionError, ArithmeticError) as exc:
            why = exc.reason if isinstance(exc, ExpressionError) else exc  # it names the expression
            return f"constraint {constraint.source!r} does not evaluate: {why}"
        return None


def _compiled(
    constraint: Expr, position: Mapping[str, int], strings: frozenset[str]
) -> Callable[[Sequence[Any]], Any]:
    """``constraint`` as a function of the bound values: inline Python where it can be
    written (only literals, ``A[i]`` and the grammar's operators), else a closure."""
    source = constraint.python({}, {name: f"A[{i}]" for name, i in position.items()}, strings)
    if source is not None:
        scope = {"__builtins__": {}, "bool": bool, "min": min, "max": max}
        scope.update(_cdiv=cdiv, _tdiv=tdiv, _tmod=tmod)
        return eval(compile(f"lambda A: {source}", "<constraint>", "eval"), scope)
    folded = constraint.compile({}, position)
    return folded if callable(folded) else (lambda _values, v=folded: v)


def _check(arch: str, static: StaticGeometry) -> tuple[str, str] | None:
    """``(stage, reason)`` when the arch cannot launch this block or shared memory."""
    limits = ARCHS[arch]
    threads = static.threads
    if threads is not None and (threads < 32 or threads > limits.max_threads or threads % 32):
        return "threads", (
            f"block {static.block} has {threads} threads; {arch} allows a multiple of 32 "
            f"from 32 to {limits.max_threads}"
        )
    if static.smem is not None and static.smem > limits.max_smem_optin:
        return "smem", (
            f"dynamic shared memory {static.smem} B exceeds the {arch} opt-in limit of "
            f"{limits.max_smem_optin} B"
        )
    return None


def _judge(
    spec: Spec, arch: str, params: Mapping[str, Any]
) -> tuple[StaticGeometry | None, tuple[str, str] | None]:
    """The static geometry of ``params`` and, when the planner rejects it, ``(stage, reason)``."""
    try:
        static = spec.geometry.bind_static(params)
    except (ExpressionError, ZeroDivisionError) as exc:
        return None, ("geometry", f"launch geometry does not evaluate: {exc}")
    return static, _check(arch, static)


def _combinations(
    spec: Spec,
    matrix: Sequence[tuple[str, tuple[Any, ...]]],
    constraints: _Constraints,
    arch: str,
    pruned: Counter,
) -> Iterator[dict[str, Any]]:
    """The combinations of ``matrix`` that every constraint holds for on ``arch``, in
    ``itertools.product`` order; each pruned subtree's size is added to ``pruned[reason]``.
    Raises :class:`SpecError` past :data:`MAX_TESTED` evaluations."""
    names = [n for n, _ in matrix]
    below = [math.prod(len(v) for _, v in matrix[d:]) for d in range(len(matrix) + 1)]
    values: list[Any] = [arch] + [None] * len(names)
    last = len(names)

    def walk(depth: int) -> Iterator[dict[str, Any]]:
        reason = constraints.why_not(depth, values)
        if reason is not None:
            pruned[reason] += below[depth]
            return
        if depth == last:
            yield dict(zip(names, values[1:], strict=True))
            return
        if constraints.tested > MAX_TESTED:
            raise _too_many(spec, "tested", MAX_TESTED, below[0])
        if depth + 1 == last:  # the last param: a loop, not a generator per combination
            for value in matrix[depth][1]:
                values[last] = value
                reason = constraints.why_not(last, values)
                if reason is None:
                    yield dict(zip(names, values[1:], strict=True))
                else:
                    pruned[reason] += 1
            return
        for value in matrix[depth][1]:
            values[depth + 1] = value
            yield from walk(depth + 1)

    yield from walk(0)


def _too_many(spec: Spec, what: str, limit: int, combinations: int) -> SpecError:
    return SpecError(
        spec.path,
        [
            SpecFault(
                0,
                "params",
                f"planning {spec.family} {what} more than {limit:,} combinations of its "
                f"{combinations:,}: add constraints that read the first params, or narrow it with --where",
            )
        ],
    )


def expand(
    spec: Spec, *, archs: Sequence[str] | None = None, where: Mapping[str, str] | None = None
) -> Expansion:
    """All variants of ``spec`` (optionally narrowed): accepted, rejected by the planner
    checks, and the combinations its constraints pruned."""
    where = dict(where or {})
    unknown = set(where) - set(spec.param_names)
    if unknown:
        raise SpecError(
            spec.path,
            [
                SpecFault(
                    0,
                    "params",
                    f"--where names {sorted(unknown)}, not params of {spec.family} "
                    f"({', '.join(spec.param_names)})",
                )
            ],
        )
    matrix = _filter(spec, where)
    constraints = _Constraints(spec, [n for n, _ in matrix])
    out = Expansion([], [], [])
    templated = sorted({a.template_param for a in spec.args if a.template_param is not None})
    resolved: dict[tuple[Any, ...], tuple[Arg, ...]] = {}  # args by their dtype params' values
    # block, smem and cluster by the values of the params they read (and the arch judging them)
    static_names = sorted(spec.geometry.static_names())
    judged: dict[tuple[Any, ...], tuple[StaticGeometry | None, tuple[str, str] | None]] = {}
    for arch in spec.archs if archs is None else [a for a in spec.archs if a in archs]:
        pruned: Counter[str] = Counter()
        for params in _combinations(spec, matrix, constraints, arch, pruned):
            if len(out.accepted) + len(out.rejected) >= MAX_VARIANTS:
                raise _too_many(spec, "kept", MAX_VARIANTS, math.prod(len(v) for _, v in matrix))
            vid = VariantId.of(family=spec.family, abi=spec.abi, arch=arch, params=params)
            dtypes = tuple(params.get(name) for name in templated)
            if dtypes not in resolved:
                resolved[dtypes] = tuple(a.resolve(params) for a in spec.args)
            shape = (arch, *(params[name] for name in static_names))
            if shape not in judged:
                judged[shape] = _judge(spec, arch, params)
            static, problem = judged[shape]
            if problem is not None:
                out.rejected.append(Rejection(Variant(spec, vid, resolved[dtypes]), *problem))
            else:
                out.accepted.append(Variant(spec, vid, resolved[dtypes], static))
        out.pruned.extend(
            Pruned(spec.family, spec.abi, arch, reason, count) for reason, count in pruned.most_common()
        )
    return replace(out, tested=constraints.tested)
