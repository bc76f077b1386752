"""The ``quant.mxfp8`` reference in plain torch (CPU or CUDA), written from the family's rules.

For each block of 32 consecutive elements along K:

- ``amax`` = max ``|x|`` over the block's finite elements (0 if none);
- with ``amax = m * 2**E``, ``m`` in ``[1, 2)`` (from ``frexp``, exact, fp32 subnormals
  included): ``e = E - 8`` (floor, OCP MX) or ``e = E - 8 + (m > 1.75)`` (ceil, that is
  ``ceil(log2(amax / 448))``); ``e = -127`` for ``amax == 0``; clamped to ``[-127, 127]``;
  the scale byte is ``e + 127``;
- ``q = e4m3(x * 2**-e)``: round to nearest even, saturated to +-448 (torch would turn an
  overflow into NaN, so the value is clamped first), +-Inf to +-448, NaN kept with its sign.

This deliberately shares no code or tricks with the kernel: the exponent comes from
``torch.frexp``, the scaling happens in fp64 (exact for every power of two in range).
"""

from __future__ import annotations

import torch

__all__ = [
    "BLOCK",
    "E4M3_MAX",
    "NAN",
    "NEG_NAN",
    "TORCH_DTYPES",
    "adversarial_input",
    "from_values",
    "quantize_mxfp8",
    "random_input",
    "scale_exponents",
    "special_blocks",
]

BLOCK = 32
E4M3_MAX = 448.0
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def scale_exponents(x: torch.Tensor, rounding: str) -> torch.Tensor:
    """The clamped scale exponent ``e`` (int32) of every 32-block of ``x[M, K]``."""
    if rounding not in ("floor", "ceil"):
        raise ValueError(f"rounding must be 'floor' or 'ceil' (got {rounding!r})")
    m, k = x.shape
    if k % BLOCK:
        raise ValueError(f"K must be a multiple of {BLOCK} (got {k})")
    xf = x.float().reshape(m, k // BLOCK, BLOCK)
    amax = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf)).amax(dim=-1)
    mant, exp = torch.frexp(amax)  # amax = mant * 2**exp, mant in [0.5, 1)
    e = exp.to(torch.int32) - 1 - 8  # E - 8
    if rounding == "ceil":
        e = e + (mant * 2 > 1.75).to(torch.int32)
    e = torch.where(amax == 0, torch.full_like(e, -127), e)
    return e.clamp(-127, 127)


