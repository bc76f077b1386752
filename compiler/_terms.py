"""Integer terms read off a host function: built simplified, evaluated, written as expressions.

The DSL's host function computes each kernel parameter word and each grid dimension from its
arguments with LLVM integer arithmetic. :mod:`._host_launch` turns those SSA values into terms
over the launch's input words (a tensor's pointer, shape and stride values, the scalars), and
this module keeps them small while they are built: constants fold, identities drop out, and
what is known about sizes (every input marked non-negative is) turns the DSL's ceiling
division into ``cdiv``. A term renders to the expression language that the registry stores
and the loader evaluates (``contract/_expr``), and it evaluates directly over ints, for the planner's
checks of a spec's grid against the host function's.

Signed division in LLVM truncates toward zero; it becomes ``tdiv``/``tmod`` unless the
dividend is known non-negative, where ``//``/``%`` agree with it. Unsigned comparisons and
shifts are read as signed: they see sizes and addresses, which are non-negative.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any

from b12x_aot.contract import cdiv, tdiv, tmod

__all__ = [
    "Term",
    "cmp",
    "const",
    "evaluate",
    "is_const",
    "leaf",
    "logic",
    "nonneg",
    "op",
    "render",
    "select",
]

# ("c", value) | ("in", name, nonneg) | ("op", symbol, a, b) | ("cmp", symbol, a, b)
# | ("and"/"or", a, b) | ("not", a) | ("sel", c, a, b) | ("call", name, a, b)
Term = tuple

_BINARY: Mapping[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "//": operator.floordiv,
    "%": operator.mod,
    "tdiv": tdiv,
    "tmod": tmod,
    "&": operator.and_,
    "|": operator.or_,
    "^": operator.xor,
    "<<": operator.lshift,
    ">>": operator.rshift,
}
_COMPARE: Mapping[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_CALLS: Mapping[str, Callable[..., Any]] = {"cdiv": cdiv, "min": min, "max": max}


def const(value: Any) -> Term:
    return ("c", value)


def leaf(name: str, nonnegative: bool) -> Term:
    return ("in", name, nonnegative)


def is_const(term: Term) -> bool:
    return term[0] == "c"


def nonneg(term: Term) -> bool:
    """Whether ``term`` is known to be >= 0 (booleans count)."""
    kind = term[0]
    if kind == "c":
        return not isinstance(term[1], int) or term[1] >= 0
    if kind == "in":
        return term[2]
    if kind in ("cmp", "and", "or", "not"):
        return True
    if kind == "op":
        return term[1] in ("+", "*", "//", "%", "&", ">>", "<<", "tdiv", "tmod") and all(
            nonneg(t) for t in term[2:]
        )
    if kind == "sel":
        return nonneg(term[2]) and nonneg(term[3])
    if kind == "call":
        return all(nonneg(t) for t in term[2:])
    return False


def op(symbol: str, a: Term, b: Term) -> Term:
    """``a symbol b``, simplified."""
    if is_const(a) and is_const(b):
        return const(_BINARY[symbol](a[1], b[1]))
    if symbol in ("tdiv", "tmod") and nonneg(a) and is_const(b) and b[1] > 0:
        symbol = "//" if symbol == "tdiv" else "%"
    zero_a, zero_b = a == ("c", 0), b == ("c", 0)
    if symbol in ("+", "|", "^", "-", "<<", ">>") and zero_b:
        return a
    if symbol in ("+", "|", "^") and zero_a:
        return b
    if symbol in ("*", "&") and (zero_a or zero_b):
        return const(0)
    if symbol == "*" and b == ("c", 1):
        return a
    if symbol == "*" and a == ("c", 1):
        return b
    if symbol in ("//", "tdiv") and b == ("c", 1):
        return a
    return ("op", symbol, a, b)


def cmp(symbol: str, a: Term, b: Term) -> Term:
    if is_const(a) and is_const(b):
        return const(_COMPARE[symbol](a[1], b[1]))
    if b == ("c", 0) and nonneg(a) and symbol in ("<", ">="):
        return const(symbol == ">=")
    boolean = a[0] in ("cmp", "and", "or", "not")
    if boolean and is_const(b) and isinstance(b[1], bool | int) and symbol in ("==", "!="):
        return a if (symbol == "==") == bool(b[1]) else logic("not", a)
    return ("cmp", symbol, a, b)


def logic(kind: str, a: Term, b: Term | None = None) -> Term:
    """``not a``, ``a and b`` or ``a or b`` on booleans, simplified."""
    if kind == "not":
        if is_const(a):
            return const(not a[1])
        if a[0] == "not":
            return a[1]
        return ("not", a)
    assert b is not None
    for x, y in ((a, b), (b, a)):
        if is_const(x):
            if kind == "and":
                return y if x[1] else const(False)
            return const(True) if x[1] else y
    return (kind, a, b)


def select(c: Term, a: Term, b: Term) -> Term:
    """``a if c else b``, simplified; the DSL's ceiling division becomes ``cdiv``."""
    if is_const(c):
        return a if c[1] else b
    if a == b:
        return a
    # ceil_div(x, k) as the DSL lowers it, once x >= 0 is known:  q + 1 if x != q * k else q,
    # with q = x // k
    if (
        c[0] == "cmp"
        and c[1] == "!="
        and b[0] == "op"
        and b[1] == "//"
        and a
        in (
            ("op", "+", b, const(1)),
            ("op", "+", const(1), b),
        )
    ):
        x, k = b[2], b[3]
        if c[2] == x and c[3] in (("op", "*", b, k), ("op", "*", k, b)):
            return ("call", "cdiv", x, k)
    return ("sel", c, a, b)


def call(name: str, a: Term, b: Term) -> Term:
    if is_const(a) and is_const(b):
        return const(_CALLS[name](a[1], b[1]))
    return ("call", name, a, b)


def evaluate(term: Term, env: Mapping[str, Any]) -> Any:
    """The term's value for the input words in ``env``."""
    kind = term[0]
    if kind == "c":
        return term[1]
    if kind == "in":
        return env[term[1]]
    if kind == "op":
        return _BINARY[term[1]](evaluate(term[2], env), evaluate(term[3], env))
    if kind == "cmp":
        return _COMPARE[term[1]](evaluate(term[2], env), evaluate(term[3], env))
    if kind == "and":
        return bool(evaluate(term[1], env)) and bool(evaluate(term[2], env))
    if kind == "or":
        return bool(evaluate(term[1], env)) or bool(evaluate(term[2], env))
    if kind == "not":
        return not evaluate(term[1], env)
    if kind == "sel":
        return evaluate(term[2], env) if evaluate(term[1], env) else evaluate(term[3], env)
    return _CALLS[term[1]](*(evaluate(t, env) for t in term[2:]))


def render(term: Term) -> str:
    """The term in the expression language (fully parenthesized)."""
    kind = term[0]
    if kind == "c":
        value = term[1]
        return str(int(value)) if isinstance(value, bool) else repr(value)
    if kind == "in":
        return term[1]
    if kind == "op":
        a, b = render(term[2]), render(term[3])
        return f"{term[1]}({a}, {b})" if term[1] in ("tdiv", "tmod") else f"({a} {term[1]} {b})"
    if kind == "cmp":
        return f"({render(term[2])} {term[1]} {render(term[3])})"
    if kind in ("and", "or"):
        return f"({render(term[1])} {kind} {render(term[2])})"
    if kind == "not":
        return f"(not {render(term[1])})"
    if kind == "sel":
        return f"({render(term[2])} if {render(term[1])} else {render(term[3])})"
    return f"{term[1]}({', '.join(render(t) for t in term[2:])})"
