"""The moe_w4a16 op's tile policy, off the GPU: for prefill, the expected share of experts
whose last block rides along with the block before it (tail_rows tiles); for decode, the
expected experts a batch touches and the regime its tiles per SM put it in; and the op taking
the first tile of its regime's list that the registry holds."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from b12x_aot.ops.moe_w4a16_tiles import riding_share, shipped_tiles, touched_experts


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
    table = shipped_tiles()
    assert table.riding(4096 * 8, 256) > 0.35 > table.tail_share
    assert table.riding(2048 * 8, 256) < 0.01 and table.riding(3072 * 8, 256) < 0.01
    assert table.riding(0, 256) == table.riding(100, 0) == 0.0
    # a shorter tail catches fewer last blocks
    wide, short = (riding_share(4096 * 8, 256, block_m=64, tail_rows=t) for t in (16, 8))
    assert wide > short > 0


@pytest.mark.parametrize(
    ("tokens", "topk", "experts"), [(1, 8, 256), (4, 8, 256), (16, 8, 256), (16, 8, 25), (3, 4, 7)]
)
def test_touched_experts_matches_uniform_routing(tokens: int, topk: int, experts: int) -> None:
    # Each token picks topk distinct experts uniformly: the mean number touched over many draws.
    import torch

    gen = torch.Generator().manual_seed(5)
    draws = 4000
    picks = torch.rand(draws, tokens, experts, generator=gen).topk(topk, dim=2).indices
    hit = torch.zeros(draws, experts, dtype=torch.bool)
    hit.scatter_(1, picks.reshape(draws, -1), True)
    mean = hit.sum(1).double().mean().item()
    assert touched_experts(tokens, topk, experts) == pytest.approx(mean, rel=0.01)
    assert touched_experts(0, topk, experts) == touched_experts(tokens, topk, 0) == 0.0


def test_decode_regimes_on_132_sms() -> None:
    # The cells measured on an H200 (132 SMs, 256 experts, topk 8): clusters at 1 and 4 tokens
    # on the narrow shapes, the 128-wide four-part tile where its CTAs are all resident at once
    # (N 256 at 16 and 20 tokens, N 384 at 12), the split-k tiles around it, the decode tiles
    # where the launch has three or more 128-wide tiles per SM.
    cells = {
        (256, 1): "cluster4",
        (256, 4): "cluster2",
        (256, 8): "tiny",
        (256, 12): "tiny",
        (256, 16): "resident",
        (256, 20): "resident",
        (384, 1): "cluster4",
        (384, 4): "cluster2",
        (384, 8): "tiny",
        (384, 12): "resident",
        (384, 16): "tiny",
        (2048, 1): "tiny",
        (2048, 4): "decode",
        (7168, 16): "decode",
    }
    got = {(n, t): shipped_tiles().decode_regime(t, 8, 256, n, sms=132) for n, t in cells}
    assert got == cells


class HoldsSome:
    """A registry that holds every moe.route_pack variant and the moe.w4a16 tiles ``held``
    allows; each kernel() call is recorded, and its launch reads back its params."""

    def __init__(self) -> None:
        self.held, self.asked = (lambda params: True), []

    def arch(self, device: int) -> str:
        return "sm_90a"

    def holds(self, family: str, abi: int, *, arch: str, **params) -> bool:
        return family == "moe.route_pack" or self.held(params)

    def kernel(self, family: str, abi: int, *, device: int, **params):
        self.asked.append((family, params))
        entry = type("Entry", (), {"params": params})

        class Kernel:
            def prepare(self, *, device: int):
                return type("Launch", (), {"entry": entry})

        return Kernel()


def _problem(tokens: int = 2, n: int = 7168):
    """``a``, ``w`` and ``scales`` of an FC2 problem over 256 experts (their shapes only)."""
    import torch

    a = torch.empty(tokens, 2048, dtype=torch.bfloat16, device="meta")
    w = torch.empty(256, n, 1024, dtype=torch.uint8, device="meta")
    return a, w, torch.empty(256, n, 16, dtype=torch.bfloat16, device="meta")


@pytest.fixture(scope="module")
def held_op():
    """One op over a :class:`HoldsSome` (defining a torch op takes a while)."""
    from b12x_aot.ops import MoeW4A16Op

    registry = HoldsSome()
    return MoeW4A16Op(registry, namespace="b12x_policy"), registry  # type: ignore[arg-type]


@pytest.mark.parametrize("regime", sorted(shipped_tiles().regimes))
def test_the_op_takes_the_first_tile_of_its_regime_that_the_registry_holds(held_op, regime: str) -> None:
    import torch

    op, registry = held_op
    table = shipped_tiles()
    assert op.tiles is table
    tiles = table.choices(regime)
    # topk is part of the op's cache key: each case a launch of its own
    for skipped in range(len(tiles) + 1):
        absent = tiles[:skipped]  # the registry lacks the first `skipped` tiles
        registry.held = lambda p, absent=absent: not any(t.items() <= p.items() for t in absent)
        registry.asked.clear()
        pack, gemm = op.launches_for(*_problem(), skipped + 1, torch.bfloat16, regime)
        if skipped == len(tiles):  # none held: the miss is the lead tile's, the one to build
            assert tiles[0].items() <= registry.asked[0][1].items()
            continue
        assert {k: gemm.entry.params[k] for k in table.params} == tiles[skipped], (regime, skipped)
        block_m = tiles[skipped]["block_m"]
        assert pack.entry.params == {
            "topk": skipped + 1,
            "block_m": block_m,
            "e_cap": 256,
            **table.route_pack,
        }


def test_the_op_reads_its_thresholds_from_the_table_it_is_given(held_op) -> None:
    import dataclasses

    import torch

    from b12x_aot.ops import MoeW4A16Op

    shipped, _ = held_op
    assert (shipped.decode_tokens, shipped.prefill_tokens) == (16, 256)
    table = dataclasses.replace(shipped_tiles(), decode_tokens=0, prefill_tokens=1, tail_share=1.0)
    op = MoeW4A16Op(HoldsSome(), namespace="b12x_policy_given", tiles=table)  # type: ignore[arg-type]
    assert (op.decode_tokens, op.prefill_tokens) == (0, 1)
    assert op.regime(1, topk=8, experts=256, n=7168, device=0) == "mid"
    assert op.regime(4096, topk=8, experts=256, n=7168, device=0) == "prefill"  # no share reaches 1.0
    assert shipped.regime(4096, topk=8, experts=256, n=7168, device=0) == "prefill_tail"
    _, gemm = op.launches_for(*_problem(), 8, torch.bfloat16)  # 2 tokens: prefill here
    assert {k: gemm.entry.params[k] for k in table.params} == table.choices("prefill")[0]
