"""What a launch's parameter buffer is made of: input words, and kernel parameters built of them.

A call's arguments give the loader its *input words*: a pointer's address, a scalar's value,
and for a tensor its data pointer, then the extent of each dynamic mode and the stride of each
dynamic stride mode. Expressions (grids, shapes, the words below) name them: an argument by
its name, a tensor mode by the symbol it binds (``shape: [m, k]`` makes ``m`` and ``k``) or
else ``{arg}__shape{i}`` / ``{arg}__stride{i}``.

The kernel's own parameters are what the compiled host function passes to the kernel, read
from its IR by the compiler: each a C struct of *words* at fixed offsets, each word an
expression over the input words, or a TMA tensor map (``_tensor_maps``), encoded per call. A kernel that takes its arguments as given (every bundled
family, and a ``cute.Tensor`` passed on unchanged) has the :func:`default_params`; anything
else (a tiled view of a tensor, with derived extents and strides) is recorded per variant.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ._abi import SCALAR_KINDS, Arg
from ._tensor_maps import MAP_ALIGN, MAP_BYTES, TensorMap

__all__ = [
    "PARAM_BANK_PHASE",
    "InputWord",
    "KernelParam",
    "ParamLayout",
    "Word",
    "default_params",
    "input_words",
    "params_from_json",
    "params_to_json",
    "symbol_bindings",
]


class InputWord(NamedTuple):
    """One value a call's arguments supply."""

    name: str  # how expressions read it
    arg: int  # the argument's position
    part: str  # "value" (a scalar), "address" (a pointer's), "data" (a tensor's pointer), "shape", "stride"
    mode: int  # the tensor mode of a shape or stride word
    code: str  # its struct code (width and signedness)
    nonneg: bool  # known >= 0: addresses, extents, strides, unsigned scalars


def _index_code(bits: int) -> str:
    return "i" if bits == 32 else "q"


def _bare(entry: str) -> str | None:
    entry = entry.strip()
    return entry if entry.isidentifier() else None


def input_words(args: Sequence[Arg], params: Mapping[str, Any]) -> tuple[InputWord, ...]:
    """Every input word of ``args``, argument by argument, in the order a kernel parameter of
    the default layout holds them."""
    names = {a.name for a in args}  # an entry naming an argument is never a symbol (specs refuse it)
    bound: set[str] = set()
    out: list[InputWord] = []
    for i, arg in enumerate(args):
        if arg.is_scalar:
            kind = SCALAR_KINDS[arg.kind]
            out.append(InputWord(arg.name, i, "value", 0, kind.code, kind.lo == 0))
            continue
        if arg.is_pointer:
            out.append(InputWord(arg.name, i, "address", 0, "Q", True))
            continue
        out.append(InputWord(arg.name, i, "data", 0, "Q", True))
        for part, entries, modes, bits in (
            ("shape", arg.shape or (), arg.dynamic, arg.shape_bits),
            ("stride", arg.stride or (), arg.dynamic_stride, arg.stride_bits),
        ):
            for mode in sorted(modes):
                name = _bare(entries[mode])
                if name is None or name in params or name in names or name in bound:
                    name = f"{arg.name}__{part}{mode}"
                else:
                    bound.add(name)
                out.append(InputWord(name, i, part, mode, _index_code(bits), True))
    return tuple(out)


def symbol_bindings(args: Sequence[Arg], params: Mapping[str, Any]) -> dict[str, InputWord]:
    """Each symbol (a bare name in a tensor's shape or stride that is neither a param nor a
    scalar argument) and the input word it is bound to: its first appearance."""
    return {
        w.name: w for w in input_words(args, params) if w.part in ("shape", "stride") and "__" not in w.name
    }


class Word(NamedTuple):
    """One scalar slot of the parameter buffer: its offset, struct code and value."""

    offset: int  # bytes from the start of its kernel parameter
    code: str
    expr: str  # an expression over the input words and the params


