"""What the generated launch code of one variant is made of: names, values and closures.

Prepared launches generate their ``__call__`` and ``checked`` per variant ABI (as Triton's
binder does), so a call runs straight-line code. That source is assembled only from fixed
templates, the positional names ``a0``, ``a1``, ..., the locals the templates bind (``s0``,
a tensor's shape; ``d0``, its strides; ``p0``/``q0``, checked addresses), integer and boolean
literals, the expression grammar's own operators, and names bound in its environment (a
tensor map's cache ``_m0`` and encoder ``_e0``, with the key ``_k0`` it binds): no text
from a spec or a registry ever reaches it. An expression over params and input words becomes
inline Python (``Expr.python``: params folded, each input word read where its argument holds
it), or, where it cannot, a call of a closure that the whitelisted evaluator (``contract/_expr``)
compiled, over the tuple ``A`` of every input word.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from b12x_aot.contract import Expr, ExpressionError, InputWord, ParamLayout, TensorMap, cdiv, tdiv, tmod

from ._index import IndexEntry
from ._tensor_maps import MapEncoder

__all__ = ["Codegen", "plain_sources", "rehearse", "word_sources"]


def word_sources(words: Sequence[InputWord], address: str, data: str) -> dict[str, str]:
    """Where generated code reads each input word: a scalar as its argument ``a{i}``, a
    pointer's address and a tensor's pointer as the ``address``/``data`` templates give them
    (``{n}`` the argument, ``{i}`` its position), a tensor's extents and strides from
    ``s{i}``/``d{i}`` (its shape and strides, read once per call)."""
    out: dict[str, str] = {}
    for w in words:
        n = f"a{w.arg}"
        if w.part == "value":
            out[w.name] = n
        elif w.part in ("address", "data"):
            out[w.name] = (address if w.part == "address" else data).format(n=n, i=w.arg)
        else:
            out[w.name] = f"{'s' if w.part == 'shape' else 'd'}{w.arg}[{w.mode}]"
    return out


def plain_sources(words: Sequence[InputWord]) -> dict[str, str]:
    """The plain call's: a pointer as an int or through ``data_ptr()``, a tensor through
    ``data_ptr()``; shapes and strides bound by :meth:`Codegen.prelude`."""
    return word_sources(words, "({n} if {n}.__class__ is int else {n}.data_ptr())", "{n}.data_ptr()")


class Codegen:
    """Source fragments for one variant's generated functions, and the environment they need."""

    __slots__ = ("env", "label", "names", "order", "params", "sources", "uses_args", "words")

    def __init__(
        self, entry: IndexEntry, env: dict[str, Any], words: Sequence[InputWord], sources: Mapping[str, str]
    ) -> None:
        self.params = entry.params
        self.label = entry.label
        self.names = [f"a{i}" for i in range(len(entry.args))]
        self.words = tuple(words)
        self.sources = dict(sources)
        self.order = list(self.sources)
        self.env = env
        env.update(_cdiv=cdiv, _tdiv=tdiv, _tmod=tmod)
        self.uses_args = False  # whether a fragment reads the tuple ``A``

    @property
    def signature(self) -> str:
        """``a0, a1, ..., `` for a ``def`` line or a call."""
        return "".join(f"{n}, " for n in self.names)

    @property
    def args_line(self) -> str:
        """The line that binds ``A``, when some fragment reads it."""
        if not self.uses_args:
            return ""
        return f"    A = ({''.join(f'{self.sources[n]}, ' for n in self.order)})\n"

    def prelude(self, indent: str = "        ") -> str:
        """The lines that read each tensor's shape and strides once, for the plain call."""
        lines = []
        for arg in sorted({w.arg for w in self.words if w.part == "shape"}):
            lines.append(f"{indent}s{arg} = a{arg}.shape\n")
        for arg in sorted({w.arg for w in self.words if w.part == "stride"}):
            lines.append(f"{indent}d{arg} = a{arg}.stride()\n")
        return "".join(lines)

    def key_parts(self) -> list[str]:
        """Sources of every input the words are read from, in argument order: a scalar, a
        pointer's address, a tensor's data pointer, whole shape and whole strides (the key of
        the plain call's memo: equal keys give equal words)."""
        parts: dict[str, None] = {}
        for w in sorted(self.words, key=lambda w: w.arg):
            if w.part in ("shape", "stride"):
                parts[f"a{w.arg}.shape" if w.part == "shape" else f"a{w.arg}.stride()"] = None
            else:
                parts[self.sources[w.name]] = None
        return list(parts)

    def value(self, expr: Expr) -> str:
        """Source that evaluates ``expr`` over this call's input words."""
        source = expr.python(self.params, self.sources)
        if source is not None:
            return source
        folded = expr.compile(self.params, {n: i for i, n in enumerate(self.order)})
        if not callable(folded):  # Expr.python folds every int and bool: this one is neither
            raise ExpressionError(expr.source, f"must evaluate to an integer (got {folded!r})")
        name = f"_x{len(self.env)}"  # unique in the environment every generated function shares
        self.env[name] = folded
        self.uses_args = True
        return f"{name}(A)"

    def slot(self, item: Expr | TensorMap, index: int) -> str:
        """Source for one packed slot: an expression's value, or tensor map ``index``'s bytes
        (from its cache, encoded on a miss; both generated functions share the encoder)."""
        if isinstance(item, Expr):
            return self.value(item)
        cache, encode = f"_m{index}", f"_e{index}"
        if encode not in self.env:
            encoder = MapEncoder(self.label, item)
            self.env[cache], self.env[encode] = encoder.cache, encoder
        parts = [self.sources[item.tensor], *(self.value(Expr.parse(e)) for e in (*item.dims, *item.strides))]
        return f"({cache}.get(_k{index} := ({', '.join(parts)})) or {encode}(_k{index}))"

    def values(self, exprs: tuple[Expr, ...]) -> str:
        """A tuple display of ``exprs`` (``(d0,)`` for one)."""
        parts = [self.value(e) for e in exprs]
        return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def rehearse(entry: IndexEntry) -> None:
    """Derive from ``entry``'s stored record all that preparing its launch derives, short of
    the driver: arguments, geometry, the parameter layout and the code of every packed slot
    and grid dimension. Raises what preparing it would (``b12x-registry verify`` asks this of
    every variant, so a tampered or unreadable launch record is a fault there, not at serving)."""
    params = entry.kernel_params
    ParamLayout.of(params, entry.arch)
    entry.static  # noqa: B018 - binds block, smem and cluster to the params
    words = entry.input_words
    code = Codegen(entry, {}, words, plain_sources(words))
    for slot in ParamLayout.slots(params):
        exprs = (*slot.dims, *slot.strides) if isinstance(slot, TensorMap) else (slot,)
        for expr in exprs:
            code.value(Expr.parse(expr))
    for expr in entry.geometry.grid:
        code.value(expr)
