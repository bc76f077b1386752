"""Checked launches: every argument against the variant's ABI and sizes, before anything runs.

``PreparedLaunch.checked`` is generated per variant like the plain call, so its checks are
straight-line code: scalar kinds and ranges, each tensor's type, dtype, device and rank (which
makes its input words readable), the spec's ``launch.requires`` preconditions, then per
pointer its dtype, device, contiguity, size and alignment, per tensor its extents, strides and
alignment (``_tensors``), then the grid. Only a failing check takes the slow path here, which
raises :class:`LaunchArgumentError` naming the argument, what was expected (with the runtime
values substituted) and what came.

Sizes. A pointer argument with a declared ``shape`` accepts

- a tensor whose shape equals it, or has a *larger leading dimension* and the same other
  dimensions (a buffer sized for more rows than this call uses), or is 1-D with at least as
  many elements (a flat buffer);
- a :class:`Buffer` (a raw address with its size in bytes) of at least the bytes needed.

A raw int address has no size, so ``checked`` refuses it for a shaped argument (the plain call
takes it). An argument the spec gives no shape is checked for everything but its size, and
preparing such a launch warns once that ``checked`` cannot bound it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from b12x_aot.contract import DTYPES, SCALAR_KINDS, Arg, Expr, InputWord, TensorMap

from ._codegen import Codegen, word_sources
from ._index import IndexEntry
from ._tensors import TensorChecks
from .errors import LaunchArgumentError

__all__ = [
    "NOT_A_POINTER",
    "Buffer",
    "UncheckedSizeWarning",
    "checked_source",
    "checked_sources",
    "scalar_error",
]

_GRID_LIMITS = ((1 << 31) - 1, 65535, 65535)  # x, y, z: what cuLaunchKernel accepts
_ADDRESS_LIMIT = 1 << 64
_F32_MAX = 3.4028234663852886e38


class Buffer(NamedTuple):
    """A raw device address and how many bytes lie behind it, for checked launches without
    tensors. The plain call takes it too (through ``data_ptr()``)."""

    address: int
    nbytes: int

    def data_ptr(self) -> int:
        return self.address


class UncheckedSizeWarning(UserWarning):
    """A prepared launch has pointer arguments whose spec declares no shape."""


_CHECKED = """\
def checked(self, {params}*extra, stream=None):
    if extra or {last} is MISSING:
        wrong_count(({sig}*extra,))
    try:
{intake}{args}{body}    except ArithmeticError as exc:
        unevaluable(exc, {runtime})
"""


def checked_sources(words: Sequence[InputWord]) -> dict[str, str]:
    """Where ``checked`` reads each input word once validated: a pointer's address as
    ``p{i}``, a tensor's as ``q{i}``, its extents and strides from ``s{i}``/``d{i}``."""
    return word_sources(words, "p{i}", "q{i}")


def checked_source(
    entry: IndexEntry, cg: Codegen, device: int, slots: Sequence[Expr | TensorMap]
) -> tuple[str, str, list[str]]:
    """The source of ``checked`` for this variant up to its launch, the parameter words to
    pack and the grid dimensions it checked (for the launch line); binds what it needs into
    ``cg.env``."""
    diag = _Diagnostics(entry, device, [w.name for w in cg.words if w.part in ("value", "shape", "stride")])
    tensors = TensorChecks(entry, cg, device)
    cg.env.update(
        MISSING=_MISSING,
        wrong_count=diag.wrong_count,
        unevaluable=diag.unevaluable,
        bad_address=diag.bad_address,
        Buffer=Buffer,
        DT=diag.torch_dtypes,
        bad_scalar=diag.bad_scalar,
        unmet=diag.unmet,
        raw_address=diag.raw_address,
        buffer_size=diag.buffer_size,
        bad_dtype=diag.bad_dtype,
        bad_device=diag.bad_device,
        not_contiguous=diag.not_contiguous,
        not_a_pointer=diag.not_a_pointer,
        shape_rule=diag.shape_rule,
        misaligned=diag.misaligned,
        bad_grid=diag.bad_grid,
    )
    intake: list[str] = []  # what makes every input word readable
    for i, arg in enumerate(entry.args):
        if arg.is_scalar:
            intake.append(_scalar(i, arg))
    body: list[str] = []
    for i, arg in enumerate(entry.args):
        if arg.is_pointer:
            intake.append(_pointer_intake(i, device))
            body.append(_pointer(i, arg, cg))
        elif arg.is_tensor:
            intake.append(tensors.intake(i, arg))
            body.append(tensors.modes(i, arg))
    runtime = diag.runtime_sources(cg)
    requires = [
        f"    if not ({cg.value(expr)}):\n        unmet({j}, {runtime})\n"
        for j, expr in enumerate(entry.geometry.requires)
    ]
    body = requires + body  # in the spec's order, before the sizes they guard
    dims = [cg.value(e) for e in entry.geometry.grid]
    packed = ", ".join(cg.slot(s, i) for i, s in enumerate(slots))
    # A literal in range needs no check per call; anything else (a negative literal too) gets one.
    bounds = [
        f"0 <= {d} <= {limit}"
        for d, limit in zip(dims, _GRID_LIMITS, strict=True)
        if not (d.isdigit() and int(d) <= limit)
    ]
    if bounds:
        body.append(f"    if not ({' and '.join(bounds)}):\n        bad_grid(({', '.join(dims)}))\n")
    source = _CHECKED.format(
        params="".join(f"{n}=MISSING, " for n in cg.names),
        last=cg.names[-1] if cg.names else "None",
        sig=cg.signature,
        runtime=runtime,
        intake=_indent("".join(intake)),
        args=_indent(cg.args_line),
        body=_indent("".join(body)) or "        pass\n",
    )
    return source, packed, dims


