from __future__ import annotations

import pytest

from b12x_aot.contract import Expr, ExpressionError, Geometry, cdiv


@pytest.mark.parametrize(
    ("source", "env", "value"),
    [
        ("1 + 2 * 3", {}, 7),
        ("hidden // (cta_threads * 8)", {"hidden": 7168, "cta_threads": 128}, 7),
        ("cdiv(n, 128)", {"n": 129}, 2),
        ("cdiv(n, 128)", {"n": 128}, 1),
        ("min(a, b) + max(a, b)", {"a": 3, "b": 9}, 12),
        ("sizeof(element) * 8", {"element": "bf16"}, 16),
        ("x % 32 == 0 and x <= 1024", {"x": 256}, True),
        ("e in ('bf16', 'fp16')", {"e": "fp32"}, False),
        ("not (a < b < c)", {"a": 1, "b": 3, "c": 2}, True),
        ("a if a > b else b", {"a": 1, "b": 5}, 5),
        ("1 << k", {"k": 4}, 16),
        (64, {}, 64),
    ],
)
def test_evaluates(source: str | int, env: dict, value: object) -> None:
    assert Expr.parse(source).evaluate(env) == value


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("a / b", "use // for integer division"),
        ("__import__('os')", "only the functions"),
        ("os.system", "Attribute is not allowed"),
        ("x[0]", "Subscript is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("[i for i in x]", "ListComp is not allowed"),
        ("a ** 2", "Pow is not allowed"),
        ("a is b", "comparison Is is not allowed"),
        ("1.5 * a", "not an integer or string"),
        ("min(a)", "takes 2..8 positional arguments"),
        ("(", "syntax error"),
        ("", "empty"),
    ],
)
def test_rejects(source: str, fragment: str) -> None:
    with pytest.raises(ExpressionError) as err:
        Expr.parse(source)
    assert fragment in str(err.value)


@pytest.mark.parametrize(("source", "count"), [("1 << k", -1), ("2 << k", 100_000_000), ("x >> k", 257)])
def test_shift_counts_outside_0_to_256_are_refused_naming_the_expression(source: str, count: int) -> None:
    # A negative count raised a ValueError that named nothing; a huge one built a huge integer.
    with pytest.raises(ExpressionError) as err:
        Expr.parse(source).evaluate({"k": count, "x": 5})
    assert err.value.source == source and f"a shift count must be 0..256 (got {count})" in str(err.value)
    assert Expr.parse(source).evaluate({"k": 256, "x": 5}) >= 0  # the bound itself is allowed


def test_names_and_unbound() -> None:
    expr = Expr.parse("cdiv(num_tokens * topk, block_m) + sizeof(element)")
    assert expr.names == {"num_tokens", "topk", "block_m", "element"}
    with pytest.raises(ExpressionError, match="unbound name"):
        expr.evaluate({"num_tokens": 1})


def test_compile_folds_constants_and_indexes_args() -> None:
    expr = Expr.parse("cdiv(num_tokens, tile) * 2")
    fn = expr.compile({"tile": 64}, {"num_tokens": 3})
    assert callable(fn)
    assert fn([0, 0, 0, 130]) == 6
    assert Expr.parse("hidden // 8").compile({"hidden": 64}, {}) == 8
    direct = Expr.parse("num_tokens").compile({}, {"num_tokens": 1})
    assert direct(["ptr", 42]) == 42


def test_compile_refuses_unbound() -> None:
    with pytest.raises(ExpressionError, match="unbound"):
        Expr.parse("a + b").compile({"a": 1}, {})


def test_geometry_grid_and_static_parts() -> None:
    geo = Geometry.parse(["num_tokens", "cdiv(hidden, cta_threads * 8)", 1], ["cta_threads", 1, 1], "0")
    assert geo.grid_of({"hidden": 7168, "cta_threads": 128, "num_tokens": 9}) == (9, 7, 1)
    static = Geometry.parse([2, 3, 4], [128, 1, 1], "cta * 4")
    bound = static.bind_static({"cta": 64})
    assert (bound.block, bound.smem, bound.threads) == ((128, 1, 1), 256, 128)


def test_geometry_json_round_trip() -> None:
    geo = Geometry.parse(["a", 1, 1], ["b", 1, 1], "a * b", ["1", "1", "1"], ["a >= 0"])
    assert Geometry.from_json(geo.to_json()) == geo


def test_geometry_static_must_be_non_negative_int() -> None:
    with pytest.raises(ExpressionError, match="must evaluate to an int >= 0"):
        Geometry.parse([1, 1, 1], ["0 - t", 1, 1]).bind_static({"t": 4})


def test_inline_python_evaluates_like_the_evaluator() -> None:
    """Expr.python (what generated launch code inlines) against Expr.evaluate, over negatives and
    zeros too: floor division, modulo, shifts, chains, and/or/not, conditionals, calls."""
    sources = [
        "a // b",
        "a % b",
        "a << 2",
        "a >> 1",
        "-a + p * b",
        "cdiv(a, p)",
        "min(a, b, p)",
        "max(a - b, 0)",
        "0 <= a < b",
        "a == b or p > 3",
        "a and b",
        "a or b",
        "not a and b",
        "a if b > 0 else p",
        "(a * b) // (p + 1) % 7",
    ]
    for source in sources:
        expr = Expr.parse(source)
        code = expr.python({"p": 5}, {"a": "a0", "b": "a1"})
        assert code is not None and "p" not in code.replace("a0", "").replace("a1", ""), (source, code)
        inline = eval(f"lambda a0, a1: {code}", {"_cdiv": cdiv})
        for a in range(-9, 10):
            for b in range(-9, 10):
                try:
                    want = expr.evaluate({"a": a, "b": b, "p": 5})
                except ZeroDivisionError:
                    with pytest.raises(ZeroDivisionError):
                        inline(a, b)
                    continue
                got = inline(a, b)
                assert got == want and type(got) is type(want), (source, a, b, got, want)


def test_inline_python_leaves_out_what_it_cannot_write() -> None:
    # a runtime or out-of-range shift count: the closure checks it, as the evaluator does
    assert Expr.parse("a << b").python({}, {"a": "a0", "b": "a1"}) is None
    assert Expr.parse("a << 300").python({}, {"a": "a0"}) is None
    with pytest.raises(ExpressionError, match="a shift count must be"):
        Expr.parse("a << b").compile({}, {"a": 0, "b": 1})((1, -1))  # type: ignore[operator]
    assert Expr.parse("a in (1, 2)").python({}, {"a": "a0"}) is None
    assert Expr.parse("s == 'x'").python({"s": "x"}, {}) == "True"  # params fold to a literal
    assert Expr.parse("sizeof(s)").python({"s": "bf16"}, {}) == "2"
