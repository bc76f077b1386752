"""Signed int4 pairs to packed bf16/fp16 tensor-core operands, exactly.

``0x4300 | (q ^ 8)`` is the bf16 ``136 + q`` (fp16: ``0x6400 | (q ^ 8)`` is ``1032 + q``), so
two nibbles in the low bits of a word's two halves, one ``lop3`` (mask and magic) and one exact
packed subtract give ``(q0, q1)``; one packed multiply by the scale pair then rounds ``q * s``
once to the activation dtype. Two ways to bring the nibbles there:

- :func:`int4_pair`: a byte's two nibbles (k and k + 1), by a ``prmt`` of the word and the word
  shifted right by 4;
- :func:`int4_split_pair`: nibbles ``t`` and ``t + 4`` of a word, by one shift (none for
  ``t == 0``). Cheaper: in ``nk`` rows they are k and k + 4, so the other MMA operand must pair
  its k's the same way; in ``n64k128``'s lane order they are k and k + 1
  (:func:`int4_lane_pair`).
"""

from __future__ import annotations

from cutlass import Int32, Uint32

from .._ptx import asm_u32, prmt

__all__ = [
    "NIBBLES",
    "int4_lane_pair",
    "int4_pair",
    "int4_split_pair",
    "nibble_mask",
    "pair_selector",
    "scale_pair",
    "scaled",
]

NIBBLES = 0x000F000F  # bits 0-3 and 16-19: a nibble in the low bits of each half

# Per activation dtype: magic high half for 128 + u (bf16) / 1024 + u (fp16) with u = q ^ 8,
# the packed pair (1, 1) and the packed pair -(magic + 8), so (x * 1) + bias = q exactly.
_MAGIC = {"bf16": (0x43084308, 0x3F803F80, 0xC308C308), "fp16": (0x64086408, 0x3C003C00, 0xE408E408)}
_FMA = {"bf16": "fma.rn.bf16x2", "fp16": "fma.rn.f16x2"}


def pair_selector(byte):
    """The ``prmt`` selector that puts byte ``byte`` of a word into byte 0, and the same byte of
    the word shifted right by 4 into byte 2 (bytes 1 and 3 are masked off afterwards)."""
    return byte | (byte << 4) | ((byte + 4) << 8) | ((byte + 4) << 12)


def nibble_mask(count: Int32) -> Uint32:
    """:data:`NIBBLES`, computed from ``count``, a kernel argument that is never negative, so
    that ptxas cannot fold it: as a constant it re-materializes the mask before nearly every
    ``lop3`` (57 of a decode k-tile's 415 instructions); as a value it keeps it in one register."""
    return Uint32(NIBBLES) >> (Uint32(count) >> 31)


def scale_pair(scale: Uint32) -> Uint32:
    """A 16-bit scale in both halves of a word, as the packed multiplier."""
    return scale | (scale << 16)


def int4_pair(word: Uint32, selector, element: str, mask: Uint32) -> Uint32:
    """The int4 pair that ``selector`` (:func:`pair_selector`; a constant, or a per-lane register)
    picks from ``word``, as an exact packed operand pair ``(q_low_nibble, q_high_nibble)``.
    ``mask``: :func:`nibble_mask`'s register (here and below)."""
    return _low_nibbles(prmt(word, word >> 4, selector), element, mask)


def int4_split_pair(word: Uint32, t: int, element: str, mask: Uint32) -> Uint32:
    """Nibbles ``t`` and ``t + 4`` of ``word`` (``0 <= t < 4``), as an exact packed operand pair."""
    return _low_nibbles(word >> t * 4 if t else word, element, mask)


def int4_lane_pair(w0: Uint32, w1: Uint32, step: int, half: int, element: str, mask: Uint32) -> Uint32:
    """The pair (k, k + 1) of MMA step ``step`` (0..3 of a 64-wide k-chunk) and k-half ``half``
    from a lane's two words of an ``n64k128`` row chunk (see
    :mod:`b12x_aot.contract.w4a16_layout`): word ``step // 2``, nibbles ``t`` and ``t + 4`` for
    ``t = 2 (step % 2) + half``."""
    return int4_split_pair(w0 if step < 2 else w1, 2 * (step % 2) + half, element, mask)


def _low_nibbles(v: Uint32, element: str, mask: Uint32) -> Uint32:
    """The signed nibbles in bits 0-3 and 16-19 of ``v`` as the exact packed pair ``(q0, q1)``."""
    magic, one, bias = _MAGIC[element]
    v = (v & mask) ^ Uint32(magic)
    return asm_u32(f"{_FMA[element]} $0, $1, $2, $3;", v, Uint32(one), Uint32(bias))


def scaled(q: Uint32, scale2: Uint32, element: str) -> Uint32:
    """``q * scale`` rounded once (``fma`` with ``-0.0``, which keeps the sign of zero)."""
    return asm_u32(f"{_FMA[element]} $0, $1, $2, $3;", q, scale2, Uint32(0x80008000))