def _indent(lines: str) -> str:
    """``lines`` one level deeper (the checks run inside a ``try``)."""
    return "".join(f"    {line}\n" for line in lines.splitlines())


def _scalar(i: int, arg: Arg) -> str:
    kind = SCALAR_KINDS[arg.kind]
    if kind.name == "f32":  # finite and in range: struct would refuse the rest at packing
        test = f"a{i}.__class__ not in (float, int) or not -{_F32_MAX!r} <= a{i} <= {_F32_MAX!r}"
    elif kind.lo is None:
        test = f"a{i}.__class__ is not float and a{i}.__class__ is not int"
    else:
        test = f"a{i}.__class__ is not int or not {kind.lo} <= a{i} <= {kind.hi}"
    return f"    if {test}:\n        bad_scalar({i}, a{i})\n"


def _pointer_intake(i: int, device: int) -> str:
    """The pointer's address as ``p{i}``, from an int, a :class:`Buffer` or a tensor (whose
    dtype, device and contiguity are checked here)."""
    n = f"a{i}"
    return (
        "\n".join(
            [
                f"    if {n}.__class__ is int or {n}.__class__ is Buffer:",
                f"        p{i} = {n} if {n}.__class__ is int else {n}.address",
                f"        if not 0 <= p{i} < {_ADDRESS_LIMIT}:",
                f"            bad_address({i}, p{i})",
                "    else:",
                "        try:",
                f"            if {n}.dtype is not DT[{i}]:",
                f"                bad_dtype({i}, {n})",
                f"            if {n}.get_device() != {device}:",
                f"                bad_device({i}, {n})",
                f"            if not {n}.is_contiguous():",
                f"                not_contiguous({i}, {n})",
                f"            p{i} = {n}.data_ptr()",
                "        except AttributeError:",
                f"            not_a_pointer({i}, {n})",
            ]
        )
        + "\n"
    )


def _pointer(i: int, arg: Arg, cg: Codegen) -> str:
    """The pointer's size against its declared shape, and its alignment."""
    n = f"a{i}"
    lines = []
    if arg.shape is not None:
        shape = cg.values(tuple(Expr.parse(d) for d in arg.shape))
        lines += [
            f"    if {n}.__class__ is int:",
            f"        raw_address({i})",
            f"    elif {n}.__class__ is Buffer:",
            f"        buffer_size({i}, {n}, {shape})",
            f"    elif {n}.shape != {shape}:",
            f"        shape_rule({i}, {n}, {shape})",
        ]
    lines += [f"    if p{i} % {arg.align}:", f"        misaligned({i}, p{i})"]
    return "\n".join(lines) + "\n"


NOT_A_POINTER = "must be a device pointer (int), a Buffer or a tensor"


def scalar_error(kernel: str, arg: Arg, value: Any) -> LaunchArgumentError | None:
    """Why ``value`` cannot be scalar argument ``arg``, or None when it can."""
    kind = SCALAR_KINDS[arg.kind]
    if kind.lo is None:
        if value.__class__ not in (int, float):
            return LaunchArgumentError(kernel, arg.name, f"must be a number ({kind.name})", repr(value))
        if kind.name == "f32" and not -_F32_MAX <= value <= _F32_MAX:
            return LaunchArgumentError(kernel, arg.name, "must be a finite number in f32 range", repr(value))
        return None
    if value.__class__ is not int:
        return LaunchArgumentError(kernel, arg.name, f"must be an int ({kind.name})", repr(value))
    if not kind.lo <= value <= kind.hi:  # type: ignore[operator]
        return LaunchArgumentError(
            kernel, arg.name, f"must be in [{kind.lo}, {kind.hi}] ({kind.name})", value
        )
    return None


