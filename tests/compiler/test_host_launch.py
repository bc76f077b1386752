"""Reading a host function's launch: LLVM type layouts, terms and their expressions, and a
registry kernel whose grid tests runtime values."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from b12x_aot.compiler import _terms as t
from b12x_aot.compiler._llvm_layout import type_layout
from b12x_aot.compiler.errors import ContractError
from b12x_aot.contract import Arg, Expr, ParamLayout, default_params, tdiv, tmod

from ..conftest import TOPK_SMALL, run_compile, write_spec


def test_type_layouts_are_c_structs() -> None:
    tensor = type_layout("!llvm.struct<(ptr<1>, struct<(struct<(i32, i32)>, i64)>)>")
    assert (tensor.size, tensor.align) == (24, 8)
    assert [(lf.path, lf.offset, lf.kind, lf.bits) for lf in tensor.leaves] == [
        ((0,), 0, "ptr", 64),
        ((1, 0, 0), 8, "int", 32),
        ((1, 0, 1), 12, "int", 32),
        ((1, 1), 16, "int", 64),
    ]
    assert type_layout("!llvm.struct<(ptr<1>, struct<(i32, struct<()>)>)>").size == 16
    assert type_layout("!llvm.struct<(struct<()>, struct<(struct<(i32, i32)>, struct<()>)>)>").size == 8
    assert type_layout("i1").size == 1 and type_layout("!llvm.ptr<1>").size == 8
    descriptor = type_layout("!llvm.struct<(struct<(array<16 x i64>)>)>")  # a TMA tensor map
    assert (descriptor.size, len(descriptor.leaves)) == (128, 16)
    assert [(lf.path, lf.offset) for lf in descriptor.leaves[:2]] == [((0, 0, 0), 0), ((0, 0, 1), 8)]
    mixed = type_layout("!llvm.struct<(i8, array<3 x struct<(i32, i8)>>)>")
    assert (mixed.size, [lf.offset for lf in mixed.leaves]) == (28, [0, 4, 8, 12, 16, 20, 24])
    with pytest.raises(ContractError, match="cannot read the LLVM type"):
        type_layout("!llvm.array<4 x i32")
    with pytest.raises(ContractError, match="cannot read the LLVM type"):
        type_layout("!llvm.struct<packed (i8, i32)>")


def test_default_tensor_params_match_the_dsl_layout() -> None:
    a = Arg("a", "tensor", "fp32", 16, "in", ("m", "n"), ("lda", "1"), (0, 1), (0,))
    (param,) = default_params([a], {})
    assert (param.size, param.align) == (24, 8)
    assert [(w.offset, w.code, w.expr) for w in param.words] == [
        (0, "Q", "a"),
        (8, "i", "m"),
        (12, "i", "n"),
        (16, "q", "lda"),
    ]
    static = Arg("s", "tensor", "fp16", 2, "in", ("128",), ("1",))
    assert default_params([static], {})[0].size == 8  # only the pointer
    assert ParamLayout.of(default_params([a, static], {})).offsets == (0, 24)


def test_the_dsl_ceiling_division_becomes_cdiv() -> None:
    x, k = t.leaf("m", True), t.const(16)
    q = t.op("tdiv", x, k)  # the sdiv of a non-negative size: floor division
    below = t.cmp("<", x, t.const(0))  # false for a size
    test = t.logic("and", t.cmp("!=", x, t.op("*", q, k)), t.cmp("==", below, t.const(0)))
    assert t.render(t.select(test, t.op("+", q, t.const(1)), q)) == "cdiv(m, 16)"
    signed = t.op("tdiv", t.leaf("n", False), k)  # a scalar that may be negative keeps C's division
    assert t.render(signed) == "tdiv(n, 16)"


def test_rendered_terms_evaluate_like_the_terms() -> None:
    rng = random.Random(1)
    a, b = t.leaf("a", False), t.leaf("b", False)
    terms = [
        t.op("tdiv", a, b),
        t.op("tmod", a, b),
        t.select(t.cmp(">", a, b), t.op("*", a, t.const(3)), t.op("-", b, a)),
        t.logic("or", t.cmp("==", a, t.const(0)), t.logic("not", t.cmp("<", b, a))),
        t.op("^", t.op("&", a, t.const(0xF0)), t.op("|", b, t.const(1))),
        t.call("max", t.op("<<", a, t.const(2)), t.op(">>", b, t.const(1))),
    ]
    for _ in range(300):
        env = {"a": rng.randint(-50, 50), "b": rng.choice([-7, -3, -1, 1, 2, 5, 9])}
        for term in terms:
            assert Expr.parse(t.render(term)).evaluate(env) == t.evaluate(term, env), t.render(term)
    assert (tdiv(-7, 2), tmod(-7, 2), tdiv(7, -2), tmod(7, -2)) == (-3, -1, -3, 1)


@pytest.mark.dsl
def test_a_registry_kernel_grid_may_test_runtime_values(tmp_path: Path) -> None:
    # traced through the DSL's select, and checked against the host function's own grid
    grid = '["num_tokens if num_tokens > 0 and num_experts > 0 else 1", "cdiv(hidden, cta_threads * 8)", 1]'
    text = TOPK_SMALL.replace('grid:  ["num_tokens", "cdiv(hidden, cta_threads * 8)", 1]', f"grid:  {grid}")
    assert text != TOPK_SMALL
    text = text.replace("archs: [sm_90a, sm_100a, sm_120a]", "archs: [sm_90a]").replace(
        "output: [fp32, bf16]", "output: [fp32]"
    )
    spec = write_spec(tmp_path, "s.yaml", text.replace("cta_threads: [128, 256]", "cta_threads: [128]"))
    db = tmp_path / "r.db"
    run_compile(str(spec), "--registry", str(db))
    with sqlite3.connect(db) as conn:
        (launch,) = [json.loads(row[0]) for row in conn.execute("SELECT launch_json FROM kernels")]
    assert launch["grid"][0] == "num_tokens if num_tokens > 0 and num_experts > 0 else 1"
    assert "params" not in launch
