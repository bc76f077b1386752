"""Every value an expression makes is bounded, on each path that evaluates one: the evaluator
(constraints, planning), the loader's compiled closures and its inline code's folded constants.
A stored launch expression in a damaged registry raises ExpressionError, never allocates."""

from __future__ import annotations

import pytest

from b12x_aot.contract import Expr, ExpressionError
from b12x_aot.contract import _ops as ops

HUGE = [
    ("'a' * (1 << 30)", "would make a string or tuple of 1,073,741,824 items"),
    ("(1 << 30) * 'a'", "would make a string or tuple of 1,073,741,824 items"),
    ("(0,) * (1 << 28)", "of 268,435,456 items"),
    ("'%0999999999d' % 1", "% formats a string here"),
    ("((1 << 256) << 256) << 256 << 256 << 256", "<< makes a 1025-bit integer; at most 1024 bits"),
]


@pytest.mark.parametrize(("source", "reason"), HUGE)
def test_the_evaluator_refuses_before_allocating(source: str, reason: str) -> None:
    with pytest.raises(ExpressionError) as err:
        Expr.parse(source).evaluate({})
    assert reason in err.value.reason and err.value.source == source


@pytest.mark.parametrize(("source", "reason"), HUGE)
def test_the_loader_paths_fold_constants_with_the_bounds(source: str, reason: str) -> None:
    """What ``Codegen.value`` does with a stored expression: inline Python, else a closure."""
    for fold in (lambda e: e.python({}, {}), lambda e: e.compile({}, {})):
        with pytest.raises(ExpressionError) as err:
            fold(Expr.parse(source))
        assert reason in err.value.reason


def test_a_closure_over_a_runtime_value_is_bounded_at_the_call() -> None:
    expr = Expr.parse("'a' * n")
    assert expr.python({}, {"n": "a0"}) is None  # a string: never inline
    closure = expr.compile({}, {"n": 0})
    assert closure((3,)) == "aaa"
    with pytest.raises(ExpressionError, match="would make a string or tuple of 1,073,741,824"):
        closure((1 << 30,))


def test_concatenation_is_bounded() -> None:
    expr = Expr.parse("s + s")
    assert expr.evaluate({"s": "x" * (ops.MAX_LENGTH // 2)}) == "x" * ops.MAX_LENGTH
    with pytest.raises(ExpressionError, match="would make a string or tuple of 4,098 items"):
        expr.evaluate({"s": "x" * (ops.MAX_LENGTH // 2 + 1)})


def test_long_and_deep_expressions_are_refused_unparsed() -> None:
    with pytest.raises(ExpressionError, match="is 200,001 characters long; at most 16,384"):
        Expr.parse("+".join(["1"] * 100_001))
    with pytest.raises(ExpressionError, match="nests deeper than 100 levels"):
        Expr.parse("+".join(["1"] * 5000))  # within the length: Python's parser recurses
    with pytest.raises(ExpressionError, match="nests deeper than 100 levels"):
        Expr.parse("+".join(["1"] * 120))
    assert Expr.parse("+".join(["1"] * 90)).evaluate({}) == 90


def test_a_long_source_is_shown_elided() -> None:
    with pytest.raises(ExpressionError) as err:
        Expr.parse("+".join(["1"] * 100_001))
    assert len(str(err.value)) < 600


def test_a_type_error_is_an_expression_error() -> None:
    with pytest.raises(ExpressionError, match="cannot be evaluated: can only concatenate str"):
        Expr.parse("element + 1").evaluate({"element": "bf16"})


def test_substituting_lets_that_double_is_refused_before_the_text_is_built() -> None:
    bound: dict[str, Expr] = {"d0": Expr.parse("n")}
    with pytest.raises(ExpressionError, match=r"characters long|substituted is about"):
        for i in range(1, 40):
            bound[f"d{i}"] = Expr.parse(f"d{i - 1} - d{i - 1}").substitute(bound)
    assert i < 14  # refused once the text passed the bound, long before 2**39 characters
