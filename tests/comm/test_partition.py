"""``shard``: the one partition the all-reduce kernels and the runtime agree on.

Checked against a brute-force owner map (parts laid end to end, the first ``total % parts``
one unit longer) for every small (total, parts) pair and many large random ones, then as the
kernels use it twice: packs over ranks (two-shot), then each rank's packs over its CTAs, for
every world the layout has room for and pack counts that are, and are not, multiples of it.
The kernel traces ``shard`` itself (``minimum=cutlass.min``), so this is its arithmetic.
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


def tiles(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether the spans, in order, are contiguous and cover ``[lo, hi)`` exactly."""
    at = lo
    for start, end in spans:
        if start != at or end < start:
            return False
        at = end
    return at == hi


def check_two_level(packs: int, world: int, ctas: int) -> None:
    """Packs to ranks, then each rank's to its CTAs: every pack owned exactly once, nothing past
    the payload (so no padding), ranks within one pack of each other, CTAs within one pack of
    each other in every rank's shard and in one-shot's whole range."""
    shards = [shard(rank, packs, world) for rank in range(world)]
    assert tiles(shards, 0, packs), (packs, world)
    sizes = [end - start for start, end in shards]
    assert max(sizes) - min(sizes) <= 1, (packs, world, sizes)
    for lo, hi in shards:
        parts = [shard(cta, hi - lo, ctas) for cta in range(ctas)]
        assert tiles([(lo + a, lo + b) for a, b in parts], lo, hi), (packs, world, ctas)
        lengths = [b - a for a, b in parts]
        assert max(lengths) - min(lengths) <= 1, (packs, world, ctas, lengths)
    whole = [shard(cta, packs, ctas) for cta in range(ctas)]
    assert tiles(whole, 0, packs)
    lengths = [b - a for a, b in whole]
    assert max(lengths) - min(lengths) <= 1


def pack_counts(world: int) -> set[int]:
    """1 pack, world - 1, world and world + 1 packs, rows of 7168 and 3584 elements, small and
    large counts around powers of two."""
    counts = {1, world - 1, world, world + 1, 2 * world - 1, 2 * world + 1, 4095, 4096, 4097, 65535, 65536}
    counts |= {t * hidden // 8 for t in (1, 2, 3, 4, 8, 9, 16, 32, 1536) for hidden in (7168, 3584)}
    counts |= set(range(1, 300))
    return {c for c in counts if c > 0}


@pytest.mark.parametrize("world", range(2, MAX_WORLD + 1))
def test_two_level_partition_is_balanced_and_covers_every_pack_once(world: int) -> None:
    for packs in sorted(pack_counts(world)):
        for cta_threads in (256, 512):
            for blocks in (8, 16, 32, MAX_BLOCKS):
                ctas = grid(packs * 8, cta_threads, blocks)
                assert 1 <= ctas <= blocks <= MAX_BLOCKS
                check_two_level(packs, world, ctas)


def test_two_level_partition_random_counts() -> None:
    rng = random.Random(20261208)
    for _ in range(2000):
        world = rng.randint(2, MAX_WORLD)
        packs = rng.choice([rng.randint(1, 4 * world), rng.randint(1, 1 << 21)])
        check_two_level(packs, world, rng.randint(1, MAX_BLOCKS))


def test_the_owner_of_each_pack_is_the_brute_force_one() -> None:
    for world in range(2, MAX_WORLD + 1):
        for packs in (1, world - 1, world, world + 1, 7 * world + 3):
            owners = owner_map(packs, world)
            for rank in range(world):
                start, end = shard(rank, packs, world)
                assert [p for p in range(packs) if owners[p] == rank] == list(range(start, end))


def test_constants_bound_the_window() -> None:
    assert PACK_BYTES == 16  # 8 bf16/fp16 elements: the multiple-of-8 rule in the runtime
    assert MAX_WORLD == 16
