"""The launch ABI: element types and kernel arguments.

This is the one home of the AOT launch contract's data types. The compiler resolves a
spec's argument templates into :class:`Arg` records; the registry stores them; the loader
packs them (``_params``). Everything here is stdlib-only so that serving processes can import it.

Records are ``NamedTuple``s rather than dataclasses: immutable and ``__dict__``-free like a
frozen slotted dataclass, but a NamedTuple class costs ~0.1 ms to create against ~0.8 ms for a
dataclass, and the loader's whole import budget is 10 ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from .errors import ArgError

__all__ = [
    "DTYPES",
    "INDEX_BITS",
    "SCALAR_KINDS",
    "TENSOR",
    "Arg",
    "DType",
    "ScalarKind",
    "tensor_fields",
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
TENSOR = "tensor"
INTENTS = ("in", "out", "inout")
INDEX_BITS = (32, 64)  # widths a tensor's dynamic shape and stride words may have


def tensor_fields(arg: object) -> dict[str, object]:
    """A tensor argument's layout fields as JSON (of an :class:`Arg`, or of the compiler's
    template of one: both have these attributes)."""
    return {
        "stride": list(getattr(arg, "stride", None) or ()),
        "dynamic": list(getattr(arg, "dynamic", ())),
        "dynamic_stride": list(getattr(arg, "dynamic_stride", ())),
        "divisibility": dict(getattr(arg, "divisibility", ())),
        "shape_bits": getattr(arg, "shape_bits", 32),
        "stride_bits": getattr(arg, "stride_bits", 64),
    }


class _ArgFields(NamedTuple):
    name: str
    kind: str
    dtype: str | None
    align: int | None
    intent: str
    shape: tuple[str, ...] | None  # expression sources over params, scalar args and symbols
    # tensors only: their layout as the kernel is compiled for it
    stride: tuple[str, ...] | None = None
    dynamic: tuple[int, ...] = ()  # shape modes whose extent is a runtime word
    dynamic_stride: tuple[int, ...] = ()  # stride modes whose value is a runtime word
    divisibility: tuple[tuple[str, int], ...] = ()  # symbol -> what the kernel may assume it divides by
    shape_bits: int = 32
    stride_bits: int = 64


class Arg(_ArgFields):
    """One kernel argument, resolved for a variant (no templates left).

    A pointer has an element ``dtype``, the byte ``align`` that the kernel assumes, an
    ``intent`` saying whether the kernel reads it, writes it or both, and optionally its
    ``shape``: one expression per dimension, over the variant's params and the launch's scalar
    arguments (parsed by the caller; ``_expr`` depends on this module). A scalar has only a kind.

    A tensor (a ``cute.Tensor`` in the kernel) has a dtype, align and intent too, a ``shape`` and
    a ``stride`` (one expression per mode each), and the modes the kernel reads at run time:
    ``dynamic`` extents and ``dynamic_stride`` strides, passed as ``shape_bits`` and
    ``stride_bits`` words after its pointer; the other modes are compiled in. An entry that
    is a bare name neither param nor scalar is a *symbol*, bound from the first tensor mode
    that names it (see ``_params``); ``divisibility`` says which symbols the kernel may assume
    are multiples of what.

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
        stride: tuple[str, ...] | None = None,
        dynamic: tuple[int, ...] = (),
        dynamic_stride: tuple[int, ...] = (),
        divisibility: tuple[tuple[str, int], ...] = (),
        shape_bits: int = 32,
        stride_bits: int = 64,
    ) -> Arg:
        if shape is not None:
            shape = tuple(str(d) for d in shape)
        if stride is not None:
            stride = tuple(str(d) for d in stride)
        self = super().__new__(
            cls,
            name,
            kind,
            dtype,
            align,
            intent,
            shape,
            stride,
            tuple(dynamic),
            tuple(dynamic_stride),
            tuple((str(k), v) for k, v in divisibility),
            shape_bits,
            stride_bits,
        )
        self._validate()
        return self

    def _validate(self) -> None:
        """Raise :class:`ArgError` naming the first field that breaks the contract."""
        if not self.name.isidentifier():
            raise ArgError(self.name, "name", f"must be an identifier (got {self.name!r})")
        if "__" in self.name:
            raise ArgError(self.name, "name", "names with '__' are reserved for a tensor's words")
        if self.kind == TENSOR:
            self._validate_memory("a tensor")
            self._validate_tensor()
        elif self.kind == PTR:
            self._validate_memory("a ptr argument")
            if self.shape is not None and not self.shape:
                raise ArgError(self.name, "shape", "needs at least one dimension (leave it out for none)")
            if self.stride is not None or self.dynamic or self.dynamic_stride or self.divisibility:
                raise ArgError(
                    self.name, "", "a ptr argument has no stride or dynamic modes (use kind: tensor)"
                )
        elif self.kind in SCALAR_KINDS:
            if self.dtype is not None or self.align is not None or self.shape is not None:
                raise ArgError(self.name, "", f"a {self.kind} scalar takes no dtype, align or shape")
            if self.intent != "in":
                raise ArgError(self.name, "intent", f"a scalar is always intent 'in' (got {self.intent!r})")
        else:
            kinds = ", ".join((PTR, TENSOR, *SCALAR_KINDS))
            raise ArgError(self.name, "kind", f"must be one of {kinds} (got {self.kind!r})")

    def _validate_memory(self, what: str) -> None:
        """dtype, align and intent of an argument that addresses device memory."""
        if self.dtype is None:
            raise ArgError(self.name, "dtype", f"{what} needs a dtype")
        if self.dtype not in DTYPES:
            raise ArgError(self.name, "dtype", f"{self.dtype!r} is not a dtype; valid: {', '.join(DTYPES)}")
        if self.align is None:
            raise ArgError(self.name, "align", f"{what} needs an align (bytes, a power of two)")
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

    def _validate_tensor(self) -> None:
        if not self.shape:
            raise ArgError(self.name, "shape", "a tensor needs a shape of at least one mode")
        rank = len(self.shape)
        if self.stride is None or len(self.stride) != rank:
            raise ArgError(self.name, "stride", f"needs one entry per mode ({rank})")
        for field in ("dynamic", "dynamic_stride"):
            modes = getattr(self, field)
            if any(not isinstance(m, int) or not 0 <= m < rank for m in modes) or len(set(modes)) != len(
                modes
            ):
                raise ArgError(
                    self.name, field, f"must list distinct modes in 0..{rank - 1} (got {list(modes)})"
                )
        for symbol, value in self.divisibility:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ArgError(self.name, "divisibility", f"{symbol}: must be an int >= 1 (got {value!r})")
        for field in ("shape_bits", "stride_bits"):
            if getattr(self, field) not in INDEX_BITS:
                raise ArgError(self.name, field, f"must be 32 or 64 (got {getattr(self, field)!r})")

    @property
    def is_pointer(self) -> bool:
        return self.kind == PTR

    @property
    def is_tensor(self) -> bool:
        return self.kind == TENSOR

    @property
    def is_scalar(self) -> bool:
        return self.kind in SCALAR_KINDS

    @property
    def addresses_memory(self) -> bool:
        """A pointer or a tensor: something ``checked`` validates as device memory."""
        return self.kind in (PTR, TENSOR)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "kind": self.kind}
        if self.addresses_memory:
            out.update(dtype=self.dtype, align=self.align, intent=self.intent)
            if self.shape is not None:
                out["shape"] = list(self.shape)
        if self.is_tensor:
            out.update(tensor_fields(self))
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Arg:
        shape, stride = data.get("shape"), data.get("stride")
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            dtype=data.get("dtype"),  # type: ignore[arg-type]
            align=data.get("align"),  # type: ignore[arg-type]
            intent=str(data.get("intent", "in")),
            shape=tuple(shape) if shape is not None else None,  # type: ignore[arg-type]
            stride=tuple(stride) if stride is not None else None,  # type: ignore[arg-type]
            dynamic=tuple(data.get("dynamic", ())),  # type: ignore[arg-type]
            dynamic_stride=tuple(data.get("dynamic_stride", ())),  # type: ignore[arg-type]
            divisibility=tuple(dict(data.get("divisibility", {})).items()),  # type: ignore[call-overload]
            shape_bits=int(data.get("shape_bits", 32)),  # type: ignore[call-overload]
            stride_bits=int(data.get("stride_bits", 64)),  # type: ignore[call-overload]
        )
