"""The quant.mxfp8 reference must itself be right: hand-computed cases and exact rationals (CPU)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")

from .mxfp8_reference import (  # noqa: E402
    BLOCK,
    NAN,
    NEG_NAN,
    adversarial_input,
    from_values,
    quantize_mxfp8,
    random_input,
    scale_exponents,
    special_blocks,
)

INF = float("inf")
DTYPES = (torch.bfloat16, torch.float16)


def _quantize_block(values: list, dtype: torch.dtype, rounding: str) -> tuple[list[int], int]:
    """q bytes and the scale byte of one block (padded with zeros to 32)."""
    x = from_values([values + [0.0] * (BLOCK - len(values))], dtype)
    q, s = quantize_mxfp8(x, rounding)
    return q.view(torch.uint8)[0, : len(values)].tolist(), int(s[0, 0])


# --- hand-computed cases -----------------------------------------------------------------
# E4M3: sign | 4 exponent bits (bias 7) | 3 mantissa bits; 1.0 = 0x38, 256 = 0x78, 448 = 0x7E.


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_zero_block_stores_scale_byte_zero(dtype, rounding) -> None:
    q, s = _quantize_block([0.0, -0.0, 0.0], dtype, rounding)
    assert s == 0  # e = -127
    assert q == [0x00, 0x80, 0x00]  # signed zeros stay signed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_ties_round_to_even(dtype, rounding) -> None:
    # amax 256 = 2**8: e = 0 in both modes, so the values are quantized as they are.
    values = [256.0, 1.0625, 1.1875, 17.0, 19.0, -1.0625, 2.0**-10, 3 * 2.0**-10, 5 * 2.0**-10]
    q, s = _quantize_block(values, dtype, rounding)
    assert s == 127
    # 1.0625: 1.0|1.125 -> 1.0; 1.1875: 1.125|1.25 -> 1.25; 17: 16|18 -> 16; 19: 18|20 -> 20;
    # 2^-10: 0|2^-9 -> 0; 3*2^-10: 2^-9|2^-8 -> 2^-8 (0x02); 5*2^-10: 2*2^-9|3*2^-9 -> 0x02.
    assert q == [0x78, 0x38, 0x3A, 0x58, 0x5A, 0xB8, 0x00, 0x02, 0x02]


@pytest.mark.parametrize("dtype", DTYPES)
def test_saturation_at_448(dtype) -> None:
    # amax 480 = 1.875 * 2**8. floor: e = 0, 480 and 464 saturate to 448, 456 rounds to 448.
    q, s = _quantize_block([480.0, -464.0, 456.0, 448.0, 432.0], dtype, "floor")
    assert s == 127
    assert q == [0x7E, 0xFE, 0x7E, 0x7E, 0x7E]  # 432 lies between 416 and 448: a tie, to even 448
    # ceil: m = 1.875 > 1.75, so e = 1 and nothing saturates: 480 / 2 = 240 = 0x77.
    q, s = _quantize_block([480.0, -464.0, 448.0], dtype, "ceil")
    assert s == 128
    assert q == [0x77, 0xF6, 0x76]  # -232 lies between -224 and -240: a tie, to even -224


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_inf_saturates_and_does_not_count_in_amax(dtype, rounding) -> None:
    q, s = _quantize_block([INF, -INF, 1.0, -0.5], dtype, rounding)
    assert s == 127 - 8  # amax 1.0 over the finite elements
    assert q == [0x7E, 0xFE, 0x78, 0xF0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_nan_keeps_its_sign_and_does_not_count_in_amax(dtype, rounding) -> None:
    x = from_values([[NAN, NEG_NAN, 2.0] + [0.0] * 29], dtype)
    assert torch.isnan(x[0, :2]).all() and torch.signbit(x[0, :2]).tolist() == [False, True]
    q, s = quantize_mxfp8(x, rounding)
    assert int(s[0, 0]) == 127 - 7
    assert q.view(torch.uint8)[0, :3].tolist() == [0x7F, 0xFF, 0x78]


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_block_without_finite_elements(rounding) -> None:
    q, s = _quantize_block([INF, -INF, NAN, NEG_NAN], torch.bfloat16, rounding)
    assert s == 0
    assert q == [0x7E, 0xFE, 0x7F, 0xFF]


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_bf16_subnormal_amax(rounding) -> None:
    # bf16 subnormals are fp32 subnormals: amax 2**-130 has E = -130, e clamps to -127.
    values = [2.0**-130, -(2.0**-133), 3 * 2.0**-133]
    x = torch.tensor([values + [0.0] * 29], dtype=torch.float32).to(torch.bfloat16)
    assert x.float()[0, :3].tolist() == values  # exactly representable
    assert int(scale_exponents(x, rounding)[0, 0]) == -127
    q, s = quantize_mxfp8(x, rounding)
    assert int(s[0, 0]) == 0
    # x * 2**127: 2**-3 = 0x20; -2**-6 (least normal) = 0x88; 3 * 2**-6 = 1.5 * 2**-5 = 0x14.
    assert q.view(torch.uint8)[0, :3].tolist() == [0x20, 0x88, 0x14]


def test_fp16_subnormal_amax() -> None:
    q, s = _quantize_block([2.0**-24, -(2.0**-20)], torch.float16, "floor")
    assert s == 127 - 28  # amax 2**-20: e = -28
    assert q == [0x58, 0xF8]  # 2**-24 * 2**28 = 16; -(2**-20) * 2**28 = -256


@pytest.mark.parametrize(
    ("amax", "floor_e", "ceil_e"),
    [
        (1.0, -8, -8),
        (1.5, -8, -8),
        (1.75, -8, -8),  # m = 1.75 exactly: amax / 448 = 2**-8
        (1.875, -8, -7),
        (448.0, 0, 0),
        (450.0, 0, 1),  # the least bf16 above 448
        (1024.0, 2, 2),
        (2.0**-14, -22, -22),
    ],
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rounding_modes(amax, floor_e, ceil_e, dtype) -> None:
    for rounding, e in (("floor", floor_e), ("ceil", ceil_e)):
        _, s = _quantize_block([amax, -amax / 4], dtype, rounding)
        assert s == e + 127, (amax, rounding)


def test_scale_bytes_at_the_dtype_extremes() -> None:
    big = torch.finfo(torch.bfloat16).max  # (2 - 2**-7) * 2**127
    assert _quantize_block([big], torch.bfloat16, "floor")[1] == 127 + 119
    assert _quantize_block([big], torch.bfloat16, "ceil")[1] == 127 + 120
    assert _quantize_block([65504.0], torch.float16, "floor")[1] == 127 + 7
    assert _quantize_block([65504.0], torch.float16, "ceil")[1] == 127 + 8
    # The least bf16 subnormal: E = -133, clamped.
    assert _quantize_block([2.0**-133], torch.bfloat16, "floor") == ([0x01 << 3], 0)


# --- against exact rational arithmetic ---------------------------------------------------


def _floor_log2(r: Fraction) -> int:
    e = r.numerator.bit_length() - r.denominator.bit_length()
    while Fraction(2) ** e > r:
        e -= 1
    while Fraction(2) ** (e + 1) <= r:
        e += 1
    return e


def _exact_e(block: list[float], rounding: str) -> int:
    finite = [abs(Fraction(v)) for v in block if math.isfinite(v)]
    amax = max(finite, default=Fraction(0))
    if amax == 0:
        return -127
    if rounding == "floor":
        e = _floor_log2(amax) - 8
    else:  # ceil(log2(amax / 448)): the least e with amax / 448 <= 2**e
        r = amax / 448
        e = _floor_log2(r)
        if Fraction(2) ** e < r:
            e += 1
    return max(-127, min(127, e))


_E4M3 = [  # every finite non-negative E4M3 value with its byte
    (
        Fraction(m, 8) * Fraction(2) ** -6 if ex == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (ex - 7),
        (ex << 3) | m,
    )
    for ex in range(16)
    for m in range(8)
    if (ex, m) != (15, 7)
]


def _exact_e4m3(v: float, e: int) -> int:
    if math.isnan(v):
        return 0xFF if math.copysign(1.0, v) < 0 else 0x7F
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    if math.isinf(v):
        return sign | 0x7E
    y = abs(Fraction(v)) * Fraction(2) ** -e
    best = min(_E4M3, key=lambda c: (abs(c[0] - y), c[1] & 1))  # nearest; ties to even
    return sign | best[1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_matches_exact_rationals(dtype, rounding) -> None:
    gen = torch.Generator().manual_seed(11)
    x = torch.cat([adversarial_input(2, 1024, dtype, gen, "cpu"), random_input(1, 1024, dtype, gen, "cpu")])
    q, s = quantize_mxfp8(x, rounding)
    qb = q.view(torch.uint8)
    xs = x.float().tolist()
    for row in range(x.shape[0]):
        for blk in range(x.shape[1] // BLOCK):
            block = xs[row][blk * BLOCK : (blk + 1) * BLOCK]
            e = _exact_e(block, rounding)
            assert int(s[row, blk]) == e + 127, (row, blk, block)
            want = [_exact_e4m3(v, e) for v in block]
            got = qb[row, blk * BLOCK : (blk + 1) * BLOCK].tolist()
            assert got == want, (row, blk, block)


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_blocks_are_what_they_claim(dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    x = adversarial_input(1, 4 * BLOCK * len(special_blocks(dtype)), dtype, gen, "cpu")
    blocks = x.reshape(-1, BLOCK)
    assert torch.isnan(blocks).any() and torch.isinf(blocks).any()
    nan = torch.isnan(x)
    assert (torch.signbit(x) & nan).any() and (~torch.signbit(x) & nan).any()
    sub = (x != 0) & (x.abs() < torch.finfo(dtype).smallest_normal)
    assert sub.any()
