"""The expression language's operators and functions, and the bounds on what they make.

Every value an expression makes is bounded, so that no expression, in a spec or in a damaged
registry, can make the process allocate without limit: an integer has at most
:data:`MAX_INT_BITS` bits, a string or tuple at most :data:`MAX_LENGTH` items, and a shift
count is at most :data:`MAX_SHIFT`. Repetition and concatenation are checked before they
allocate; ``%`` is the integer remainder only (string formatting could pad to any width).
An expression's text is at most :data:`MAX_SOURCE` characters and its tree at most
:data:`MAX_DEPTH` levels deep, so parsing and the evaluator's recursion are bounded too
(``_expr`` checks those). Operands that are not Python values (the DSL's traced ``Int32``)
pass through unchecked: their size is the DSL's.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from typing import Any

from ._abi import DTYPES
from .errors import ExpressionError

__all__ = [
    "ARITY",
    "BINOPS",
    "COMPARE",
    "FUNCTIONS",
    "MAX_DEPTH",
    "MAX_INT_BITS",
    "MAX_LENGTH",
    "MAX_SHIFT",
    "MAX_SOURCE",
    "UNARY",
    "cdiv",
    "tdiv",
    "tmod",
]

# Shift counts past any launch value: a larger one would only build a huge integer (or, negative,
# raise a ValueError that names no expression).
MAX_SHIFT = 256
MAX_INT_BITS = 1024  # four times the largest shift: launch values are 64-bit
MAX_LENGTH = 4096  # a string's characters, a tuple's items: dtype names and small tuples
MAX_SOURCE = 16384  # characters of one expression; the longest shipped is a few hundred
MAX_DEPTH = 100  # levels of one expression's tree, well inside Python's recursion limit


def cdiv(a: Any, b: Any) -> Any:
    """Ceiling division for non-negative operands."""
    return (a + b - 1) // b


def tdiv(a: int, b: int) -> int:
    """Division truncating toward zero, as C and LLVM's ``sdiv`` divide."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def tmod(a: int, b: int) -> int:
    """The remainder of :func:`tdiv` (the sign of ``a``), as LLVM's ``srem``."""
    return a - b * tdiv(a, b)


def _sizeof(name: Any) -> int:
    if name not in DTYPES:
        raise ExpressionError(str(name), f"sizeof() takes a dtype name, one of {', '.join(DTYPES)}")
    return DTYPES[name].itemsize


def _dtype(name: Any) -> str:
    if name not in DTYPES:
        raise ExpressionError(str(name), f"dtype() takes a dtype name, one of {', '.join(DTYPES)}")
    return str(name)


def _int(value: Any, symbol: str) -> Any:
    """``value``, refused when it is an integer past :data:`MAX_INT_BITS`."""
    if value.__class__ is int and value.bit_length() > MAX_INT_BITS:
        raise ExpressionError(
            symbol,
            f"{symbol} makes a {value.bit_length()}-bit integer; at most {MAX_INT_BITS} bits are allowed",
        )
    return value


def _length(n: int, symbol: str) -> None:
    if n > MAX_LENGTH:
        raise ExpressionError(
            symbol, f"{symbol} would make a string or tuple of {n:,} items; at most {MAX_LENGTH} are allowed"
        )


_SEQ = (str, tuple)


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, _SEQ) and isinstance(b, _SEQ):
        _length(len(a) + len(b), "+")
        return a + b
    return _int(a + b, "+")


def _sub(a: Any, b: Any) -> Any:
    return _int(a - b, "-")


def _mul(a: Any, b: Any) -> Any:
    if isinstance(a, _SEQ) and isinstance(b, int):
        _length(len(a) * b, "*")
    elif isinstance(b, _SEQ) and isinstance(a, int):
        _length(len(b) * a, "*")
    return _int(a * b, "*")


def _mod(a: Any, b: Any) -> Any:
    if isinstance(a, str):
        raise ExpressionError("%", "% formats a string here; in expressions % is only the integer remainder")
    return a % b


def _shift(shift: Callable[[Any, Any], Any], symbol: str) -> Callable[[Any, Any], Any]:
    def checked(a: Any, b: Any) -> Any:
        if isinstance(b, int) and not 0 <= b <= MAX_SHIFT:
            raise ExpressionError(f"{symbol} {b}", f"a shift count must be 0..{MAX_SHIFT} (got {b})")
        return _int(shift(a, b), symbol)

    return checked


BINOPS: Mapping[type, Callable[[Any, Any], Any]] = {
    ast.Add: _add,
    ast.Sub: _sub,
    ast.Mult: _mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: _mod,
    ast.LShift: _shift(operator.lshift, "<<"),
    ast.RShift: _shift(operator.rshift, ">>"),
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
UNARY: Mapping[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
COMPARE: Mapping[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "cdiv": cdiv,
    "min": min,
    "max": max,
    "sizeof": _sizeof,
    "dtype": _dtype,
    "tdiv": tdiv,
    "tmod": tmod,
}
ARITY: Mapping[str, tuple[int, int]] = {
    "cdiv": (2, 2),
    "min": (2, 8),
    "max": (2, 8),
    "sizeof": (1, 1),
    "dtype": (1, 1),
    "tdiv": (2, 2),
    "tmod": (2, 2),
}
