"""Tensor arguments, entry keywords and lets as specs declare them: defaults, names, faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from b12x_aot.compiler._spec import load_spec
from b12x_aot.compiler._spec_args import layout_strides
from b12x_aot.compiler.errors import SpecError
from b12x_aot.contract import Expr, Geometry

from ..conftest import ROOT, TOPK_SMALL, write_spec

TENSORS = """
family: t.tensors
abi: 1
kernel: mypkg.mod:Kernel
archs: [sm_90a]
params:
  dtype: [fp16, fp32]
  tile: [64]
init:
  tile_shape: [tile, tile, 32]
  acc: "dtype('fp32')"
  mode: "'row'"
constexpr: {copy_bits: 128}
args:
  - {name: a, kind: tensor, dtype: "{dtype}", shape: [m, k], stride: [lda, 1], divisibility: {k: 8, lda: 8}}
  - {name: b, kind: tensor, dtype: "{dtype}", shape: [n, k]}
  - {name: c, kind: tensor, dtype: fp32, shape: [m, n], stride: dynamic, intent: out}
  - {name: s, kind: tensor, dtype: fp32, shape: [tile, num], stride: column_major, dynamic: [0]}
  - {name: num, kind: i32}
launch:
  let: {tiles_m: "cdiv(m, tile)", tiles: "tiles_m * cdiv(n, tile)"}
  grid: ["tiles", "1 if num > 0 else 2", 1]
"""


def test_tensor_layouts_default_and_decide_their_dynamic_modes(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, "t.yaml", TENSORS))
    a, b, c, s, _ = spec.args
    assert a.stride == ("lda", "1") and a.dynamic == (0, 1) and a.dynamic_stride == (0,)
    assert b.stride == ("k", "1") and b.dynamic_stride == (0,)  # row-major by default
    assert c.stride == ("c__stride0", "c__stride1") and c.dynamic_stride == (0, 1)
    assert s.stride == ("1", "tile") and s.dynamic == (0, 1) and s.dynamic_stride == ()
    assert spec.symbols == ("m", "k", "lda", "n")
    # a tensor's base alignment defaults to its element size, per variant
    assert a.resolve({"dtype": "fp16"}).align == 2 and a.resolve({"dtype": "fp32"}).align == 4
    assert dict(a.divisibility) == {"k": 8, "lda": 8}


def test_strides_of_the_named_forms() -> None:
    assert layout_strides("x", ("b", "m + 1", "8"), "row_major") == ("(m + 1) * 8", "8", "1")
    assert layout_strides("x", ("b", "m", "8"), "column_major") == ("1", "b", "b * m")
    assert layout_strides("x", ("b", "m"), "dynamic") == ("x__stride0", "x__stride1")


def test_entry_keywords_and_lets(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, "t.yaml", TENSORS))
    init = dict(spec.init or ())
    assert init["tile_shape"][2] == 32 and isinstance(init["tile_shape"][0], Expr)
    assert dict(spec.constexpr) == {"copy_bits": 128}
    assert spec.contract()["init"] == {
        "tile_shape": ["tile", "tile", 32],
        "acc": "dtype('fp32')",
        "mode": "'row'",
    }
    grid = spec.geometry.expanded().grid
    assert grid is not None and grid[0].evaluate({"tile": 64, "m": 130, "n": 64}) == 3
    assert spec.geometry.grid_of({"tile": 64, "m": 1, "n": 1, "num": 0}) == (1, 2, 1)


def test_specs_without_the_new_fields_keep_their_contract_shape() -> None:
    # tensor fields, init, constexpr and let enter a contract only when a spec uses them, so
    # the bundled families' variants stay current
    contract = load_spec(ROOT / "specs" / "moe_topk_sum.yaml").contract()
    assert set(contract) == {"family", "abi", "kernel", "args", "launch", "limits"}
    assert all(set(a) == {"name", "kind", "dtype", "align", "intent", "shape"} for a in contract["args"])
    assert "let" not in contract["launch"]


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("stride: [lda, 1]", "stride: [lda]", "args[0].stride: needs one entry per mode (2; got 1)"),
        ("stride: [lda, 1]", "stride: diagonal", "args[0].stride"),
        (
            "divisibility: {k: 8, lda: 8}",
            "divisibility: {n: 8}",
            "declare a symbol's divisibility where it is bound",
        ),
        ("shape: [n, k]}", "shape: [n, k + q]}", "reads q"),
        ("shape: [n, k]}", "shape: [a, k]}", "'a' is the name of a pointer or tensor argument, not a size"),
        ("tiles_m: ", "m: ", "'m' must be a new identifier"),
        ("grid: [", "block: [tiles, 1, 1]\n  grid: [", "launch.block[0]: expression 'tiles' reads"),
        ("name: num, kind: i32", "name: num, kind: i32, stride: [1]", "only a tensor argument takes stride"),
        ("name: a, kind", "name: a__x, kind", "without '__'"),
        ("acc: \"dtype('fp32')\"", "acc: 1.5", "must be an int, a bool, an expression string or a list"),
        ("mode: \"'row'\"", 'mode: "rows"', "reads rows"),
    ],
)
def test_tensor_spec_faults(tmp_path: Path, old: str, new: str, fragment: str) -> None:
    assert old in TENSORS
    with pytest.raises(SpecError) as err:
        load_spec(write_spec(tmp_path, "t.yaml", TENSORS.replace(old, new)))
    assert fragment in str(err.value)


def test_a_pointer_spec_still_needs_no_tensor_fields(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, "p.yaml", TOPK_SMALL))
    assert all(a.stride is None and a.dynamic == () for a in spec.args)


def test_lets_substitute_into_every_expression() -> None:
    geometry = Geometry.parse(["t * 2", 1, 1], [128, 1, 1], 0, let=[("u", "n + 1"), ("t", "u * u")])
    expanded = geometry.expanded()
    assert expanded.let == () and expanded.grid[0].evaluate({"n": 2}) == 18  # type: ignore[index]
    assert Geometry.from_json(geometry.to_json()) == geometry
