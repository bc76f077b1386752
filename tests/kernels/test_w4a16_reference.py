"""The w4a16 torch references themselves, on the CPU: formats, route packing, the GEMM."""

from __future__ import annotations

import itertools

import pytest

from .w4a16_reference import (
    HEADER_WORDS,
    dequantize,
    max_blocks,
    moe_w4a16,
    pack_int4,
    random_weights,
    route_pack,
    scratch_image,
    unpack_int4,
    unpack_scratch,
)

torch = pytest.importorskip("torch")


def test_pack_puts_the_even_element_in_the_low_nibble() -> None:
    q = torch.tensor([[1, -2, -8, 7, 0, -1]], dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8
    assert packed.tolist() == [[0xE1, 0x78, 0xF0]]  # (1, -2) -> 0xE1: low 1, high 0xE = -2


def test_unpack_inverts_pack_over_every_value() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (3, 5, 64), generator=gen, dtype=torch.int8)
    assert torch.equal(unpack_int4(pack_int4(q)), q)
    every = torch.arange(-8, 8, dtype=torch.int8).repeat(2)
    assert torch.equal(unpack_int4(pack_int4(every)), every)


def test_pack_rejects_out_of_range_and_odd_k() -> None:
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        pack_int4(torch.tensor([8, 0]))
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [32, 128])
def test_dequantize_rounds_int4_times_scale_once(dtype: torch.dtype, group: int) -> None:
    gen = torch.Generator().manual_seed(group)
    packed, scales = random_weights(2, 8, 256, group, dtype, generator=gen)
    deq = dequantize(packed, scales, group)
    assert deq.dtype == dtype and deq.shape == (2, 8, 256)
    # Element by element from the bytes: nibble k % 2 of byte k // 2 (low first), two's
    # complement, times the scale of group k // group; exact in fp64, so rounded once.
    exact = torch.empty(2, 8, 256, dtype=torch.float64)
    for e, n, k in itertools.product(range(2), range(8), range(256)):
        nibble = (int(packed[e, n, k // 2]) >> (4 * (k % 2))) & 0xF
        exact[e, n, k] = (nibble - 16 if nibble >= 8 else nibble) * float(scales[e, n, k // group])
    assert torch.equal(deq, exact.to(dtype))
    assert torch.equal(dequantize(packed, scales, group, rounded=False), exact)


def test_block_bound() -> None:
    assert max_blocks(0, 8, 16, 256) == 0
    assert max_blocks(1, 8, 16, 256) == 1 + 8
    assert max_blocks(4096, 8, 64, 256) == 512 + 257


def _bound_holds(ids: torch.Tensor, num_experts: int, block_m: int, e_cap: int) -> None:
    packed = route_pack(ids, num_experts, block_m=block_m, e_cap=e_cap)
    blocks = packed.block_expert.numel()
    assert blocks <= max_blocks(ids.shape[0], ids.shape[1], block_m, e_cap)
    rows = packed.rows
    real = rows[rows >= 0]
    assert sorted(real.tolist()) == list(range(ids.numel()))  # every route exactly once
    assert packed.valid + packed.invalid == ids.numel()


@pytest.mark.parametrize("block_m", [16, 32, 48, 64])
def test_route_pack_is_a_stable_bucketing_into_blocks(block_m: int) -> None:
    gen = torch.Generator().manual_seed(block_m)
    m, topk, e_cap, num_experts = 37, 8, 64, 40
    ids = torch.randint(-3, 70, (m, topk), generator=gen, dtype=torch.int32)
    ids[0, 0], ids[1, 1] = 2**30, num_experts  # invalid: huge, and exactly num_experts
    packed = route_pack(ids, num_experts, block_m=block_m, e_cap=e_cap)
    flat = ids.flatten()
    valid = (flat >= 0) & (flat < num_experts)
    assert packed.invalid == int((~valid).sum())
    experts = packed.block_expert.tolist()
    zero_blocks = [i for i, e in enumerate(experts) if e == -1]
    assert zero_blocks == list(range(len(experts) - len(zero_blocks), len(experts)))  # zero bucket last
    assert [e for e in experts if e >= 0] == sorted(e for e in experts if e >= 0)
    for b, e in enumerate(experts):
        row = packed.rows[b]
        real = row[row >= 0]
        assert real.tolist() == sorted(real.tolist())  # stable: ascending route order
        assert bool((row[real.numel() :] == -1).all())  # padding only at the end
        for r in real.tolist():
            assert (flat[r].item() == e) if e >= 0 else not valid[r]
    _bound_holds(ids, num_experts, block_m, e_cap)


def test_route_pack_worst_cases_stay_within_the_bound() -> None:
    for m in (1, 2, 3, 7, 16, 33, 257):
        for e_cap in (8, 64, 256):
            ids = torch.arange(m * 8, dtype=torch.int32).reshape(m, 8) % (e_cap + 3) - 1
            _bound_holds(ids, e_cap, 16, e_cap)  # as many distinct experts as possible
            _bound_holds(torch.full((m, 8), -1, dtype=torch.int32), e_cap, 64, e_cap)


def test_num_experts_above_capacity_is_clamped() -> None:
    ids = torch.tensor([[0, 7, 8, 9]], dtype=torch.int32)
    packed = route_pack(ids, 100, block_m=16, e_cap=8)
    assert packed.block_expert.tolist() == [0, 7, -1]
    assert packed.invalid == 2


def test_unpack_scratch_reads_the_documented_layout() -> None:
    ids = torch.tensor([[3, -1], [3, 0]], dtype=torch.int32)
    m, topk, block_m, e_cap = 2, 2, 16, 8
    bound = max_blocks(m, topk, block_m, e_cap)
    s = torch.full((64,), -7, dtype=torch.int32)  # room for the header, the block map and 3 blocks
    s[:4] = torch.tensor([3, 3, 1, 0])
    s[4:7] = torch.tensor([0, 3, -1])
    base = HEADER_WORDS + bound
    s[base : base + 3 * block_m] = -1
    s[base + 0] = 3
    s[base + block_m] = 0
    s[base + block_m + 1] = 2
    s[base + 2 * block_m] = 1
    header, got = unpack_scratch(s, m, topk=topk, block_m=block_m, e_cap=e_cap)
    want = route_pack(ids, 8, block_m=block_m, e_cap=e_cap)
    assert header.tolist() == [3, 3, 1, 0]
    assert torch.equal(got.block_expert, want.block_expert) and torch.equal(got.rows, want.rows)
    image = scratch_image(want, m, s.numel(), topk=topk, block_m=block_m, e_cap=e_cap, fill=-7)
    assert torch.equal(image, s)  # the same words, written by hand above


def test_moe_reference_matches_a_per_route_loop() -> None:
    gen = torch.Generator().manual_seed(3)
    m, topk, n, k, group, experts = 5, 3, 16, 64, 32, 4
    packed, scales = random_weights(experts, n, k, group, torch.bfloat16, generator=gen)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    ids = torch.randint(-1, experts + 1, (m, topk), generator=gen, dtype=torch.int32)
    out = moe_w4a16(
        a, ids, packed, scales, group=group, num_experts=experts, e_cap=8, acc_dtype=torch.float64
    )
    deq = dequantize(packed, scales, group).double()
    for t in range(m):
        for j in range(topk):
            e = int(ids[t, j])
            want = a[t].double() @ deq[e].T if 0 <= e < experts else torch.zeros(n, dtype=torch.float64)
            assert torch.allclose(out[t, j], want, rtol=1e-12, atol=1e-12)
