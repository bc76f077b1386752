"""The decode tiles' interleaved activation layout, on the CPU: a permutation, and bank-conflict
free for the ``ld.shared.v4`` that reads each A fragment."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

from b12x_aot.kernels._w4a16_mma import MmaSyncMainloop

pytestmark = pytest.mark.dsl
a_unit = MmaSyncMainloop.a_unit


@pytest.mark.parametrize("tile_k", [64, 128])
def test_a_unit_permutes_the_units_of_a_row_pair(tile_k: int) -> None:
    units = tile_k // 4  # 16-byte A-fragment units per (row g, row g + 8) pair and k-tile
    for g in range(8):
        placed = [a_unit(p // 4, p % 4, g) for p in range(units)]
        assert sorted(placed) == list(range(units))


@pytest.mark.parametrize("tile_k", [64, 128])
def test_each_eight_lanes_of_a_fragment_load_hit_distinct_bank_groups(tile_k: int) -> None:
    # Lane 4g + c reads unit (4j + c, step) of row pair g; pairs sit tile_k // 4 units apart.
    # A 16-byte load is served eight lanes at a time; a 128-byte row of banks holds 8 units.
    units = tile_k // 4
    for j in range(tile_k // 64):
        for step in range(4):
            for first in range(0, 32, 8):
                groups = {
                    (lane // 4 * units + a_unit(4 * j + lane % 4, step, lane // 4)) % 8
                    for lane in range(first, first + 8)
                }
                assert len(groups) == 8, (tile_k, j, step, first, sorted(groups))
