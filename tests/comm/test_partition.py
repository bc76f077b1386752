"""``shard``: the one partition the all-reduce kernels and the runtime agree on.

Checked against a brute-force owner map (parts laid end to end, the first ``total % parts``
one unit longer) for every small (total, parts) pair and many large random ones, then as the
kernels use it twice: packs over ranks (two-shot), then each rank's packs over its CTAs.
"""

from __future__ import annotations

import random

import pytest

from b12x_aot.comm.layout import MAX_BLOCKS, MAX_WORLD, PACK_BYTES, shard


def owner_map(total: int, parts: int) -> list[int]:
    """Which part owns each unit, built by laying the parts end to end."""
    base, rem = divmod(total, parts)
    owners: list[int] = []
    for part in range(parts):
        owners += [part] * (base + (1 if part < rem else 0))
    return owners


def check_against_brute_force(total: int, parts: int) -> None:
    owners = owner_map(total, parts)
    assert len(owners) == total
    lengths = []
    for part in range(parts):
        start, end = shard(part, total, parts)
        assert 0 <= start <= end <= total, (total, parts, part, start, end)
        assert start == sum(lengths)  # parts are contiguous, in order
        assert owners[start:end] == [part] * (end - start)
        assert start == end or (owners[start - 1 : start] != [part] and owners[end : end + 1] != [part])
        lengths.append(end - start)
    assert sum(lengths) == total
    assert max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # the longer parts come first


@pytest.mark.parametrize("parts", range(1, 70))
def test_shard_matches_brute_force_small(parts: int) -> None:
    for total in range(0, 300):
        check_against_brute_force(total, parts)


def test_shard_matches_brute_force_random() -> None:
    rng = random.Random(20261201)
    for _ in range(400):
        parts = rng.randint(1, 4 * MAX_BLOCKS)
        total = rng.choice([rng.randint(0, parts), rng.randint(0, 1 << 17)])
        check_against_brute_force(total, parts)


def test_total_below_parts_gives_single_units_then_empty_parts() -> None:
    for total in range(0, 8):
        spans = [shard(i, total, 8) for i in range(8)]
        assert spans[:total] == [(i, i + 1) for i in range(total)]
        assert all(start == end == total for start, end in spans[total:])


def grid(num_elements: int, cta_threads: int, blocks: int) -> int:
    """The spec's grid: min(blocks, max(cdiv(num_elements, 8 * cta_threads), 1))."""
    return min(blocks, max(-(-num_elements // (8 * cta_threads)), 1))


def two_level_cover(packs: int, world: int, ctas: int) -> dict[int, tuple[int, int]]:
    """Owner (rank, cta) of every pack when packs go to ranks, then each rank's to its CTAs."""
    owners: dict[int, tuple[int, int]] = {}
    rank_lengths = []
    for rank in range(world):
        lo, hi = shard(rank, packs, world)
        rank_lengths.append(hi - lo)
        cta_lengths = []
        for cta in range(ctas):
            a, b = shard(cta, hi - lo, ctas)
            cta_lengths.append(b - a)
            for pack in range(lo + a, lo + b):
                assert pack not in owners, f"pack {pack} owned twice"
                owners[pack] = (rank, cta)
        assert max(cta_lengths) - min(cta_lengths) <= 1
    assert max(rank_lengths) - min(rank_lengths) <= 1
    return owners


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("cta_threads", [256, 512])
@pytest.mark.parametrize("blocks", [8, 16, 32])
def test_two_level_cover_owns_every_pack_once(world: int, cta_threads: int, blocks: int) -> None:
    sizes = {1, world - 1, world, world + 1, 7168 // 8, 3 * 7168 // 8, 16 * 7168 // 8}
    sizes |= set(range(1, 200)) | {4095, 4096, 4097, 65535, 65536}
    for packs in sorted(s for s in sizes if s > 0):
        ctas = grid(packs * 8, cta_threads, blocks)
        assert 1 <= ctas <= blocks <= MAX_BLOCKS
        owners = two_level_cover(packs, world, ctas)
        assert sorted(owners) == list(range(packs))


def test_one_shot_cover_over_ctas() -> None:
    for packs in range(1, 3000, 7):
        for blocks in (8, 16, 32):
            ctas = grid(packs * 8, 512, blocks)
            spans = [shard(c, packs, ctas) for c in range(ctas)]
            assert [u for s, e in spans for u in range(s, e)] == list(range(packs))


def test_constants_bound_the_window() -> None:
    assert PACK_BYTES == 16  # 8 bf16/fp16 elements: the multiple-of-8 rule in the runtime
    assert MAX_WORLD == 8
