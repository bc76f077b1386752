"""The exact-FMA reference must itself be right: check it against exact rational arithmetic."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

torch = pytest.importorskip("torch")

from .reference import fma_f32  # noqa: E402


def _exact_fma32(a: float, b: float, c: float) -> float:
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    # Round the exact rational to fp32 by bracketing between neighbouring fp32 values.
    approx = torch.tensor(float(exact), dtype=torch.float64).float()
    lo = hi = approx
    while Fraction(float(lo)) > exact:
        lo = torch.nextafter(lo, torch.tensor(-float("inf")))
    while Fraction(float(hi)) < exact:
        hi = torch.nextafter(hi, torch.tensor(float("inf")))
    if lo == hi:
        return float(lo)
    dl, dh = exact - Fraction(float(lo)), Fraction(float(hi)) - exact
    if dl != dh:
        return float(lo if dl < dh else hi)
    return float(lo if int(lo.view(torch.int32)) % 2 == 0 else hi)


def test_matches_exact_rationals_including_ties() -> None:
    rng = random.Random(7)
    cases = []
    for _ in range(3000):
        a = float(torch.tensor(rng.uniform(-4, 4)).float())
        b = float(torch.tensor(rng.uniform(-4, 4)).bfloat16().float())
        c = float(torch.tensor(rng.uniform(-1, 1) * 2.0 ** rng.randint(-40, 4)).float())
        cases.append((a, b, c))
    # a * b = 1.5 + 2^-23 + 2^-24 is exactly an fp32 midpoint; a tiny c decides the rounding,
    # which plain fp64 evaluation (double rounding) gets wrong for the negative one.
    for tiny in (2.0**-60, -(2.0**-60)):
        cases.append((1.0 + 2.0**-23, 1.5, tiny))
    a = torch.tensor([x[0] for x in cases], dtype=torch.float64).float()
    b = torch.tensor([x[1] for x in cases], dtype=torch.float64).float()
    c = torch.tensor([x[2] for x in cases], dtype=torch.float64).float()
    got = fma_f32(a, b, c)
    naive = (a.double() * b.double() + c.double()).float()
    assert float(got[-1]) != float(naive[-1])  # the midpoint case really exercises round-to-odd
    for i, (x, y, z) in enumerate(cases):
        want = _exact_fma32(float(a[i]), float(b[i]), float(c[i]))
        assert float(got[i]) == want, (x, y, z)
