"""Post-compile limits: check_limits on SASS histograms, and what the contract hash covers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from b12x_aot.compiler._contract import check_limits, undecided_limits
from b12x_aot.compiler._spec import Limits, load_spec
from b12x_aot.registry import KernelResources, SassHistogram

from ..conftest import SPECS, TOPK_SMALL, write_spec

KERNEL = KernelResources(
    symbol="k",
    params=(),
    param_bytes=0,
    registers=200,
    frame_bytes=0,
    min_stack_bytes=0,
    max_stack_bytes=None,
    static_smem_bytes=0,
    const_bytes=0,
    max_threads=128,
    text_sha256="0" * 64,
    code_size=0,
)


def sass(**opcodes: int) -> SassHistogram:
    return SassHistogram({op.replace("_", "."): n for op, n in opcodes.items()}, {}, 0, 0)


# Two k-loops of 8 wgmmas: asynchronous (a wait per chunk and k-tile, one at the end) and as
# ptxas serializes them (a wait after every wgmma).
ASYNC = sass(HGMMA_64x128x16_F32_BF16=16, WARPGROUP_DEPBAR_LE=6, WARPGROUP_ARRIVE=4)
SERIAL = sass(HGMMA_64x128x16_F32_BF16=16, WARPGROUP_DEPBAR_LE=16, WARPGROUP_ARRIVE=16)


def test_async_wgmma_rejects_serialized_wgmmas_only() -> None:
    bound = Limits(async_wgmma=True)
    assert check_limits(bound, KERNEL, ASYNC) is None
    reason = check_limits(bound, KERNEL, SERIAL)
    assert reason and "16 wgmma waits for 16 wgmmas: ptxas serialized them" in reason
    assert check_limits(bound, KERNEL, sass(HMMA_16816_F32_BF16=64)) is None  # no wgmma at all
    assert check_limits(Limits(), KERNEL, SERIAL) is None  # not asked for


def test_async_wgmma_without_sass_is_not_taken_on_trust() -> None:
    # Neither accepted nor rejected: undecided, so the build records no verdict on it.
    assert check_limits(Limits(async_wgmma=True), KERNEL, None) is None
    assert undecided_limits(Limits(async_wgmma=True), KERNEL, None) == "async_wgmma"
    assert undecided_limits(Limits(async_wgmma=True), KERNEL, ASYNC) is None
    assert check_limits(Limits(max_spill_bytes=0), KERNEL, None) is None  # a zero frame proves it
    assert undecided_limits(Limits(max_spill_bytes=0), KERNEL, None) is None


def test_limits_combine_their_reasons() -> None:
    reason = check_limits(Limits(max_registers=128, async_wgmma=True), KERNEL, SERIAL)
    assert reason and reason.startswith("registers 200 > max_registers 128; 16 wgmma waits")
    spilled = replace(SERIAL, spill_store_bytes=64)
    assert "spill bytes 64 > max_spill_bytes 0" in (
        check_limits(Limits(max_spill_bytes=0), KERNEL, spilled) or ""
    )


def test_async_wgmma_enters_the_contract_only_when_set(tmp_path: Path) -> None:
    # Specs that never ask for it keep the contract hash they had before the bound existed.
    plain = load_spec(write_spec(tmp_path, "plain.yaml", TOPK_SMALL))
    assert "async_wgmma" not in plain.contract()["limits"]
    w4a16 = load_spec(SPECS / "moe_w4a16.yaml")
    assert w4a16.limits.async_wgmma and w4a16.contract()["limits"]["async_wgmma"] is True