class _Missing:
    """The default of every generated ``checked`` parameter: an argument not passed."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


class _Diagnostics:
    """The slow path of ``checked``: says exactly what is wrong, or lets an allowed case pass."""

    __slots__ = ("args", "device", "name", "requires", "runtime", "torch_dtypes")

    def __init__(self, entry: IndexEntry, device: int, runtime: list[str]) -> None:
        self.name = entry.label
        self.args = entry.args
        self.requires = entry.geometry.requires
        self.device = device
        self.runtime = runtime  # the runtime values an error message substitutes, in order
        self.torch_dtypes: list[Any] = [None] * len(self.args)
        self._load_torch_dtypes()

    def _load_torch_dtypes(self) -> bool:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        for i, arg in enumerate(self.args):
            if arg.addresses_memory:
                self.torch_dtypes[i] = getattr(torch, DTYPES[arg.dtype].torch_name, None)  # type: ignore[index]
        return True

    def wrong_count(self, values: Sequence[Any]) -> None:
        given = sum(v is not _MISSING for v in values)
        names = ", ".join(a.name for a in self.args)
        raise LaunchArgumentError(self.name, "*", f"count is wrong; expected ({names})", given)

    def _error(self, i: int, problem: str, got: object) -> LaunchArgumentError:
        return LaunchArgumentError(self.name, self.args[i].name, problem, got)

    def runtime_sources(self, cg: Codegen) -> str:
        """A tuple display of the runtime values, in :attr:`runtime`'s order, for messages
        (read once every input word is bound, after the intake)."""
        return "(" + "".join(f"{cg.sources[n]}, " for n in self.runtime) + ")"

    def _scalars(self, values: Sequence[Any]) -> str:
        return ", ".join(f"{name}={value}" for name, value in zip(self.runtime, values, strict=True))

    def bad_scalar(self, i: int, value: Any) -> None:
        error = scalar_error(self.name, self.args[i], value)
        if error is not None:
            raise error

    def unmet(self, j: int, values: Sequence[Any]) -> None:
        expr = self.requires[j]
        raise LaunchArgumentError(
            self.name, "*", f"break the launch requirement {expr.source!r}", self._scalars(values)
        )

    def unevaluable(self, exc: ArithmeticError, values: Sequence[Any]) -> None:
        raise LaunchArgumentError(
            self.name,
            "*",
            f"give a shape, grid or requirement that cannot be evaluated ({exc})",
            self._scalars(values),
        ) from None

    def bad_address(self, i: int, address: int) -> None:
        raise self._error(i, "must be an address in [0, 2**64)", address)

    def raw_address(self, i: int) -> None:
        raise self._error(
            i,
            "is a raw address, whose size checked() cannot know: pass a tensor or "
            "Buffer(address, nbytes), or use the plain call",
            "int",
        )

    def buffer_size(self, i: int, buffer: Buffer, shape: tuple[int, ...]) -> None:
        self._no_negative(i, shape)
        need = math.prod(shape) * DTYPES[self.args[i].dtype].itemsize  # type: ignore[index]
        if buffer.nbytes < need:
            raise self._error(i, f"needs {need} bytes for shape {shape}", f"Buffer of {buffer.nbytes} bytes")

    def bad_dtype(self, i: int, value: Any) -> None:
        if self.torch_dtypes[i] is None and self._load_torch_dtypes() and value.dtype is self.torch_dtypes[i]:
            return  # torch was imported after this launch was prepared
        raise self._error(i, f"must have dtype {self.torch_dtypes[i] or self.args[i].dtype}", value.dtype)

    def bad_device(self, i: int, value: Any) -> None:
        raise self._error(i, f"must be on cuda:{self.device}", getattr(value, "device", value.get_device()))

    def not_contiguous(self, i: int, value: Any) -> None:
        raise self._error(i, "must be contiguous", f"strides {tuple(value.stride())}")

    def not_a_pointer(self, i: int, value: Any) -> None:
        raise self._error(i, NOT_A_POINTER, type(value).__name__)

    def shape_rule(self, i: int, value: Any, shape: tuple[int, ...]) -> None:
        """Let a larger leading dimension or a large enough flat tensor pass; else raise."""
        self._no_negative(i, shape)
        got = tuple(value.shape)
        if len(got) == len(shape) and got[1:] == shape[1:] and got[0] >= shape[0]:
            return
        if len(got) == 1 and got[0] >= math.prod(shape):
            return
        raise self._error(
            i,
            f"must have shape {shape} (a larger leading dimension, or a flat tensor of at least "
            f"{math.prod(shape)} elements, also fits)",
            f"shape {got}",
        )

    def _no_negative(self, i: int, shape: tuple[int, ...]) -> None:
        if any(d < 0 for d in shape):
            raise self._error(i, "has a shape with a negative dimension for these scalars", shape)

    def misaligned(self, i: int, address: int) -> None:
        raise self._error(i, f"must be {self.args[i].align}-byte aligned", hex(address))

    def bad_grid(self, grid: tuple[int, ...]) -> None:
        raise LaunchArgumentError(
            self.name, "grid", f"must be non-negative ints up to {_GRID_LIMITS} (x, y, z)", grid
        )
