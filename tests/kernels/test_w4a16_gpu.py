"""moe.route_pack + moe.w4a16 on a GPU, against the torch references in w4a16_reference.py."""

from __future__ import annotations

import pytest

from b12x_aot.ops import w4a16_weights

from ..conftest import family_variants
from .reference import one_rounding_apart, same_bits
from .w4a16_cases import MAX_ROWS, Case, experts_for, prepared, route_ids, route_pack_for
from .w4a16_reference import route_pack, scratch_image, unpack_scratch

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

ROWS = (1, 3, 7, 64, MAX_ROWS)
TOL = {"fp32": 1e-4, "bf16": 1e-2, "fp16": 1e-2}  # relative Frobenius error vs fp64


def _twins(entries, keep, **change) -> list[tuple]:
    """``(entry, twin)`` for each entry whose params pass ``keep`` and whose twin, the same
    params with ``change`` applied, is among ``entries`` too."""
    by_params = {tuple(sorted(e.params.items())): e for e in entries}
    pairs = [
        (e, by_params.get(tuple(sorted({**e.params, **change}.items())))) for e in entries if keep(e.params)
    ]
    return [(e, twin) for e, twin in pairs if twin is not None]


def _registry_twins(gpu_registry, device_arch: str, keep, what: str, **change) -> list[tuple]:
    """:func:`_twins` over the registry's moe.w4a16 variants; skips the test (no ``what`` in
    this registry) when there are none."""
    pairs = _twins(family_variants(gpu_registry, "moe.w4a16", device_arch), keep, **change)
    if not pairs:
        pytest.skip(f"no {what} in this registry")
    return pairs


def _twin_outputs(gpu_registry, device_arch: str, pairs, tokens, gen, adapt=None, setup=None):
    """For each ``(entry, twin)`` pair and token count: ``(twin params, tokens, twin's output,
    entry's output)``, both on the same inputs (``setup(case)`` first sets some of them, e.g.
    the routes; ``adapt(entry_case, twin_case)`` fits them to the entry, e.g. its weight
    layout)."""
    for entry, twin in pairs:
        p = dict(twin.params)
        pack = route_pack_for(gpu_registry, device_arch, p)
        for m in tokens:
            a = Case(p, m, gen, pack)
            if setup is not None:
                setup(a)
            a.launch(pack, prepared(gpu_registry, twin))
            b = a.twin()
            if adapt is not None:
                adapt(b, a)
            b.launch(pack, prepared(gpu_registry, entry))
            torch.cuda.synchronize()
            yield p, m, a.out, b.out


def _exact_operands(p: dict) -> bool:
    """Decode tiles scale fp32 partial sums of exact int4 products (W4A16Params.fp32_scale)."""
    return p["block_m"] == 16 and p["group"] % p["tile_k"] == 0


