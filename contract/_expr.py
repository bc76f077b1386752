"""A small whitelisted arithmetic language for constraints and launch geometry.

Spec constraints, the DSL host launch and the loader's launch all read the same expressions,
so they are parsed once with :mod:`ast` and walked by hand: never ``eval``. The grammar is
integer arithmetic (``+ - * // % << >>``, bitwise ``& | ^``), comparisons, ``and/or/not``,
``x if c else y``, tuples for ``in``, string and integer literals, names, and the functions
``cdiv(a, b)`` (ceiling division), ``min``, ``max``, ``sizeof(dtype)`` (bytes per element),
``dtype(name)`` (a dtype name, checked: the compiler reads it as the DSL's numeric type) and
``tdiv``/``tmod`` (C's truncating division and remainder, which the words a host function
computes for a kernel's parameters use).

Evaluation is duck-typed, so the same tree evaluates over Python ints (constraints, the
loader) and over the DSL's traced ``Int32`` values (the kernel's host launch function, which
passes the DSL's own ``min`` and ``max`` in ``functions``, as Python's cannot order traced
values).
Operands of ``//`` and ``%`` are expected to be non-negative; there floor and truncation agree.
Every expression is bounded in its length, its depth and the size of each value it makes
(``_ops``): past a bound it raises :class:`ExpressionError`, never allocates without limit.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._ops import ARITY, BINOPS, COMPARE, FUNCTIONS, MAX_DEPTH, MAX_SHIFT, MAX_SOURCE, UNARY, cdiv, tdiv, tmod
from .errors import ExpressionError

__all__ = ["TRACED", "Expr", "cdiv", "tdiv", "tmod"]


# In ``functions``, TRACED marks an evaluation over traced DSL values, whose comparisons have no
# Python truth value: conditionals, ``and``/``or``/``not`` and chained comparisons then go through
# the "select", "and", "or" and "not" functions it also passes.
TRACED = "__traced__"


# Nodes that need no check of their own: containers, contexts and the operators that the
# BinOp/UnaryOp/Compare checks have already vetted (ast.walk visits parents first).
_PASSIVE_NODES = (
    ast.Expression,
    ast.Load,
    ast.And,
    ast.Or,
    ast.BoolOp,
    ast.IfExp,
    ast.Tuple,
    ast.List,
    *BINOPS,
    *UNARY,
    *COMPARE,
)


def _free_names(node: ast.AST) -> set[str]:
    """The names ``node`` reads: every name but the functions it calls (a param may be named
    like a function, ``dtype``)."""
    called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in called}


def _check(node: ast.AST, source: str) -> frozenset[str]:
    """Reject every node outside the grammar; return the free names."""
    for sub in ast.walk(node):
        if isinstance(sub, (*_PASSIVE_NODES, ast.Name)):
            continue
        elif isinstance(sub, ast.Constant):
            if not isinstance(sub.value, int | str) or sub.value is None:
                raise ExpressionError(source, f"literal {sub.value!r} is not an integer or string")
        elif isinstance(sub, ast.BinOp):
            if type(sub.op) not in BINOPS:
                hint = " (use // for integer division)" if isinstance(sub.op, ast.Div) else ""
                raise ExpressionError(source, f"operator {type(sub.op).__name__} is not allowed{hint}")
        elif isinstance(sub, ast.UnaryOp):
            if type(sub.op) not in UNARY:
                raise ExpressionError(source, f"operator {type(sub.op).__name__} is not allowed")
        elif isinstance(sub, ast.Compare):
            for op in sub.ops:
                if type(op) not in COMPARE:
                    raise ExpressionError(source, f"comparison {type(op).__name__} is not allowed")
        elif isinstance(sub, ast.Call):
            func = sub.func
            if not isinstance(func, ast.Name) or func.id not in FUNCTIONS:
                raise ExpressionError(source, f"only the functions {', '.join(FUNCTIONS)} may be called")
            lo, hi = ARITY[func.id]
            if sub.keywords or not lo <= len(sub.args) <= hi:
                raise ExpressionError(source, f"{func.id}() takes {lo}..{hi} positional arguments")
        else:
            raise ExpressionError(source, f"{type(sub).__name__} is not allowed in an expression")
    return frozenset(_free_names(node))


def _walk(node: ast.AST, env: Mapping[str, Any], funcs: Mapping[str, Callable[..., Any]] = FUNCTIONS) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        try:
            return env[node.id]
        except KeyError:
            raise ExpressionError(node.id, f"name {node.id!r} is not defined here") from None
    if isinstance(node, ast.BinOp):
        return BINOPS[type(node.op)](_walk(node.left, env, funcs), _walk(node.right, env, funcs))
    if isinstance(node, ast.UnaryOp):
        return UNARY[type(node.op)](_walk(node.operand, env, funcs))
    traced = TRACED in funcs
    if isinstance(node, ast.Compare):
        left = _walk(node.left, env, funcs)
        results = []
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _walk(comparator, env, funcs)
            results.append(COMPARE[type(op)](left, right))
            if not traced and not results[-1]:
                return False
            left = right
        return functools.reduce(funcs["and"], results) if traced else True
    if isinstance(node, ast.BoolOp):
        values = [_walk(v, env, funcs) for v in node.values] if traced else None
        if values is not None:
            return functools.reduce(funcs["and" if isinstance(node.op, ast.And) else "or"], values)
        if isinstance(node.op, ast.And):
            return all(_walk(v, env, funcs) for v in node.values)
        return any(_walk(v, env, funcs) for v in node.values)
    if isinstance(node, ast.IfExp):
        if traced:  # a traced condition has no Python truth value: both sides, then a select
            test, body, orelse = (_walk(n, env, funcs) for n in (node.test, node.body, node.orelse))
            return funcs["select"](test, body, orelse)
        return (
            _walk(node.body, env, funcs) if _walk(node.test, env, funcs) else _walk(node.orelse, env, funcs)
        )
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_walk(e, env, funcs) for e in node.elts)
    if isinstance(node, ast.Call):
        assert isinstance(node.func, ast.Name)
        return funcs[node.func.id](*(_walk(a, env, funcs) for a in node.args))
    raise ExpressionError(ast.unparse(node), "unsupported node")  # pragma: no cover - _check


def _closure(node: ast.AST, constants: Mapping[str, Any], positions: Mapping[str, int]) -> Any:
    """Fold constant subtrees; return a value, or a closure over the positional args."""
    if isinstance(node, ast.Name) and node.id in positions:
        return operator.itemgetter(positions[node.id])
    free = _free_names(node)
    if not free & positions.keys():
        return _walk(node, constants)
    if isinstance(node, ast.BinOp):
        op = BINOPS[type(node.op)]
        left = _closure(node.left, constants, positions)
        right = _closure(node.right, constants, positions)
        if not callable(left):
            return lambda a: op(left, right(a))
        if not callable(right):
            return lambda a: op(left(a), right)
        return lambda a: op(left(a), right(a))
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        cmp = COMPARE[type(node.ops[0])]
        left = _closure(node.left, constants, positions)
        right = _closure(node.comparators[0], constants, positions)
        if not callable(left):
            return lambda a: cmp(left, right(a))
        if not callable(right):
            return lambda a: cmp(left(a), right)
        return lambda a: cmp(left(a), right(a))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        func = FUNCTIONS[node.func.id]
        parts = [_closure(arg, constants, positions) for arg in node.args]
        getters = [p if callable(p) else (lambda _a, v=p: v) for p in parts]
        return lambda a: func(*(g(a) for g in getters))
    # Rare shapes (chained comparisons, conditionals) fall back to walking the tree per call.
    names = sorted(free & positions.keys())
    index = [(n, positions[n]) for n in names]
    return lambda a: _walk(node, {**constants, **{n: a[i] for n, i in index}})


_SYMBOLS: Mapping[type, str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.USub: "-",
    ast.UAdd: "+",
    ast.Not: "not ",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",  # written only where strings are (the planner's constraints)
    ast.NotIn: "not in",
    ast.And: " and ",
    ast.Or: " or ",
}
_EMITTED_CALLS = {
    "cdiv": "_cdiv",
    "min": "min",
    "max": "max",
    "tdiv": "_tdiv",
    "tmod": "_tmod",
}  # the caller binds them


def _python(
    node: ast.AST,
    constants: Mapping[str, Any],
    positions: Mapping[str, str],
    strings: frozenset[str] | None = None,
) -> str | None:
    """Python source for ``node``: params folded to int or bool literals, runtime names as the
    sources ``positions`` gives them, operators from ``_SYMBOLS``. None where it cannot (a
    string value, ``in``, ``sizeof`` of a runtime name): the caller then uses :func:`_closure`."""
    free = _free_names(node)
    if not free & positions.keys():
        value = _walk(node, constants)
        return repr(value) if value.__class__ in (int, bool) else None
    if isinstance(node, ast.Name):
        return None if strings is not None and node.id in strings else positions[node.id]
    parts: list[str | None]
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.LShift | ast.RShift):
            # a shift count is checked (MAX_SHIFT): inline only a constant one that passes
            runtime = any(isinstance(n, ast.Name) and n.id in positions for n in ast.walk(node.right))
            if runtime or not 0 <= _walk(node.right, constants) <= MAX_SHIFT:
                return None
        parts = [
            _python(node.left, constants, positions, strings),
            _python(node.right, constants, positions, strings),
        ]
        return None if None in parts else f"({parts[0]} {_SYMBOLS[type(node.op)]} {parts[1]})"
    if isinstance(node, ast.UnaryOp):
        inner = _python(node.operand, constants, positions, strings)
        return None if inner is None else f"({_SYMBOLS[type(node.op)]}{inner})"
    if isinstance(node, ast.BoolOp):  # a bool, as the evaluator gives, not the deciding operand
        parts = [_python(v, constants, positions, strings) for v in node.values]
        return None if None in parts else "bool(" + _SYMBOLS[type(node.op)].join(parts) + ")"  # type: ignore[arg-type]
    if isinstance(node, ast.Compare) and (
        strings is not None or not any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
    ):
        parts = [_compared(n, constants, positions, strings) for n in (node.left, *node.comparators)]
        if None in parts:
            return None
        chain = [parts[0]]
        for op, right in zip(node.ops, parts[1:], strict=True):
            chain += [_SYMBOLS[type(op)], right]
        return "(" + " ".join(chain) + ")"  # type: ignore[arg-type]
    if isinstance(node, ast.IfExp):
        parts = [_python(n, constants, positions, strings) for n in (node.body, node.test, node.orelse)]
        return None if None in parts else f"({parts[0]} if {parts[1]} else {parts[2]})"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _EMITTED_CALLS:
        parts = [_python(arg, constants, positions, strings) for arg in node.args]
        if None in parts:
            return None
        if node.func.id == "cdiv" and parts[1].isdigit() and int(parts[1]) > 0:  # type: ignore[union-attr]
            return f"(({parts[0]} + {int(parts[1]) - 1}) // {parts[1]})"  # a call costs more than the sum
        return f"{_EMITTED_CALLS[node.func.id]}({', '.join(parts)})"  # type: ignore[arg-type]
    return None


def _compared(
    node: ast.AST, constants: Mapping[str, Any], positions: Mapping[str, str], strings: frozenset[str] | None
) -> str | None:
    """A comparison's operand. With ``strings`` (the runtime names that may hold strings), a
    string name, a string constant or a tuple of scalars too: compared, never computed with."""
    if strings is not None:
        if isinstance(node, ast.Name) and node.id in strings:
            return positions[node.id]
        if not _free_names(node) & positions.keys():
            value = _walk(node, constants)
            if value.__class__ is str or (
                value.__class__ is tuple and all(v.__class__ in (int, bool, str) for v in value)
            ):
                return repr(value)  # a literal that reads back as the same value
    return _python(node, constants, positions, strings)


class Expr:
    """A parsed expression. ``names`` are the free names it reads.

    Immutable; equal and hashed by its source text. Build one with :meth:`parse`, which caches
    by text, so a registry's many variants share one parse of each launch expression.
    """

    __slots__ = ("_tree", "names", "source")

    def __init__(self, source: str, names: frozenset[str], tree: ast.Expression) -> None:
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "_tree", tree)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Expr is immutable (tried to set {name!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and other.source == self.source

    def __hash__(self) -> int:
        return hash(self.source)

    def __repr__(self) -> str:
        return f"Expr({self.source!r})"

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Pickled as its source (compile jobs cross process boundaries); parsed again on load.
        return Expr.parse, (self.source,)

    @staticmethod
    def parse(source: str | int) -> Expr:
        """Parse ``source``; raise :class:`ExpressionError` naming what is not allowed."""
        if isinstance(source, bool) or not isinstance(source, int | str):
            raise ExpressionError(repr(source), "an expression must be an integer or a string")
        return _parse(str(source).strip())

    def evaluate(
        self, env: Mapping[str, Any], functions: Mapping[str, Callable[..., Any]] | None = None
    ) -> Any:
        """Evaluate over ``env``; an unbound name raises :class:`ExpressionError`.

        ``functions`` replaces some of the built-in functions: the DSL host launch passes
        ``min``/``max`` that work on traced values, where Python's cannot compare.
        """
        try:
            return _walk(self._tree.body, env, {**FUNCTIONS, **functions} if functions else FUNCTIONS)
        except ExpressionError as exc:
            if exc.source in self.names:
                raise ExpressionError(self.source, f"unbound name(s): {exc.source}") from None
            raise ExpressionError(self.source, exc.reason) from None  # name the whole expression
        except TypeError as exc:  # operands the operator does not take: 'bf16' + 1
            raise ExpressionError(self.source, f"cannot be evaluated: {exc}") from None

    def compile(
        self, constants: Mapping[str, Any], positions: Mapping[str, int]
    ) -> int | Callable[[Sequence[Any]], Any]:
        """Bind ``constants`` now; return a constant, or a closure over positional args.

        ``positions`` maps each runtime name to its index in the argument tuple the closure
        receives. The result does no parsing and no name lookups when called.
        """
        unbound = self.names - constants.keys() - positions.keys()
        if unbound:
            raise ExpressionError(self.source, f"unbound name(s): {', '.join(sorted(unbound))}")
        return _closure(self._tree.body, constants, positions)

    def python(
        self, constants: Mapping[str, Any], sources: Mapping[str, str], strings: frozenset[str] | None = None
    ) -> str | None:
        """Python source that evaluates this expression inside a generated function:
        ``constants`` folded into int or bool literals, the runtime name ``n`` read as
        ``sources[n]`` (an atom the caller generates, such as ``a3`` or ``s0[1]``), ``cdiv`` as
        ``_cdiv``. Only literals, those sources and the grammar's own operators appear in it,
        never text from the expression. None when the expression needs the evaluator (use
        :meth:`compile`). ``strings`` names the runtime names that may hold strings (the
        planner's params): string and tuple literals then appear too, as operands of a
        comparison only, so that no generated code computes with a string.
        """
        positions = sources
        unbound = self.names - constants.keys() - positions.keys()
        if unbound:
            raise ExpressionError(self.source, f"unbound name(s): {', '.join(sorted(unbound))}")
        return _python(self._tree.body, constants, positions, strings)

    def substitute(self, bound: Mapping[str, Expr]) -> Expr:
        """This expression with each name in ``bound`` replaced by its expression; raises
        :class:`ExpressionError` when the result would be longer than an expression may be."""
        if not self.names & bound.keys():
            return self
        # Lets that read each other twice double at each step: refuse before building the text.
        grown = len(self.source) + sum(
            len(bound[n.id].source) + 2
            for n in ast.walk(self._tree)
            if isinstance(n, ast.Name) and n.id in bound
        )
        if grown > 2 * MAX_SOURCE:
            raise ExpressionError(
                self.source,
                f"with its let names substituted is about {grown:,} characters; at most {MAX_SOURCE:,} are read",
            )

        class _Replace(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.AST:
                return bound[node.id]._tree.body if node.id in bound else node

        tree = _Replace().visit(ast.parse(self.source, mode="eval"))
        return Expr.parse(ast.unparse(tree))

    def __str__(self) -> str:
        return self.source


def _depth(tree: ast.AST) -> int:
    """How many levels deep ``tree`` nests, counted without recursion."""
    deepest, pending = 0, [(tree, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Expr:
    if not text:
        raise ExpressionError(text, "the expression is empty")
    if len(text) > MAX_SOURCE:
        raise ExpressionError(text, f"is {len(text):,} characters long; at most {MAX_SOURCE:,} are read")
    too_deep = f"nests deeper than {MAX_DEPTH} levels; name parts of it with launch.let"
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(text, f"syntax error: {exc.msg}") from None
    except (RecursionError, MemoryError):  # CPython's parser on a chain thousands deep
        raise ExpressionError(text, too_deep) from None
    if _depth(tree) > MAX_DEPTH:
        raise ExpressionError(text, too_deep)
    return Expr(text, _check(tree, text), tree)
