"""Exact torch references shared by the kernel tests."""

from __future__ import annotations

import torch


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``fma(a, b, c)`` in fp32, correctly rounded, for fp32-representable inputs.

    ``a * b`` is exact in fp64 (24 + 24 <= 53 bits). The sum is made exact-or-odd in fp64
    (TwoSum, then round-to-odd), and rounding that to fp32 is then the correctly rounded
    fused result: round-to-odd with 53 >= 24 + 2 bits never double-rounds.
    """
    p = a.double() * b.double()
    c64 = c.double()
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    inexact = err != 0
    toward_zero = inexact & ((err < 0) != (s < 0))
    t = torch.where(toward_zero, torch.nextafter(s, torch.zeros_like(s)), s)
    bits = t.view(torch.int64)
    bits = torch.where(inexact, bits | 1, bits)
    return bits.view(torch.float64).float()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included), for tensors of one dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def one_rounding_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether outputs of two fp32 sums of the same products in different orders agree: at most
    one step of their dtype apart (``eps * |b|``), plus 1e-3 of ``b``'s largest magnitude where
    the sums cancel. A wrong operand order misses this by orders of magnitude."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x, y = a.double(), b.double()
    bound = torch.finfo(b.dtype).eps * y.abs() + 1e-3 * y.abs().max()
    return bool(((x - y).abs() <= bound).all())


TORCH_DTYPES = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}
