"""Tensor arguments at launch: a torch-free view, and what ``checked`` verifies of a tensor.

A tensor argument is a torch tensor or a :class:`TensorView` (an address with its shape and
strides, in elements). ``checked`` takes its pointer, shape and strides once (the intake),
then holds each mode to the spec: a static extent or stride must be the compiled one, an
entry that is an expression (or a symbol bound elsewhere) must equal its value, a symbol's
binding must fit its word and be a multiple of its declared divisibility; the pointer must be
aligned. A stride is not held to the spec where the mode's extent is at most 1: no element is
addressed through it. Every refusal names the argument and the mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from b12x_aot.contract import Expr, symbol_bindings

from ._codegen import Codegen
from ._index import IndexEntry
from .errors import LaunchArgumentError

__all__ = ["NOT_A_TENSOR", "TensorChecks", "TensorView", "is_tensor_like"]

NOT_A_TENSOR = "must be a tensor (torch) or a TensorView(address, shape, strides)"
_ADDRESS_LIMIT = 1 << 64


class TensorView(NamedTuple):
    """A tensor without torch: its device address, and its shape and strides in elements."""

    address: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def data_ptr(self) -> int:
        return self.address

    def stride(self, dim: int | None = None) -> Any:
        """All strides, or one (torch's ``Tensor.stride`` signature)."""
        return self.strides if dim is None else self.strides[dim]


def is_tensor_like(value: Any) -> bool:
    return all(hasattr(value, name) for name in ("data_ptr", "shape", "stride"))


def _limit(bits: int) -> int:
    return (1 << (bits - 1)) - 1


class TensorChecks:
    """Generates the tensor parts of one variant's ``checked`` and binds their slow paths."""

    def __init__(self, entry: IndexEntry, cg: Codegen, device: int) -> None:
        self.entry = entry
        self.cg = cg
        self.device = device
        self.symbols = symbol_bindings(entry.args, entry.params)
        self.words = {(w.arg, w.part, w.mode): w for w in cg.words}
        diag = _TensorDiagnostics(entry)
        cg.env.update(
            TensorView=TensorView,
            not_a_tensor=diag.not_a_tensor,
            bad_rank=diag.bad_rank,
            bad_entry=diag.bad_entry,
            bad_word=diag.bad_word,
            indivisible=diag.indivisible,
        )

    def intake(self, i: int, arg: Any) -> str:
        """``q{i}`` (the address), ``s{i}`` and ``d{i}`` (shape and strides), of the right rank."""
        n, rank = f"a{i}", len(arg.shape)
        return (
            "\n".join(
                [
                    f"    if {n}.__class__ is TensorView:",
                    f"        q{i} = {n}.address",
                    "    else:",
                    "        try:",
                    f"            if {n}.dtype is not DT[{i}]:",
                    f"                bad_dtype({i}, {n})",
                    f"            if {n}.get_device() != {self.device}:",
                    f"                bad_device({i}, {n})",
                    f"            q{i} = {n}.data_ptr()",
                    "        except AttributeError:",
                    f"            not_a_tensor({i}, {n})",
                    f"    if not 0 <= q{i} < {_ADDRESS_LIMIT}:",
                    f"        bad_address({i}, q{i})",
                    f"    s{i} = tuple({n}.shape)",
                    f"    d{i} = tuple({n}.stride())",
                    f"    if len(s{i}) != {rank} or len(d{i}) != {rank}:",
                    f"        bad_rank({i}, s{i}, d{i})",
                ]
            )
            + "\n"
        )

    def modes(self, i: int, arg: Any) -> str:
        """Every mode's extent and stride against the spec, then the alignment."""
        lines: list[str] = []
        divisibility = dict(arg.divisibility)
        for part, entries, bits in (
            ("shape", arg.shape, arg.shape_bits),
            ("stride", arg.stride, arg.stride_bits),
        ):
            held = "s" if part == "shape" else "d"
            for mode, entry in enumerate(entries):
                got = f"{held}{i}[{mode}]"
                word = self.words.get((i, part, mode))
                if word is not None:  # a runtime word: it must fit its width, and not be negative
                    lines += [
                        f"    if not 0 <= {got} <= {_limit(bits)}:",
                        f"        bad_word({i}, {part!r}, {mode}, {got})",
                    ]
                if word is not None and word.name == entry.strip():
                    if word.name in divisibility:  # a symbol bound here (or a free stride)
                        by = divisibility[word.name]
                        lines += [
                            f"    if {got} % {by}:",
                            f"        indivisible({i}, {part!r}, {mode}, {got}, {by})",
                        ]
                    continue
                want = self.cg.value(Expr.parse(entry))
                test = f"{got} != {want}" if part == "shape" else f"{got} != {want} and s{i}[{mode}] > 1"
                lines += [f"    if {test}:", f"        bad_entry({i}, {part!r}, {mode}, {got}, {want})"]
        lines += [f"    if q{i} % {arg.align}:", f"        misaligned({i}, q{i})"]
        return "\n".join(lines) + "\n"


class _TensorDiagnostics:
    """The slow path of the tensor checks: the error for what failed."""

    __slots__ = ("args", "name")

    def __init__(self, entry: IndexEntry) -> None:
        self.name = entry.label
        self.args = entry.args

    def _error(self, i: int, problem: str, got: object) -> LaunchArgumentError:
        return LaunchArgumentError(self.name, self.args[i].name, problem, got)

    def not_a_tensor(self, i: int, value: Any) -> None:
        raise self._error(i, NOT_A_TENSOR, type(value).__name__)

    def bad_rank(self, i: int, shape: Sequence[int], strides: Sequence[int]) -> None:
        rank = len(self.args[i].shape or ())
        raise self._error(
            i,
            f"must have {rank} modes (shape {list(self.args[i].shape or ())})",
            f"shape {tuple(shape)}, strides {tuple(strides)}",
        )

    def bad_entry(self, i: int, part: str, mode: int, got: int, want: int) -> None:
        arg = self.args[i]
        entry = (arg.shape if part == "shape" else arg.stride)[mode]  # type: ignore[index]
        what = "extent" if part == "shape" else "stride"
        source = "" if entry.strip() == str(want) else f" (the spec's {entry!r})"
        raise self._error(i, f"mode {mode} must have {what} {want}{source}", f"{what} {got}")

    def bad_word(self, i: int, part: str, mode: int, got: int) -> None:
        arg = self.args[i]
        bits = arg.shape_bits if part == "shape" else arg.stride_bits
        what = "extent" if part == "shape" else "stride"
        raise self._error(i, f"mode {mode} {what} must be in [0, {_limit(bits)}] (its {bits}-bit word)", got)

    def indivisible(self, i: int, part: str, mode: int, got: int, by: int) -> None:
        arg = self.args[i]
        entry = (arg.shape if part == "shape" else arg.stride)[mode]  # type: ignore[index]
        what = "extent" if part == "shape" else "stride"
        raise self._error(
            i, f"mode {mode} {what} {entry!r} must be a multiple of {by} (its divisibility)", got
        )
