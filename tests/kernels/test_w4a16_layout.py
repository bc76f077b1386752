"""The decode tiles' interleaved activation layout, on the CPU: where the writer stores each word
is where the reader expects it (``nk``: ``pair_rows`` and ``compute_interleaved``, A fragments;
``n64k128``: ``a_lane_word`` and ``compute_swapped``, B fragments), no two words collide, and
the ``ld.shared.v4`` that reads each unit is free of bank conflicts."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

from b12x_aot.kernels.w4a16._layout import RingLayout

STAGES, BLOCK_M = 3, 16


def layout(tile_k: int, swapped: bool = False) -> RingLayout:
    """The decode tile's activation layout; ``swapped``: an n64k128 tile's (tokens are B)."""
    return RingLayout(block_m=BLOCK_M, tile_n=128, tile_k=tile_k, swapped=swapped)


def written(tile: RingLayout, where, what) -> dict:
    """Ring word -> what the writer put there, for word ``w`` of piece ``q`` (k ``[8q, 8q +
    8)``) of row ``r`` in slot ``slot`` stored at ``where(slot, r, q, w)``, described by
    ``what(slot, r, q, w)``; every word of the ring exactly once."""
    stored = {}
    for slot in range(STAGES):
        for r in range(BLOCK_M):
            for q in range(tile.tile_k // 8):
                for w in range(4):
                    word = where(slot, r, q, w)
                    assert word not in stored, (slot, r, q, w)
                    stored[word] = what(slot, r, q, w)
    assert sorted(stored) == list(range(STAGES * BLOCK_M * tile.tile_k // 2))  # the whole ring, once
    return stored


@pytest.mark.parametrize("tile_k", [64, 128, 256])
def test_every_word_the_writer_stores_is_the_one_the_reader_expects(tile_k: int) -> None:
    tile = layout(tile_k)
    # Writer (nk): step s of piece q of row r; as (row, k-half, k16, step).
    stored = written(tile, tile.a_word, lambda slot, r, q, s: (slot, r, q % 2, q // 2, s))
    # Reader: lane (g, c) loads unit (k16 = 4j + c, step) of rows g, g + 8 as its A fragment:
    # words [g:0, g+8:0, g:1, g+8:1] (row, k-half).
    for slot in range(STAGES):
        for g in range(8):
            for k16 in range(tile_k // 16):
                for step in range(4):
                    unit = tile.a_rows_at(slot, 0, g) + tile.a_unit(k16, step, g)
                    got = [stored[4 * unit + e] for e in range(4)]
                    want = [(slot, g + 8 * (e % 2), e // 2, k16, step) for e in range(4)]
                    assert got == want, (tile_k, slot, g, k16, step)


@pytest.mark.parametrize("tile_k", [64, 128, 256])
def test_each_eight_lanes_of_a_fragment_load_hit_every_bank_once(tile_k: int) -> None:
    # A 16-byte load is served eight lanes at a time (lane 4g + c); 128 bytes of banks hold 8 units.
    tile = layout(tile_k)
    for slot in range(STAGES):
        for j in range(tile_k // 64):
            for step in range(4):
                for first in range(0, 32, 8):
                    groups = {
                        (tile.a_rows_at(slot, 0, lane // 4) + tile.a_unit(4 * j + lane % 4, step, lane // 4))
                        % 8
                        for lane in range(first, first + 8)
                    }
                    assert len(groups) == 8, (tile_k, slot, j, step, first, sorted(groups))


@pytest.mark.parametrize("tile_k", [64, 128, 256])
def test_n64k128_words_land_where_each_lane_reads_its_natural_k(tile_k: int) -> None:
    # Writer (n64k128): word w of piece q of row r holds k 8q + 2w, + 1, unpaired.
    tile = layout(tile_k, swapped=True)
    stored = written(tile, tile.a_lane_word, lambda slot, r, q, w: (slot, r, 8 * q + 2 * w))
    # Reader: lane (g, c) at step s of 64-wide chunk j loads unit (4j + c, s) of rows g, g + 8:
    # words [g:e0, g:e1, g+8:e0, g+8:e1] (the B fragments of token atoms 0 and 1), which must
    # hold the natural MMA slots k 64j + 16s + 8e + 2c (the k's n64k128's lane order gives lane
    # c's weight pairs).
    for slot in range(STAGES):
        for g in range(8):
            for j in range(tile_k // 64):
                for c in range(4):
                    for step in range(4):
                        unit = tile.a_rows_at(slot, 0, g) + tile.a_unit(4 * j + c, step, g)
                        got = [stored[4 * unit + e] for e in range(4)]
                        want = [
                            (slot, g + 8 * (e // 2), 64 * j + 16 * step + 8 * (e % 2) + 2 * c)
                            for e in range(4)
                        ]
                        assert got == want, (tile_k, slot, g, j, c, step)
