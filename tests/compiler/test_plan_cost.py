"""Planning work is bounded by its structure: constraints are evaluated once per combination
the walk reaches at their depth, nothing is kept per combination, and a matrix past the
bounds is refused with its count (timings: benchmarks/bench_plan.py)."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import pytest

from b12x_aot.compiler import _variants
from b12x_aot.compiler._spec import load_spec
from b12x_aot.compiler._variants import expand
from b12x_aot.compiler.errors import SpecError

from ..conftest import write_spec


def matrix_spec(tmp_path: Path, params: int, values: int, constraints: list[str]) -> Path:
    rows = "".join(f"  p{i}: [{', '.join(map(str, range(values)))}]\n" for i in range(params))
    listed = ", ".join(f'"{c}"' for c in constraints)
    text = (
        "family: bench.plan\nabi: 1\nkernel: b12x_aot.kernels.topk_sum:TopKSum\narchs: [sm_90a]\n"
        f"params:\n{rows}constraints: [{listed}]\n"
        "args:\n  - {name: out, kind: ptr, dtype: fp32, align: 4, intent: out, shape: [n]}\n"
        "  - {name: n, kind: i32}\n"
        'launch: {grid: ["n", 1, 1], block: [128, 1, 1], smem: 0}\n'
    )
    return write_spec(tmp_path, "matrix.yaml", text)


def test_a_constraint_on_the_first_params_is_evaluated_per_prefix(tmp_path: Path) -> None:
    """10^7 combinations: the constraint reading p0..p2 is evaluated 1,000 times, the one
    reading the rest only under the one prefix the first keeps."""
    spec = load_spec(
        matrix_spec(tmp_path, 7, 10, ["p0 == 1 and p1 == 2 and p2 == 3", "p3 + p4 + p5 + p6 == 0"])
    )
    out = expand(spec)
    assert [v.id.params for v in out.accepted] == [
        {"p0": 1, "p1": 2, "p2": 3, **dict.fromkeys(("p3", "p4", "p5", "p6"), 0)}
    ]
    assert sum(p.count for p in out.pruned) == 10**7 - 1
    assert out.tested == 10**3 + 10**4


def test_a_constraint_on_the_first_param_stops_the_walk_early(tmp_path: Path) -> None:
    spec = load_spec(matrix_spec(tmp_path, 7, 10, ["p0 == 9", "p1 < 0"]))
    out = expand(spec)
    assert not out.accepted and out.tested == 10 + 10  # p0's ten values, then p1 under p0=9
    assert {p.reason: p.count for p in out.pruned} == {
        "constraint 'p0 == 9' is false": 9 * 10**6,
        "constraint 'p1 < 0' is false": 10**6,
    }


def test_a_constraint_reading_every_param_keeps_nothing_per_combination(tmp_path: Path) -> None:
    """One evaluation per combination and no verdict kept for any: memory stays flat."""
    spec = load_spec(matrix_spec(tmp_path, 5, 10, ["p0 + p1 + p2 + p3 + p4 == 45"]))
    tracemalloc.start()
    try:
        out = expand(spec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(out.accepted) == 1 and out.tested == 10**5
    assert peak < 2 * 1024 * 1024  # a verdict per combination alone held ~10 MB here


@pytest.mark.parametrize(
    ("constraint", "inline"), [("p0 + p1 > 3", True), ("sizeof(dtype(e)) * p0 > 3", False)]
)
def test_constraints_decide_alike_inline_or_through_the_evaluator(
    tmp_path: Path, constraint: str, inline: bool
) -> None:
    text = matrix_spec(tmp_path, 2, 4, [constraint]).read_text().replace("  p1:", "  e: [bf16, fp32]\n  p1:")
    spec = load_spec(write_spec(tmp_path, "m.yaml", text))
    kept = {tuple(sorted(v.id.params.items())) for v in expand(spec).accepted}
    env = [dict(p0=a, e=e, p1=b) for a in range(4) for e in ("bf16", "fp32") for b in range(4)]
    want = {tuple(sorted(p.items())) for p in env if spec.constraints[0].evaluate(p)}
    assert kept == want
    strings = frozenset({"arch", "e"})
    source = spec.constraints[0].python({}, {n: n for n in ("arch", "p0", "e", "p1")}, strings)
    assert (source is not None) == inline


def test_string_literals_are_inlined_only_as_compared(tmp_path: Path) -> None:
    from b12x_aot.contract import Expr

    sources = {"e": "A[1]", "p": "A[2]"}
    strings = frozenset({"e"})
    assert Expr.parse("e in ('bf16', 'fp16') and p > 1").python({}, sources, strings) == (
        "bool((A[1] in ('bf16', 'fp16')) and (A[2] > 1))"
    )
    assert Expr.parse("e + e == 'xx'").python({}, sources, strings) is None  # computes with a string
    assert Expr.parse("e == 'bf16'").python({}, sources) is None  # the loader's code: no strings


def test_a_matrix_past_the_tested_bound_is_refused_with_its_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_variants, "MAX_TESTED", 1000)
    spec = load_spec(matrix_spec(tmp_path, 5, 10, ["p0 + p1 + p2 + p3 + p4 == 45"]))
    with pytest.raises(SpecError) as err:
        expand(spec)
    assert "planning bench.plan tested more than 1,000 combinations of its 100,000" in str(err.value)
    assert "--where" in str(err.value)


def test_a_plan_past_the_variant_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_variants, "MAX_VARIANTS", 100)
    spec = load_spec(matrix_spec(tmp_path, 3, 10, []))
    with pytest.raises(SpecError, match="kept more than 100 combinations of its 1,000"):
        expand(spec)
    assert math.prod(len(v) for _, v in spec.params) == 1000
