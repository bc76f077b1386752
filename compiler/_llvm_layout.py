"""Byte layouts of LLVM dialect types, as the DSL's host code passes them to a kernel.

A kernel parameter is one LLVM value: a pointer, an integer, a float, or a struct of those (a
``cute.Tensor`` is ``struct<(ptr<1>, struct<(struct<(i32, i32)>, i64)>)>``: its pointer, then
its dynamic shape and stride values). The driver copies each parameter into the kernel's
parameter bank at its natural C alignment, so a type's layout is the C layout of the
equivalent struct: every leaf at the next multiple of its own alignment, a struct aligned to
its widest member and padded to a multiple of it, an array its elements back to back (a TMA
descriptor is ``struct<(struct<(array<16 x i64>)>)>``). Packed structs are not parameter shapes
the DSL produces; they are refused, never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ContractError

__all__ = ["Leaf", "TypeLayout", "type_layout"]

_TOKEN = re.compile(r"\s*(!llvm\.|struct<\(|\)>|array<\d+ x|>|ptr<\d+>|ptr|[a-z]+\d*|,)")


@dataclass(frozen=True, slots=True)
class Leaf:
    """One scalar slot of a type: where ``insertvalue`` finds it (``path``) and where its bytes go."""

    path: tuple[int, ...]
    offset: int
    kind: str  # "int", "float" or "ptr"
    bits: int

    @property
    def size(self) -> int:
        return max(self.bits // 8, 1)  # an i1 takes a byte


@dataclass(frozen=True, slots=True)
class TypeLayout:
    size: int
    align: int
    leaves: tuple[Leaf, ...]


_SCALARS = {
    "i1": ("int", 1),
    "i8": ("int", 8),
    "i16": ("int", 16),
    "i32": ("int", 32),
    "i64": ("int", 64),
    "f16": ("float", 16),
    "f32": ("float", 32),
    "f64": ("float", 64),
}


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ContractError(f"cannot read the LLVM type {text!r} (at {text[pos : pos + 20]!r})")
        token = m.group(1)
        if token != "!llvm.":
            out.append(token)
        pos = m.end()
    return out


def type_layout(text: str) -> TypeLayout:
    """The C layout of an LLVM dialect type written as MLIR prints it. Raises
    :class:`ContractError` for a type no kernel parameter of this kind should have."""
    tokens = _tokens(text)
    layout, rest = _parse(tokens, 0, ())
    if rest != len(tokens):
        raise ContractError(f"cannot read the LLVM type {text!r}: trailing {tokens[rest:]}")
    return layout


def _parse(tokens: list[str], i: int, path: tuple[int, ...]) -> tuple[TypeLayout, int]:
    token = tokens[i] if i < len(tokens) else ""
    if token.startswith("ptr"):
        return TypeLayout(8, 8, (Leaf(path, 0, "ptr", 64),)), i + 1
    if token in _SCALARS:
        kind, bits = _SCALARS[token]
        size = max(bits // 8, 1)
        return TypeLayout(size, size, (Leaf(path, 0, kind, bits),)), i + 1
    if token == "struct<(":
        i += 1
        offset, align, leaves, index = 0, 1, [], 0
        while tokens[i] != ")>":
            member, i = _parse(tokens, i, (*path, index))
            offset = -(-offset // member.align) * member.align
            leaves += [Leaf(lf.path, lf.offset + offset, lf.kind, lf.bits) for lf in member.leaves]
            offset += member.size
            align = max(align, member.align)
            index += 1
            if tokens[i] == ",":
                i += 1
        size = -(-offset // align) * align
        return TypeLayout(size, align, tuple(leaves)), i + 1
    if token.startswith("array<"):
        count = int(token[len("array<") : -len(" x")])
        element, end = _parse(tokens, i + 1, ())
        if end >= len(tokens) or tokens[end] != ">":
            raise ContractError(f"cannot read the LLVM type {' '.join(tokens)!r}: an array without its '>'")
        stride = -(-element.size // element.align) * element.align
        leaves = tuple(
            Leaf((*path, k, *lf.path), lf.offset + k * stride, lf.kind, lf.bits)
            for k in range(count)
            for lf in element.leaves
        )
        return TypeLayout(stride * count, element.align, leaves), end + 1
    raise ContractError(f"kernel parameters of LLVM type {token!r} are not supported (in {' '.join(tokens)})")
