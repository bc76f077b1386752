"""The moe.w4a16 weight byte orders, on the CPU: the 16-byte unit the kernel's copy reads for
(row, k-chunk) of a tile (``WeightOrder.unit``) holds, in what ``w4a16_weights`` makes, the int4
of that row and chunk in the plain ``[E, n, k / 2]`` rows, for every tile of every expert; and
in n64k128's lane order, each MMA lane's 8 bytes give it its natural (k, k + 1) operand pairs
the way the kernel's ``int4_lane_pair`` takes them."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass")
pytest.importorskip("torch")

import torch

from b12x_aot.contract.w4a16_layout import CHUNK_K, LANE_ORDER, WEIGHT_LAYOUTS
from b12x_aot.kernels.w4a16._layout import WeightOrder, pass_splits_bands
from b12x_aot.loader.errors import LaunchArgumentError
from b12x_aot.ops import w4a16_weights


def nibbles(w: torch.Tensor) -> torch.Tensor:
    """The int4 codes of u8 bytes, low nibble first: [..., b] -> [..., 2b]."""
    return torch.stack((w & 0xF, w >> 4), dim=-1).flatten(-2)


def in_lane_order(chunk: torch.Tensor) -> torch.Tensor:
    """The nibbles of 32 plain bytes (64 k) where n64k128 puts them: nibble LANE_ORDER[k] is k's."""
    lanes = torch.empty(CHUNK_K, dtype=torch.uint8)
    lanes[list(LANE_ORDER)] = nibbles(chunk)
    return lanes


@pytest.mark.parametrize("w_layout", WEIGHT_LAYOUTS)
@pytest.mark.parametrize(("n", "k", "tile_n"), [(128, 256, 64), (256, 384, 128), (384, 128, 128)])
def test_each_unit_the_kernel_reads_holds_its_row_and_chunk(
    w_layout: str, n: int, k: int, tile_n: int
) -> None:
    experts = 3
    gen = torch.Generator().manual_seed(n + k)
    rows = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=gen)
    laid = w4a16_weights(rows, w_layout)
    assert laid.shape == rows.shape and laid.dtype == torch.uint8
    units = laid.reshape(-1, 16)  # the kernel's view: 16-byte units of the whole tensor
    order = WeightOrder(k=k, w_layout=w_layout)
    k32 = k // 32
    read = set()
    for e in range(experts):
        for nt in range(n // tile_n):
            first = (e * n + nt * tile_n) * k32  # the tile's first unit, as the kernel computes it
            for row in range(tile_n):
                for chunk in range(k32):
                    unit = first + order.unit(row, chunk)
                    want = rows[e, nt * tile_n + row, 16 * chunk : 16 * chunk + 16]
                    if w_layout == "n64k128":  # the unit is half of a 64-k chunk in lane order
                        whole = rows[e, nt * tile_n + row, 32 * (chunk // 2) : 32 * (chunk // 2) + 32]
                        want = in_lane_order(whole)[32 * (chunk % 2) : 32 * (chunk % 2) + 32]
                        got = nibbles(units[unit])
                    else:
                        got = units[unit]
                    assert torch.equal(got, want), (w_layout, e, nt, row, chunk)
                    read.add(unit)
    assert read == set(range(units.shape[0]))  # a permutation: every unit read exactly once
    if w_layout == "nk":
        assert torch.equal(laid, rows)


@pytest.mark.parametrize("w_layout", WEIGHT_LAYOUTS)
def test_a_copy_pass_offset_is_one_constant_unless_the_kernel_refuses_the_pass(w_layout: str) -> None:
    # The copy adds unit(i * rows, 0) to pass 0's address unit(n0, chunk) (n0 < rows): exact for
    # passes of whole or dividing bands; W4A16Params refuses the params that give other passes.
    order = WeightOrder(k=512, w_layout=w_layout)
    for rows in (8, 16, 24, 32, 48, 64, 96, 128):  # copying threads // (tile_k // 32)
        exact = all(
            order.unit(n0 + i * rows, c) == order.unit(n0, c) + order.unit(i * rows, 0)
            for n0 in range(rows)
            for i in range(256 // rows)
            for c in range(16)
        )
        refused = w_layout == "n64k128" and pass_splits_bands(rows)
        assert exact != refused, (w_layout, rows)


def test_bad_weights_and_layouts_are_refused_with_what_was_given() -> None:
    rows = torch.zeros(2, 96, 64, dtype=torch.uint8)  # n = 96: not whole 64-row bands
    with pytest.raises(LaunchArgumentError, match=r"n % 64 == 0.*keep w_layout='nk'.*\(2, 96, 64\)"):
        w4a16_weights(rows, "n64k128")
    with pytest.raises(LaunchArgumentError, match=r"one of \('nk', 'n64k128'\).*'kn'"):
        w4a16_weights(rows, "kn")
    with pytest.raises(LaunchArgumentError, match=r"uint8.*torch.float32"):
        w4a16_weights(rows.float(), "nk")


def test_n64k128_lane_pieces_hold_each_lanes_natural_mma_pairs() -> None:
    # Lane c reads bytes [8c, 8c + 8) of a row's 64-k chunk as two little-endian words; MMA step
    # s, k-half e takes word s // 2 shifted right by 4 (2 (s % 2) + e) and keeps nibbles 0 and 4
    # (int4_lane_pair): those must be k = 16s + 8e + 2c and k + 1, the slots of m16n8k16 B
    # (and of the wgmma A fragment) in the natural order.
    gen = torch.Generator().manual_seed(7)
    rows = torch.randint(0, 256, (2, 64, 128), dtype=torch.uint8, generator=gen)  # k = 256
    laid = w4a16_weights(rows, "n64k128")
    order = WeightOrder(k=256, w_layout="n64k128")
    units = laid.reshape(-1, 16)
    plain = nibbles(rows)
    for e_, row, chunk in ((0, 0, 0), (1, 37, 3), (1, 63, 6)):
        k64 = chunk // 2  # the 64-k chunk; its two 16-byte units are k32 chunks 2 k64, 2 k64 + 1
        piece = torch.cat([units[e_ * 64 * 8 + order.unit(row, 2 * k64 + h)] for h in (0, 1)])
        for c in range(4):
            words = [
                int.from_bytes(bytes(piece[8 * c + 4 * w : 8 * c + 4 * w + 4].tolist()), "little")
                for w in (0, 1)
            ]
            for step in range(4):
                for half in range(2):
                    v = words[step // 2] >> 4 * (2 * (step % 2) + half)
                    k = 64 * k64 + 16 * step + 8 * half + 2 * c
                    assert (v & 0xF, v >> 16 & 0xF) == tuple(plain[e_, row, k : k + 2].tolist()), (
                        row,
                        c,
                        step,
                    )
