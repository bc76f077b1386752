"""The moe_w4a16 op's prefill policy, off the GPU: the expected share of experts whose last
block rides along with the block before it (tail_rows tiles)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from b12x_aot.loader.torch_ops import MoeW4A16Op, riding_share


def _exact_share(routes: int, experts: int, block_m: int, tail: int) -> float:
    """The same share from the binomial distribution of one expert's route count."""
    p = 1.0 / experts

    def pmf(c: int) -> float:
        log = math.lgamma(routes + 1) - math.lgamma(c + 1) - math.lgamma(routes - c + 1)
        return math.exp(log + c * math.log(p) + (routes - c) * math.log1p(-p))

    return sum(pmf(c) for c in range(block_m + 1, routes + 1) if 1 <= (c - 1) % block_m + 1 <= tail)


@pytest.mark.parametrize("tokens", [512, 2048, 3584, 4096, 4608, 6144, 8192, 16384])
def test_riding_share_matches_the_binomial(tokens: int) -> None:
    routes, experts = tokens * 8, 256
    for block_m, tail in ((128, 16), (64, 8)):
        want = _exact_share(routes, experts, block_m, tail)
        assert riding_share(routes, experts, block_m=block_m, tail_rows=tail) == pytest.approx(
            want, abs=0.012
        )


def test_prefill_tail_where_experts_average_one_block_and_a_little() -> None:
    # The op's lead prefill_tail tile (128 rows, 16 riding): at 128 routes per expert on
    # average about 40 % of experts end on 1-16 rows; at 64 or 96, none.
    assert MoeW4A16Op.riding(4096 * 8, 256) > 0.35 > MoeW4A16Op.TAIL_SHARE
    assert MoeW4A16Op.riding(2048 * 8, 256) < 0.01 and MoeW4A16Op.riding(3072 * 8, 256) < 0.01
    assert MoeW4A16Op.riding(0, 256) == MoeW4A16Op.riding(100, 0) == 0.0
    # a shorter tail catches fewer last blocks
    wide, short = (riding_share(4096 * 8, 256, block_m=64, tail_rows=t) for t in (16, 8))
    assert wide > short > 0
