"""A spec's launch arguments: pointers, scalars and tensors, with the names they bring.

A tensor's ``shape`` and ``stride`` hold one entry per mode. An entry that reads only params
is compiled in (static) unless the mode is listed in ``dynamic``; any other entry is a
runtime word of the tensor. A bare name that is neither a param nor a scalar argument is a
*symbol*: the extent (or stride) of the first mode that names it, readable by every other
expression (grids, lets, requires, shapes), and checked equal wherever else it appears.
``stride`` defaults to ``row_major`` (the last mode contiguous, each stride the product of
the extents after it); ``column_major`` is the mirror, and ``dynamic`` leaves every stride
free (each its own runtime word, ``{arg}__stride{i}``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from b12x_aot.contract import DTYPES, Arg, ArgError, Expr, ExpressionError, tensor_fields

from ._spec_yaml import Faults

__all__ = ["ArgTemplate", "check_arg", "layout_strides", "spec_symbols", "static_extent", "tensor_template"]

_TEMPLATE = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)\}$")
STRIDE_FORMS = ("row_major", "column_major", "dynamic")


@dataclass(frozen=True, slots=True)
class ArgTemplate:
    """A spec argument; ``dtype`` may be a ``{param}`` template resolved per variant. A tensor's
    ``stride`` is resolved to one entry per mode, and its dynamic modes decided, at loading."""

    name: str
    kind: str
    dtype: str | None
    align: int | None
    intent: str
    shape: tuple[str, ...] | None = None
    stride: tuple[str, ...] | None = None
    dynamic: tuple[int, ...] = ()
    dynamic_stride: tuple[int, ...] = ()
    divisibility: tuple[tuple[str, int], ...] = ()
    shape_bits: int = 32
    stride_bits: int = 64

    @property
    def template_param(self) -> str | None:
        """The param a ``{param}`` dtype names, or None for a literal dtype."""
        m = _TEMPLATE.match(self.dtype) if self.dtype is not None else None
        return m.group(1) if m else None

    def resolve(self, params: Mapping[str, Any]) -> Arg:
        param = self.template_param
        dtype = str(params[param]) if param is not None else self.dtype
        align = self.align
        if align is None and self.kind == "tensor" and dtype in DTYPES:
            align = DTYPES[dtype].itemsize  # a tensor's base is aligned to its element by default
        return Arg(
            self.name,
            self.kind,
            dtype,
            align,
            self.intent,
            self.shape,
            self.stride,
            self.dynamic,
            self.dynamic_stride,
            self.divisibility,
            self.shape_bits,
            self.stride_bits,
        )

    def to_contract(self) -> dict[str, Any]:
        """What :meth:`Spec.contract` hashes of this argument. A pointer or scalar keeps the
        fields it always had, so the hashes of specs without tensors stay as they were."""
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "dtype": self.dtype,
            "align": self.align,
            "intent": self.intent,
            "shape": self.shape,
        }
        if self.kind == "tensor":
            out.update(tensor_fields(self))
        return out


def layout_strides(name: str, shape: Sequence[str], form: str) -> tuple[str, ...]:
    """The stride entries of a ``row_major``, ``column_major`` or ``dynamic`` tensor."""
    rank = len(shape)
    if form == "dynamic":
        return tuple(f"{name}__stride{i}" for i in range(rank))
    order = range(rank - 1, -1, -1) if form == "row_major" else range(rank)
    strides: dict[int, str] = {}
    product: list[str] = []
    for i in order:
        strides[i] = " * ".join(_factor(e) for e in product) or "1"
        product.insert(0 if form == "row_major" else len(product), shape[i])  # in mode order
    return tuple(strides[i] for i in range(rank))


def _factor(entry: str) -> str:
    """An entry as a factor of a product: parenthesized unless it is a name or a number."""
    entry = entry.strip()
    return entry if entry.isidentifier() or entry.isdigit() else f"({entry})"


def _bare(entry: str) -> str | None:
    entry = entry.strip()
    return entry if entry.isidentifier() else None


def spec_symbols(args: Iterable[ArgTemplate], params: Iterable[str]) -> dict[str, str]:
    """symbol -> the argument that binds it (its first bare appearance in a tensor mode)."""
    params = set(params)
    names = {a.name for a in args}  # a bare argument name is never a symbol (the spec refuses it)
    out: dict[str, str] = {}
    for arg in args:
        if arg.kind != "tensor":
            continue
        for entry in (*(arg.shape or ()), *(arg.stride or ())):
            name = _bare(entry)
            if name is not None and name not in params and name not in names and "__" not in name:
                out.setdefault(name, arg.name)
    return out


def tensor_template(
    name: str,
    dtype: str | None,
    align: int | None,
    intent: str,
    shape: Sequence[str],
    stride: str | Sequence[str],
    dynamic: Sequence[int],
    divisibility: Mapping[str, int],
    bits: tuple[int, int],
    params: Iterable[str],
) -> ArgTemplate:
    """A tensor argument with its strides resolved and its dynamic modes decided: a mode is
    dynamic when listed, or when its entry reads anything but params. Raises
    :class:`ArgError` naming a bad entry."""
    params = set(params)
    shape = tuple(str(e).strip() for e in shape)
    if isinstance(stride, str):
        if stride not in STRIDE_FORMS:
            raise ArgError(
                name, "stride", f"must be a list, or one of {', '.join(STRIDE_FORMS)} (got {stride!r})"
            )
        strides = layout_strides(name, shape, stride)
    else:
        strides = tuple(str(e).strip() for e in stride)
        if len(strides) != len(shape):
            raise ArgError(name, "stride", f"needs one entry per mode ({len(shape)}; got {len(strides)})")

    def reads_runtime(entry: str, field: str) -> bool:
        try:
            return bool(Expr.parse(entry).names - params)
        except ExpressionError as exc:
            raise ArgError(name, field, f"bad expression {entry!r}: {exc.reason}") from None

    listed = tuple(int(m) for m in dynamic)
    dyn_shape = tuple(sorted({i for i, e in enumerate(shape) if reads_runtime(e, "shape")} | set(listed)))
    dyn_stride = tuple(i for i, e in enumerate(strides) if reads_runtime(e, "stride"))
    return ArgTemplate(
        name,
        "tensor",
        dtype,
        align,
        intent,
        shape,
        strides,
        dyn_shape,
        dyn_stride,
        tuple(sorted((str(k), v) for k, v in divisibility.items())),
        bits[0],
        bits[1],
    )


def static_extent(entry: str, params: Mapping[str, Any]) -> int:
    """A static mode's extent (or stride) for these params."""
    value = Expr.parse(entry).evaluate(params)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExpressionError(entry, f"a static mode must be an int >= 0 (got {value!r})")
    return value


def check_arg(
    arg: ArgTemplate, where: tuple[Any, ...], params: Mapping[str, list[Any]], faults: Faults
) -> None:
    """Resolve the argument for every dtype its template can take and let :class:`Arg` judge."""
    param = arg.template_param
    if param is not None and param not in params:
        faults.add((*where, "dtype"), f"template {arg.dtype!r} names no param")
        return
    candidates = [{param: v} for v in params[param]] if param is not None else [{}]
    found: dict[tuple[str, str], list[Any]] = {}
    for values in candidates:
        try:
            arg.resolve(values)
        except ArgError as exc:
            found.setdefault((exc.field, exc.reason), []).append(values.get(param))  # type: ignore[arg-type]
    bad_dtypes = [v for (field, _), vs in found.items() if field == "dtype" for v in vs]
    if param is not None and bad_dtypes:
        faults.add(
            (*where, "dtype"),
            f"param {param!r} has values that are not dtypes: {bad_dtypes}; valid: {', '.join(DTYPES)}",
        )
    for field, reason in found:
        if not (param is not None and field == "dtype"):
            faults.add((*where, field) if field else where, reason)