class KernelParam(NamedTuple):
    """One parameter of the kernel: a C struct (or a single word) of ``size`` bytes, or a
    tensor map (no words: its 128 bytes are encoded per call)."""

    size: int
    align: int
    words: tuple[Word, ...]
    tmap: TensorMap | None = None

    @classmethod
    def of_map(cls, tmap: TensorMap) -> KernelParam:
        return cls(MAP_BYTES, MAP_ALIGN, (), tmap)

    def to_json(self) -> list[Any]:
        out = [self.size, self.align, [list(w) for w in self.words]]
        return out if self.tmap is None else [*out, self.tmap.to_json()]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> KernelParam:
        size, align, words = data[:3]
        tmap = TensorMap.from_json(data[3]) if len(data) > 3 else None
        return cls(int(size), int(align), tuple(Word(int(o), str(c), str(e)) for o, c, e in words), tmap)


def params_to_json(params: Iterable[KernelParam]) -> list[Any]:
    return [p.to_json() for p in params]


def params_from_json(data: Sequence[Any]) -> tuple[KernelParam, ...]:
    return tuple(KernelParam.from_json(p) for p in data)


def default_params(args: Sequence[Arg], params: Mapping[str, Any]) -> tuple[KernelParam, ...]:
    """The kernel parameters of a kernel that takes each argument as it is: one per argument,
    a pointer or scalar as its word, a tensor as its pointer then its dynamic words (the DSL's
    layout of a ``cute.Tensor`` parameter)."""
    words = input_words(args, params)
    out: list[KernelParam] = []
    for i in range(len(args)):
        own = [w for w in words if w.arg == i]
        offset, align, slots = 0, 1, []
        for w in own:
            size = struct.calcsize(w.code)
            offset = -(-offset // size) * size
            slots.append(Word(offset, w.code, w.name))
            offset += size
            align = max(align, size)
        out.append(KernelParam(-(-offset // align) * align, align, tuple(slots)))
    return tuple(out)


# Where each arch's kernel parameter bank starts, past a 64-byte boundary: a 64-byte aligned
# parameter (a tensor map) sits at a bank address that is a multiple of 64, so its offset in the
# cubin's table is one less this phase (read off the tables of sm_90a, sm_100a, sm_120a cubins).
PARAM_BANK_PHASE = {"sm_90a": 16, "sm_100a": 0, "sm_120a": 0}


class ParamLayout(NamedTuple):
    """The C struct that a kernel's parameters form: each at the next multiple of its alignment
    in the arch's parameter bank.

    ``offsets[i]`` and ``sizes[i]`` are what the cubin's ``EIATTR_KPARAM_INFO`` must report
    for ordinal ``i``; ``fmt`` packs every word of the buffer, in order, with ``struct.pack_into``
    (a tensor map as its 128 bytes).
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    size: int
    fmt: str

    @classmethod
    def of(cls, params: Iterable[KernelParam], arch: str | None = None) -> ParamLayout:
        phase = PARAM_BANK_PHASE.get(arch or "", 0)
        offsets: list[int] = []
        sizes: list[int] = []
        fmt = ["<"]
        cursor = 0
        for param in params:
            start = -(-(cursor + phase) // param.align) * param.align - phase
            offsets.append(start)
            sizes.append(param.size)
            if param.tmap is not None:
                if start > cursor:
                    fmt.append(f"{start - cursor}x")
                fmt.append(f"{param.size}s")
                cursor = start + param.size
                continue
            for word in sorted(param.words):
                at = start + word.offset
                if at < cursor:
                    raise ValueError(f"parameter words overlap at byte {at}")
                if at > cursor:
                    fmt.append(f"{at - cursor}x")
                fmt.append(word.code)
                cursor = at + struct.calcsize("<" + word.code)
            end = start + param.size
            if cursor > end:
                raise ValueError(f"a parameter's words run past its {param.size} bytes")
            if end > cursor:
                fmt.append(f"{end - cursor}x")
            cursor = end
        layout = cls(tuple(offsets), tuple(sizes), cursor, "".join(fmt))
        if struct.calcsize(layout.fmt) != cursor:  # guards the arithmetic above
            raise AssertionError(f"parameter layout {layout.fmt!r} does not span {cursor} bytes")
        return layout

    @staticmethod
    def slots(params: Iterable[KernelParam]) -> list[str | TensorMap]:
        """What ``fmt`` packs, in order: each word's expression, each tensor map's recipe."""
        return [
            s
            for p in params
            for s in ((p.tmap,) if p.tmap is not None else (w.expr for w in sorted(p.words)))
        ]