def test_route_pack_matches_reference_exactly(gpu_registry, device_arch: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(7)
    for entry in family_variants(gpu_registry, "moe.route_pack", device_arch):
        p = dict(entry.params)
        pack = prepared(gpu_registry, entry)
        words = pack.shapes(num_tokens=MAX_ROWS, num_experts=p["e_cap"])["scratch"]
        scratch = torch.empty(words, device="cuda", dtype=torch.int32)
        shape = {"topk": p["topk"], "block_m": p["block_m"], "e_cap": p["e_cap"]}
        for m in (0, *ROWS):
            experts = experts_for(p) if m % 2 else p["e_cap"]
            ids = route_ids(max(m, 1), p["topk"], experts, gen)[:m]
            before = ids.clone()
            scratch.fill_(-5)  # a padding row left unwritten would show, not an earlier m's -1
            pack.checked(scratch, ids, m, experts)
            torch.cuda.synchronize()
            header, got = unpack_scratch(scratch, m, **shape)
            want = route_pack(ids.cpu(), experts, block_m=p["block_m"], e_cap=p["e_cap"])
            where = f"{p} m={m}"
            assert header.tolist() == [want.block_expert.numel(), want.valid, want.invalid, 0], where
            assert torch.equal(got.block_expert, want.block_expert), where
            assert torch.equal(got.rows, want.rows), where
            image = scratch_image(want, m, scratch.numel(), **shape, fill=-5)
            assert torch.equal(scratch.cpu(), image), f"{where}: words past the used blocks were written"
            assert same_bits(ids, before), where


def test_every_variant_matches_reference(gpu_registry, device_arch: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for entry in family_variants(gpu_registry, "moe.w4a16", device_arch):
        p = dict(entry.params)
        gemm, pack = prepared(gpu_registry, entry), route_pack_for(gpu_registry, device_arch, p)
        weights = None
        for m in ROWS:
            case = Case(p, m, gen, pack, weights=weights)
            weights = (case.rows, case.s)  # one weight draw per variant keeps the test fast
            before = {name: t.clone() for name, t in case.inputs().items()}
            case.launch(pack, gemm)
            torch.cuda.synchronize()
            where = f"{p} m={m}"
            out = case.out
            assert not torch.isnan(out).any(), f"unwritten or NaN output: {where}"
            zero_rows = out[case.invalid()]
            assert same_bits(zero_rows, torch.zeros_like(zero_rows)), f"invalid rows not exact zeros: {where}"
            exact = case.reference(rounded=False)  # the dequant(w) = int4 * s, no rounding
            err = ((out.double() - exact).norm() / exact.norm().clamp_min(1e-30)).item()
            assert err < 1e-2, f"relative error {err:.2e} vs exact dequant: {where}"
            ref = exact if _exact_operands(p) else case.reference(rounded=True)  # the kernel's operands
            err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            assert err < TOL[p["output"]], f"relative error {err:.2e} vs its operands: {where}"
            for name, t in case.inputs().items():
                assert same_bits(t, before[name]), f"input {name} changed: {where}"


def test_invalid_ids_give_exact_zero_rows_and_read_no_weights(gpu_registry, device_arch: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(5)
    entry = family_variants(gpu_registry, "moe.w4a16", device_arch)[0]
    p = dict(entry.params)
    gemm, pack = prepared(gpu_registry, entry), route_pack_for(gpu_registry, device_arch, p)
    case = Case(p, 64, gen, pack, invalid_fraction=1.0)
    assert set(case.ids.unique().tolist()) <= {-1, case.experts, 2**30}  # every route invalid
    case.w.fill_(0x88)  # if any weight were read the rows would be far from zero; they are NaN-free anyway
    case.s.fill_(float("nan"))  # a scale read would poison the row
    case.launch(pack, gemm)
    torch.cuda.synchronize()
    assert same_bits(case.out, torch.zeros_like(case.out))


def replay_equals_eager(gpu_registry, device_arch: str, entry, gen, m: int = 64, setup=None) -> None:
    """Capture one launch pair of ``m`` tokens, replay it on three fresh input sets (each set
    up by ``setup(case)`` first, as in :func:`_twin_outputs`): each equals an eager launch."""
    p = dict(entry.params)
    gemm, pack = prepared(gpu_registry, entry), route_pack_for(gpu_registry, device_arch, p)
    static = Case(p, m, gen, pack)
    if setup is not None:
        setup(static)
    loads = gpu_registry.stats.loads
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        static.launch(pack, gemm, checked=False)  # warm up on the capture stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static.launch(pack, gemm, checked=False)
    assert gpu_registry.stats.loads == loads  # nothing loaded during capture
    for _ in range(3):
        fresh = Case(p, m, gen, pack)
        if setup is not None:
            setup(fresh)
        for name, t in fresh.inputs().items():
            static.inputs()[name].copy_(t)
        static.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        fresh.launch(pack, gemm)
        torch.cuda.synchronize()
        assert same_bits(static.out, fresh.out), f"graph != eager: {p}"


def test_graph_replay_with_new_inputs_equals_eager(gpu_registry, device_arch: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(99)
    entries = family_variants(gpu_registry, "moe.w4a16", device_arch)
    for entry in entries[:: max(1, len(entries) // 6)]:
        replay_equals_eager(gpu_registry, device_arch, entry, gen)


def test_split_k_variants_are_deterministic_and_replay_in_graphs(gpu_registry, device_arch: str) -> None:
    # k-parts (and a cluster's CTAs) add their sums in a fixed order: the same inputs give the
    # same bits, launch to launch.
    gen = torch.Generator(device="cuda").manual_seed(17)
    split = [
        e
        for e in family_variants(gpu_registry, "moe.w4a16", device_arch)
        if e.params.get("split_k", 1) > 1 or e.params.get("k_ctas", 1) > 1
    ]
    if not split:
        pytest.skip("no split-k variant in this registry")
    for entry in split:
        p = dict(entry.params)
        gemm, pack = prepared(gpu_registry, entry), route_pack_for(gpu_registry, device_arch, p)
        for m in (1, 4, 16):
            one = Case(p, m, gen, pack)
            one.launch(pack, gemm)
            for _ in range(3):
                again = one.twin()
                again.launch(pack, gemm)
                torch.cuda.synchronize()
                assert same_bits(one.out, again.out), f"split-k launches differ: {p} m={m}"
        replay_equals_eager(gpu_registry, device_arch, entry, gen)


def test_cluster_variants_are_one_rounding_from_their_one_cta_twins(gpu_registry, device_arch: str) -> None:
    # A cluster only moves k shares to other CTAs and adds the CTA sums in rank order: each
    # output sums the same products as the one-CTA variant, in another fp32 association.
    gen = torch.Generator(device="cuda").manual_seed(23)
    pairs = _registry_twins(
        gpu_registry,
        device_arch,
        lambda p: p.get("k_ctas", 1) > 1,
        "cluster variant with a one-CTA twin",
        k_ctas=1,
    )
    for p, m, one, many in _twin_outputs(gpu_registry, device_arch, pairs, (1, 5, 40), gen):
        assert one_rounding_apart(many, one), f"k_ctas vs 1: {p} m={m}"


def test_bulk_weight_copies_give_the_bits_of_cp_async(gpu_registry, device_arch: str) -> None:
    # w_copy only changes how weight bytes reach shared memory (and where in it the compute
    # finds them): the same MMAs on the same operands, so the same bits, at 1, 16 and 40 tokens
    # (one and two token atoms, zero-bucket blocks); a graph replays one.
    gen = torch.Generator(device="cuda").manual_seed(29)
    pairs = _registry_twins(
        gpu_registry,
        device_arch,
        lambda p: p.get("w_copy") == "bulk",
        "bulk-copy variant with a cp.async twin",
        w_copy="cp_async",
    )
    for p, m, plain, bulk in _twin_outputs(gpu_registry, device_arch, pairs, (1, 16, 40), gen):
        assert same_bits(plain, bulk), f"bulk vs cp_async: {p} m={m}"
    replay_equals_eager(gpu_registry, device_arch, pairs[0][0], gen)


def test_variants_differing_only_in_cta_threads_are_bit_identical(gpu_registry, device_arch: str) -> None:
    # CTA size is a scheduling choice: 256 vs 512 threads (mma.sync decode tiles) and 128 vs 256
    # vs 512 (wgmma tiles, one warpgroup per m64 chunk or several) must give the same bits.
    gen = torch.Generator(device="cuda").manual_seed(11)
    entries = family_variants(gpu_registry, "moe.w4a16", device_arch)
    by_rest: dict[tuple, dict[int, object]] = {}
    for e in entries:
        rest = tuple(sorted((k, v) for k, v in e.params.items() if k != "cta_threads"))
        by_rest.setdefault(rest, {})[e.params["cta_threads"]] = e
    groups = [sorted(v.items()) for v in by_rest.values() if len(v) > 1]
    if not groups:
        pytest.skip("no two variants differ only in cta_threads")
    for group in groups:
        (t0, base), others = group[0], group[1:]
        p = dict(base.params)
        pack = route_pack_for(gpu_registry, device_arch, p)
        for m in (3, 64, 4096):
            one = Case(p, m, gen, pack)
            one.launch(pack, prepared(gpu_registry, base))
            for t, entry in others:
                two = one.twin()
                two.launch(pack, prepared(gpu_registry, entry))
                torch.cuda.synchronize()
                assert same_bits(one.out, two.out), f"{t0} vs {t} threads differ: {p} m={m}"


def test_weight_layouts_give_the_same_results(gpu_registry, device_arch: str) -> None:
    # w_layout is a byte order, not a numeric choice: each n64k128 variant on what
    # w4a16_weights makes gives the bits of its nk twin on the rows. Decode tiles (block_m 16)
    # sum other k's per MMA step in each order: their outputs are one rounding apart at most.
    gen = torch.Generator(device="cuda").manual_seed(21)
    pairs = _registry_twins(
        gpu_registry,
        device_arch,
        lambda p: p.get("w_layout") == "n64k128",
        "n64k128 variant with an nk twin",
        w_layout="nk",
    )

    def atom_weights(two: Case, one: Case) -> None:
        two.w = w4a16_weights(one.rows, "n64k128")

    for p, m, rows, atoms in _twin_outputs(gpu_registry, device_arch, pairs, (1, 300), gen, atom_weights):
        if p["block_m"] != 16:
            assert same_bits(rows, atoms), f"n64k128 differs from nk: {p} m={m}"
        else:
            assert one_rounding_apart(atoms, rows), f"n64k128 decode strays from nk: {p} m={m}"


# Twins that compute riding blocks (an expert's short last block taken along by the block
# before it) with the same wgmmas in the same k order: (which variants, what the skip names,
# the twin's params).
RIDING_TWINS = {
    # tail_rows only moves an expert's short last block into the CTAs of the block before it (a
    # wider wgmma over the same k-loop).
    "tail_rows": (
        lambda p: p.get("tail_rows", 0) > 0,
        "tail_rows variant with a tail_rows 0 twin",
        {"tail_rows": 0},
    ),
    # Two warpgroups of two m64 chunks share one activation tile where the 128-wide tile has one
    # warpgroup of two: each chunk's wgmmas, their order and the riding blocks are the same.
    "tile_n_256": (
        lambda p: p["tile_n"] == 256,
        "256-wide variant with a 128-wide twin",
        {"tile_n": 128, "cta_threads": 128, "stages": 4},
    ),
    # A copy warpgroup changes who issues the copies and how a ring slot changes hands
    # (mbarriers, no CTA barrier per k-tile), not the compute warps' wgmmas or their order.
    "copy_warps": (
        lambda p: p.get("copy_warps", 0) > 0,
        "copy-warp variant with a copy_warps 0 twin",
        {"copy_warps": 0},
    ),
}


def _riding_pairs(gpu_registry, device_arch: str, twin: str) -> list[tuple]:
    """:func:`_registry_twins` for the :data:`RIDING_TWINS` entry ``twin``."""
    keep, what, change = RIDING_TWINS[twin]
    return _registry_twins(gpu_registry, device_arch, keep, what, **change)


@pytest.mark.parametrize("twin", list(RIDING_TWINS))
def test_riding_twins_give_the_same_bits(gpu_registry, device_arch: str, twin: str) -> None:
    # Per-expert route counts around the 128-row blocks: 129 and 144 ride along, 145 and 300 do
    # not, 128 has no last partial block, 257 rides along after two full blocks, 16 alone has
    # no block before it, and 136, the last expert's, rides along into the last block in use
    # when no invalid route follows it (1,256 routes: 157 tokens of 8) and before the invalid
    # routes' block when 3 padding tokens do. A graph replays the riding blocks too.
    pairs = _riding_pairs(gpu_registry, device_arch, twin)
    _riding_twins_agree(gpu_registry, device_arch, pairs, f"{twin} vs its twin")


def test_copy_warps_give_the_bits_of_their_twins_at_any_size(gpu_registry, device_arch: str) -> None:
    # Beyond the riding blocks: random routes at 3, 64 and 4,096 tokens (ring slots reused many
    # times over) give the copy_warps 0 twin's bits.
    pairs = _riding_pairs(gpu_registry, device_arch, "copy_warps")
    gen = torch.Generator(device="cuda").manual_seed(37)
    for p, m, plain, split in _twin_outputs(gpu_registry, device_arch, pairs, (3, 64, 4096), gen):
        assert same_bits(plain, split), f"copy_warps vs 0: {p} m={m}"


def _riding_twins_agree(gpu_registry, device_arch: str, pairs, what: str) -> None:
    """Each pair's outputs are the same bits on routes crafted around 128-row blocks."""
    gen = torch.Generator(device="cuda").manual_seed(31)
    counts = {0: 129, 1: 144, 2: 145, 3: 128, 4: 257, 5: 16, 7: 300, 9: 1, 11: 136}
    routes = torch.cat([torch.full((c,), e, dtype=torch.int32) for e, c in counts.items()])
    orders = torch.Generator().manual_seed(3)

    def crafted(case: Case) -> None:
        ids = torch.full((case.m * case.p["topk"],), -1, dtype=torch.int32)
        ids[: routes.numel()] = routes[torch.randperm(routes.numel(), generator=orders)]
        case.ids = ids.view(case.m, case.p["topk"]).to("cuda")

    whole = -(-routes.numel() // pairs[0][0].params["topk"])
    tokens = (whole, whole + 3)
    for p, m, own, riding in _twin_outputs(gpu_registry, device_arch, pairs, tokens, gen, setup=crafted):
        assert same_bits(own, riding), f"{what}: {p} m={m}"
        assert not torch.isnan(riding).any(), f"unwritten rows: {p} m={m}"
    replay_equals_eager(gpu_registry, device_arch, pairs[0][0], gen, m=whole, setup=crafted)
