"""Signed int4 pairs to packed bf16/fp16 tensor-core operands, exactly.

``0x4300 | (q ^ 8)`` is the bf16 ``136 + q`` (fp16: ``0x6400 | (q ^ 8)`` is ``1032 + q``), so a
``prmt`` that places two nibbles in the low bits of the two halves, one ``lop3`` (mask and
magic), and one exact packed subtract give ``(q0, q1)``; one packed multiply by the scale pair
then rounds ``q * s`` once to the activation dtype.
"""

from __future__ import annotations

from cutlass import Uint32

from ._ptx import asm_u32

__all__ = ["int4_pair", "scaled"]

# Per activation dtype: magic high half for 128 + u (bf16) / 1024 + u (fp16) with u = q ^ 8,
# the packed pair (1, 1) and the packed pair -(magic + 8), so (x * 1) + bias = q exactly.
_MAGIC = {"bf16": (0x43084308, 0x3F803F80, 0xC308C308), "fp16": (0x64086408, 0x3C003C00, 0xE408E408)}
_FMA = {"bf16": "fma.rn.bf16x2", "fp16": "fma.rn.f16x2"}
DTYPES = tuple(_MAGIC)


def int4_pair(word: Uint32, selector, element: str) -> Uint32:
    """The int4 pair of byte ``selector`` picks from ``word`` (a constant, or a per-lane
    register), as an exact packed operand pair ``(q_low_nibble, q_high_nibble)``."""
    magic, one, bias = _MAGIC[element]
    if isinstance(selector, int):
        picked = asm_u32(f"prmt.b32 $0, $1, $2, {selector};", word, word >> 4)
    else:
        picked = asm_u32("prmt.b32 $0, $1, $2, $3;", word, word >> 4, selector)
    v = (picked & Uint32(0x000F000F)) ^ Uint32(magic)
    return asm_u32(f"{_FMA[element]} $0, $1, $2, $3;", v, Uint32(one), Uint32(bias))


def scaled(q: Uint32, scale2: Uint32, element: str) -> Uint32:
    """``q * scale`` rounded once (``fma`` with ``-0.0``, which keeps the sign of zero)."""
    return asm_u32(f"{_FMA[element]} $0, $1, $2, $3;", q, scale2, Uint32(0x80008000))
