"""The launch ABI: element types, kernel arguments and the packed parameter buffer.

This is the one home of the AOT launch contract's data types. The compiler resolves a
spec's argument templates into :class:`Arg` records; the registry stores them; the loader
packs them. Everything here is stdlib-only so that serving processes can import it.

Records are ``NamedTuple``s rather than dataclasses: immutable and ``__dict__``-free like a
frozen slotted dataclass, but a NamedTuple class costs ~0.1 ms to create against ~0.8 ms for a
dataclass, and the loader's whole import budget is 10 ms.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from .errors import ArgError

__all__ = [
    "DTYPES",
    "SCALAR_KINDS",
    "Arg",
    "DType",
    "ParamLayout",
    "ScalarKind",
]


class DType(NamedTuple):
    """An element type that a pointer argument may point to."""

    name: str
    itemsize: int
    torch_name: str  # attribute of the ``torch`` module with the same bits


DTYPES: Mapping[str, DType] = {
    d.name: d
    for d in (
        DType("fp64", 8, "float64"),
        DType("fp32", 4, "float32"),
        DType("fp16", 2, "float16"),
        DType("bf16", 2, "bfloat16"),
        DType("fp8_e4m3", 1, "float8_e4m3fn"),
        DType("i64", 8, "int64"),
        DType("i32", 4, "int32"),
        DType("i16", 2, "int16"),
        DType("i8", 1, "int8"),
        DType("u64", 8, "uint64"),
        DType("u32", 4, "uint32"),
        DType("u16", 2, "uint16"),
        DType("u8", 1, "uint8"),
    )
}


class ScalarKind(NamedTuple):
    """A by-value kernel argument: its struct code, size and the values it admits."""

    name: str
    code: str  # struct module format character
    size: int
    lo: int | None  # inclusive integer range; None for floats
    hi: int | None


def _int_kind(name: str, code: str, bits: int, signed: bool) -> ScalarKind:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return ScalarKind(name, code, bits // 8, lo, hi)


SCALAR_KINDS: Mapping[str, ScalarKind] = {
    k.name: k
    for k in (
        _int_kind("i32", "i", 32, True),
        _int_kind("u32", "I", 32, False),
        _int_kind("i64", "q", 64, True),
        _int_kind("u64", "Q", 64, False),
        ScalarKind("f32", "f", 4, None, None),
        ScalarKind("f64", "d", 8, None, None),
    )
}

PTR = "ptr"
INTENTS = ("in", "out", "inout")


class _ArgFields(NamedTuple):
    name: str
    kind: str
    dtype: str | None
    align: int | None
    intent: str
    shape: tuple[str, ...] | None  # expression sources over params and scalar args


class Arg(_ArgFields):
    """One kernel parameter, resolved for a variant (no templates left).

    A pointer has an element ``dtype``, the byte ``align`` that the kernel assumes, an
    ``intent`` saying whether the kernel reads it, writes it or both, and optionally its
    ``shape``: one expression per dimension, over the variant's params and the launch's scalar
    arguments (parsed by the caller; ``_expr`` depends on this module). A scalar has only a kind.
    Construction validates every field and raises :class:`ArgError` naming the bad one: this
    is the one validator of argument declarations (specs are checked through it too).
    """

    __slots__ = ()

    def __new__(
        cls,
        name: str,
        kind: str,
        dtype: str | None = None,
        align: int | None = None,
        intent: str = "in",
        shape: tuple[str, ...] | None = None,
    ) -> Arg:
        if shape is not None:
            shape = tuple(str(d) for d in shape)
        self = super().__new__(cls, name, kind, dtype, align, intent, shape)
        self._validate()
        return self

    def _validate(self) -> None:
        """Raise :class:`ArgError` naming the first field that breaks the contract."""
        if not self.name.isidentifier():
            raise ArgError(self.name, "name", f"must be an identifier (got {self.name!r})")
        if self.kind == PTR:
            if self.dtype is None:
                raise ArgError(self.name, "dtype", "a ptr argument needs a dtype")
            if self.dtype not in DTYPES:
                raise ArgError(
                    self.name, "dtype", f"{self.dtype!r} is not a dtype; valid: {', '.join(DTYPES)}"
                )
            if self.align is None:
                raise ArgError(self.name, "align", "a ptr argument needs an align (bytes, a power of two)")
            if self.align <= 0 or self.align & (self.align - 1):
                raise ArgError(self.name, "align", f"must be a power of two (got {self.align!r})")
            if self.align < DTYPES[self.dtype].itemsize:
                raise ArgError(
                    self.name,
                    "align",
                    f"align {self.align} is below the {self.dtype} item size {DTYPES[self.dtype].itemsize}",
                )
            if self.intent not in INTENTS:
                raise ArgError(self.name, "intent", f"must be one of {INTENTS} (got {self.intent!r})")
            if self.shape is not None and not self.shape:
                raise ArgError(self.name, "shape", "needs at least one dimension (leave it out for none)")
        elif self.kind in SCALAR_KINDS:
            if self.dtype is not None or self.align is not None or self.shape is not None:
                raise ArgError(self.name, "", f"a {self.kind} scalar takes no dtype, align or shape")
            if self.intent != "in":
                raise ArgError(self.name, "intent", f"a scalar is always intent 'in' (got {self.intent!r})")
        else:
            kinds = ", ".join((PTR, *SCALAR_KINDS))
            raise ArgError(self.name, "kind", f"must be one of {kinds} (got {self.kind!r})")

    @property
    def is_pointer(self) -> bool:
        return self.kind == PTR

    @property
    def size(self) -> int:
        """Bytes this argument takes in the parameter buffer."""
        return 8 if self.kind == PTR else SCALAR_KINDS[self.kind].size

    @property
    def code(self) -> str:
        return "Q" if self.kind == PTR else SCALAR_KINDS[self.kind].code

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "kind": self.kind}
        if self.is_pointer:
            out.update(dtype=self.dtype, align=self.align, intent=self.intent)
            if self.shape is not None:
                out["shape"] = list(self.shape)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Arg:
        shape = data.get("shape")
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            dtype=data.get("dtype"),  # type: ignore[arg-type]
            align=data.get("align"),  # type: ignore[arg-type]
            intent=str(data.get("intent", "in")),
            shape=tuple(shape) if shape is not None else None,  # type: ignore[arg-type]
        )


class ParamLayout(NamedTuple):
    """The C struct that a kernel's parameters form: natural alignment, declared order.

    ``offsets[i]`` and ``sizes[i]`` are what the cubin's ``EIATTR_KPARAM_INFO`` must report
    for ordinal ``i``; ``fmt`` packs the whole buffer with ``struct.pack_into``.
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    size: int
    fmt: str

    @classmethod
    def of(cls, args: Iterable[Arg]) -> ParamLayout:
        offsets: list[int] = []
        sizes: list[int] = []
        fmt = ["<"]
        cursor = 0
        for arg in args:
            aligned = -(-cursor // arg.size) * arg.size
            if aligned > cursor:
                fmt.append(f"{aligned - cursor}x")
            offsets.append(aligned)
            sizes.append(arg.size)
            fmt.append(arg.code)
            cursor = aligned + arg.size
        layout = cls(tuple(offsets), tuple(sizes), cursor, "".join(fmt))
        if struct.calcsize(layout.fmt) != cursor:  # guards the arithmetic above
            raise AssertionError(f"parameter layout {layout.fmt!r} does not span {cursor} bytes")
        return layout