def quantize_mxfp8(x: torch.Tensor, rounding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)`` for ``x[M, K]``: q as ``torch.float8_e4m3fn`` [M, K], scales uint8 [M, K/32]."""
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"x must be bf16 or fp16 (got {x.dtype})")
    m, k = x.shape
    e = scale_exponents(x, rounding)
    scale = torch.pow(2.0, (-e).double())  # exact in fp64 for |e| <= 127
    y = x.double().reshape(m, k // BLOCK, BLOCK) * scale[..., None]  # exact
    # fp64 -> fp32 is exact except far below e4m3's range, where both round to a signed zero.
    y = y.float().clamp(-E4M3_MAX, E4M3_MAX).reshape(m, k)  # clamp keeps NaN
    q = y.to(torch.float8_e4m3fn).view(torch.uint8)
    # The NaN's sign comes from its bits: torch.signbit on CUDA converts fp16 to fp32 first,
    # which returns a NaN with its sign dropped.
    negative = x.view(torch.int16) < 0
    nan_byte = torch.where(negative, torch.full_like(q, 0xFF), torch.full_like(q, 0x7F))
    q = torch.where(torch.isnan(x), nan_byte, q)
    return q.view(torch.float8_e4m3fn), (e + 127).to(torch.uint8)


def random_input(m: int, k: int, dtype: torch.dtype, gen: torch.Generator, device: str) -> torch.Tensor:
    """Gaussian values with a random power-of-two magnitude per 32-block, spanning the dtype."""
    lo, hi = (-40, 40) if dtype == torch.bfloat16 else (-20, 12)
    x = torch.randn(m, k // BLOCK, BLOCK, generator=gen, device=device)
    mag = torch.randint(lo, hi, (m, k // BLOCK, 1), generator=gen, device=device)
    return (x * torch.pow(2.0, mag.float())).to(dtype).reshape(m, k)


# NaN markers for :func:`from_values`: a float NaN's sign does not survive torch's conversions
# (on CPU, fp32 NaN -> bf16 gives 0xFFFF), so NaNs are written as these and set by their bits.
NAN = "+nan"
NEG_NAN = "-nan"
_NAN_BITS = {torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}

Value = float | str


def from_values(rows: list[list[Value]], dtype: torch.dtype) -> torch.Tensor:
    """A [len(rows), len(row)] tensor of ``dtype``; :data:`NAN`/:data:`NEG_NAN` become exact NaNs."""
    values = torch.tensor([[0.0 if isinstance(v, str) else v for v in r] for r in rows]).to(dtype)
    bits = values.view(torch.int16)
    for sign, marker in ((0, NAN), (-(1 << 15), NEG_NAN)):
        where = torch.tensor([[v == marker for v in r] for r in rows], dtype=torch.bool)
        bits = torch.where(where, torch.full_like(bits, _NAN_BITS[dtype] + sign), bits)
    return bits.view(dtype)


def special_blocks(dtype: torch.dtype) -> list[list[Value]]:
    """Hand-picked 32-blocks: zeros, subnormals, ties, the saturation edge, Inf and NaN."""
    inf = float("inf")
    info = torch.finfo(dtype)
    sub = info.smallest_normal * 2.0 ** -(7 if dtype == torch.bfloat16 else 10)  # least subnormal
    pad = [0.0] * 32
    blocks: list[list[Value]] = [
        [0.0] * 32,
        [-0.0] * 32,
        [sub * (i + 1) * (-1) ** i for i in range(32)],  # subnormal amax, values of all sizes
        [sub, -sub, *pad][:32],
        [info.smallest_normal, sub, -3 * sub, *pad][:32],
        # amax 256: e = 0 in both modes, so these are e4m3 ties (normal and subnormal) as given
        [256.0, 1.0625, 1.1875, 17.0, 19.0, 272.0, 304.0, -1.0625, -17.0, 2.0**-10, 3 * 2.0**-10]
        + [5 * 2.0**-10, 2.0**-11, -(2.0**-10), 0.0] * 5
        + [0.0],
        # m = 1.75 exactly (448 * 2**k) and the next value up: the ceil rule's edge
        [448.0, 447.0, -448.0, *([1.0] * 29)],
        [448.0 * (1 + info.eps), 1.0, *pad][:32],
        [460.0, 464.0, 480.0, 496.0, -500.0, 511.0, *([0.5] * 26)],  # floor mode saturates these
        [inf, -inf, NAN, NEG_NAN, 1.0, -2.0, 3.0, *([0.25] * 25)],
        [inf] * 16 + [-inf] * 16,  # no finite element: e = -127
        [NAN] * 8 + [NEG_NAN] * 8 + [inf] * 8 + [0.0] * 8,
        [info.max, -info.max, info.max / 3, *([1.0] * 29)],
        [info.max, inf, NAN, sub, *([info.max / 2**20] * 28)],
    ]
    return blocks


def _random_bits(n: int, dtype: torch.dtype, gen: torch.Generator, device: str) -> torch.Tensor:
    """Random sign and mantissa bits; per block, exponents within 12 of a random base.

    Close exponents give many e4m3 rounding ties, subnormal results and saturation; bases span
    the whole field, subnormals (0) and Inf/NaN (all ones) included.
    """
    mbits, emax = (7, 255) if dtype == torch.bfloat16 else (10, 31)
    base = torch.randint(-12, emax + 1, (n, 1), generator=gen, device=device)
    exp = (base + torch.randint(0, 13, (n, BLOCK), generator=gen, device=device)).clamp(0, emax)
    mant = torch.randint(0, 1 << mbits, (n, BLOCK), generator=gen, device=device)
    sign = torch.randint(0, 2, (n, BLOCK), generator=gen, device=device)
    bits = (sign << 15) | (exp << mbits) | mant
    return _as_dtype(bits, dtype)


def _as_dtype(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int64 values in [0, 2**16) as the 16-bit float type with those bits."""
    return torch.where(bits >= 1 << 15, bits - (1 << 16), bits).to(torch.int16).view(dtype)


def adversarial_input(m: int, k: int, dtype: torch.dtype, gen: torch.Generator, device: str) -> torch.Tensor:
    """Every 4th block a special one (cycling); the rest random bits, near-exponent bits, Gaussians."""
    nblk = m * (k // BLOCK)
    special = from_values(special_blocks(dtype), dtype).to(device)
    idx = torch.arange(nblk, device=device)
    raw = torch.randint(0, 1 << 16, (nblk, BLOCK), generator=gen, device=device)
    x = _as_dtype(raw, dtype)  # any pattern: NaNs, Infs, subnormals
    x = torch.where((idx % 4 == 2)[:, None], _random_bits(nblk, dtype, gen, device), x)
    rand = random_input(1, nblk * BLOCK, dtype, gen, device).reshape(nblk, BLOCK)
    x = torch.where((idx % 4 == 3)[:, None], rand, x)
    x = torch.where((idx % 4 == 0)[:, None], special[(idx // 4) % special.shape[0]], x)
    return x.reshape(m, k)
