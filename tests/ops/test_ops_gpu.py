"""The torch.library ops of the mxfp8_quant and moe_w4a16 families on a GPU: eager, in a CUDA graph and under
``torch.compile(fullgraph=True)``, against the torch references, with sizes refused at the
boundary and misses that name the build command."""

from __future__ import annotations

import pytest

from b12x_aot.loader import LaunchArgumentError, VariantMissError

from ..kernels.mxfp8_reference import TORCH_DTYPES, adversarial_input, quantize_mxfp8
from ..kernels.reference import one_rounding_apart
from ..kernels.w4a16_reference import moe_w4a16, random_weights

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


def _eager_graph_compiled(fn, args: tuple, fresh: tuple, check) -> None:
    """``fn`` eagerly, replayed from a graph over ``fresh`` inputs copied in, and compiled."""
    _eager_and_graph(fn, args, fresh, check)
    check(torch.compile(fn, fullgraph=True)(*fresh), fresh)


def _eager_and_graph(fn, args: tuple, fresh: tuple, check) -> None:
    """``fn`` eagerly, then replayed from a graph over ``fresh`` inputs copied in."""
    check(fn(*args), args)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn(*args)  # warm up on the capture stream
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = fn(*args)
    for static, new in zip(args, fresh, strict=True):
        if isinstance(static, torch.Tensor):
            static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    check(captured, fresh)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_mxfp8_op_eager_graph_and_compile(gpu_registry) -> None:
    from b12x_aot.ops import register_mxfp8_quant

    op = register_mxfp8_quant(gpu_registry, namespace="b12x_test_mxfp8")
    gen = torch.Generator(device="cuda").manual_seed(5)
    dtype = TORCH_DTYPES["bf16"]
    x, fresh = (adversarial_input(96, 2048, dtype, gen, "cuda") for _ in range(2))
    op.preload(x, "floor")

    def check(result, inputs) -> None:
        q, s = result
        want_q, want_s = quantize_mxfp8(inputs[0], "floor")
        torch.cuda.synchronize()
        assert _same(q, want_q) and _same(s, want_s)

    _eager_graph_compiled(lambda t: op.op(t, "floor"), (x,), (fresh,), check)
    with pytest.raises(ValueError, match="argument 'x' must be float32, float16 or bfloat16"):
        op(x.int())
    with pytest.raises(VariantMissError, match="b12x-compile"):
        op(torch.zeros(4, 96, device="cuda", dtype=dtype))  # K = 96 is not built


# The moe_w4a16 op tests' problem: an FC1 shape over 32 resident experts, bf16.
EXPERTS, N, K, GROUP, TOPK = 32, 2048, 7168, 128, 8


def moe_op_and_weights(gpu_registry, namespace: str, seed: int, experts: int = EXPERTS):
    """A registered moe_w4a16 op, a seeded generator, and int4 weights and scales."""
    from b12x_aot.ops import register_moe_w4a16

    gen = torch.Generator(device="cuda").manual_seed(seed)
    w, s = random_weights(experts, N, K, GROUP, torch.bfloat16, device="cuda", generator=gen)
    return register_moe_w4a16(gpu_registry, namespace=namespace), gen, w, s


def moe_inputs(m: int, w, s, gen, experts: int = EXPERTS, dtype=torch.bfloat16) -> tuple:
    """The op's tensors for ``m`` tokens: activations, ``w``, ``s`` and route ids, some of them
    invalid (-1 and ``experts``)."""
    a = torch.randn(m, K, device="cuda", generator=gen).to(dtype)
    ids = torch.randint(-1, experts + 1, (m, TOPK), device="cuda", generator=gen, dtype=torch.int32)
    return a, w, s, ids


def tile_of(params: dict) -> tuple:
    """An moe.w4a16 entry's params as a tile of the op's table."""
    from b12x_aot.ops.moe_w4a16_tiles import shipped_tiles

    return tuple(params[key] for key in shipped_tiles().params)


def first_held(gpu_registry, regime: str, picked: dict) -> tuple:
    """The first tile of ``regime`` that the registry holds for this GPU's arch and the problem
    of ``picked`` (an entry's params): the one the op should take (a tail_rows tile, say, is
    built for sm_90a only)."""
    from b12x_aot.ops.moe_w4a16_tiles import shipped_tiles

    table = shipped_tiles()
    problem = {key: v for key, v in picked.items() if key not in table.params}
    arch = gpu_registry.arch(0)
    held = {
        tile_of(e.params)
        for e in gpu_registry.entries()
        if e.family == "moe.w4a16" and e.arch == arch and all(e.params[k] == v for k, v in problem.items())
    }
    return next(tile for tile in table.regimes[regime] if tile in held)


def check_moe(out: torch.Tensor, given: tuple, experts: int = EXPERTS) -> None:
    """``out`` of the op on ``given`` (:func:`moe_inputs`) against the fp64 reference: relative
    error under 1e-2, and invalid routes' rows exact zeros."""
    a, w, s, ids = given
    ref = moe_w4a16(
        a.double(), ids, w, s, group=GROUP, num_experts=experts, e_cap=256, acc_dtype=torch.float64
    )
    torch.cuda.synchronize()
    err = (out.double() - ref).norm() / ref.norm()
    assert err < 1e-2, float(err)
    invalid = (ids < 0) | (ids >= experts)
    assert bool((out[invalid] == 0).all())


def test_moe_w4a16_op_eager_graph_and_compile(gpu_registry) -> None:
    op, gen, w, s = moe_op_and_weights(gpu_registry, "b12x_test_moe", 8)
    experts, topk, dtype = EXPERTS, TOPK, torch.bfloat16
    for m in (3, 600):  # a decode tile, then a prefill one
        args, fresh = moe_inputs(m, w, s, gen), moe_inputs(m, w, s, gen)
        op.preload(args[0], w, s, topk, dtype)
        _eager_graph_compiled(
            lambda a, w_, s_, ids: op.op(a, w_, s_, ids, experts, dtype), args, fresh, check_moe
        )
    a, _, _, ids = moe_inputs(3, w, s, gen)
    with pytest.raises(LaunchArgumentError, match="argument 'w'"):
        op(a, w[:, :, :-1].contiguous(), s, ids, experts, dtype)  # packed rows one byte short
    with pytest.raises(LaunchArgumentError, match="argument 'scales'"):
        op(a, w, s[: experts // 2], ids, experts // 2 + 1, dtype)  # fewer experts than num_experts says


def test_moe_w4a16_preload_covers_every_decode_batch(gpu_registry) -> None:
    # One preload at 16 tokens (the decode regime); a 1-token batch picks a split-k regime (its
    # few experts' tiles would leave the SMs idle) and still loads nothing during capture.
    # The fewest resident experts that 16 tokens are expected to fill the SMs from on this GPU.
    from b12x_aot.ops.moe_w4a16_tiles import shipped_tiles

    table = shipped_tiles()
    k, topk = K, TOPK
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    experts = next(
        (e for e in range(topk, 16 * topk + 1) if table.decode_regime(16, topk, e, N, sms=sms) == "decode"),
        None,
    )
    if experts is None or table.decode_regime(1, topk, experts, N, sms=sms) == "decode":
        pytest.skip(f"no expert count puts 16 and 1 tokens in different regimes on {sms} SMs")
    op, gen, w, s = moe_op_and_weights(gpu_registry, "b12x_test_moe_preload", 9, experts)
    regimes = [op.regime(m, topk=topk, experts=experts, n=N, device=0) for m in (16, 1)]
    assert regimes[0] == "decode" and regimes[1] in dict(table.decode_bands), regimes
    dtype = torch.bfloat16
    op.preload(torch.zeros(16, k, device="cuda", dtype=dtype), w, s, topk, dtype)
    a = torch.randn(1, k, device="cuda", generator=gen).to(dtype)
    ids = torch.randperm(experts, device="cuda", generator=gen)[:topk].to(torch.int32)[None]
    loads = gpu_registry.stats.loads
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = op.op(a, w, s, ids, experts, dtype)
    assert gpu_registry.stats.loads == loads, "a variant was loaded during capture"
    graph.replay()
    eager = op.op(a, w, s, ids, experts, dtype)
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_moe_w4a16_prefill_regimes_follow_the_routes_per_expert_and_preload_together(gpu_registry) -> None:
    # 512 tokens x 8 routes over 32 experts average 128 per expert: many end on a block of at
    # most 16 routes, so the op leads with the tail_rows tile (where the arch has it); 384
    # tokens (96 each) do not. One preload, at either size, loads both: capturing the other
    # loads nothing.
    op, gen, w, s = moe_op_and_weights(gpu_registry, "b12x_test_moe_prefill", 13)
    dtype = torch.bfloat16
    sizes = {"prefill": 384, "prefill_tail": 512}
    for regime, m in sizes.items():
        assert op.regime(m, topk=TOPK, experts=EXPERTS, n=N, device=0) == regime
        assert (op.tiles.riding(m * TOPK, EXPERTS) >= op.tiles.tail_share) == (regime == "prefill_tail")
    op.preload(torch.zeros(sizes["prefill"], K, device="cuda", dtype=dtype), w, s, TOPK, dtype)
    loads = gpu_registry.stats.loads
    for regime, m in sizes.items():
        args, fresh = moe_inputs(m, w, s, gen), moe_inputs(m, w, s, gen)
        picked = op.launches_for(args[0], w, s, TOPK, dtype)[1].entry.params
        assert tile_of(picked) == first_held(gpu_registry, regime, picked), (regime, picked)
        _eager_graph_compiled(
            lambda a, w_, s_, ids: op.op(a, w_, s_, ids, EXPERTS, dtype), args, fresh, check_moe
        )
    assert gpu_registry.stats.loads == loads, "a variant was loaded after the preload"


def test_moe_w4a16_cluster_regimes_match_the_reference_eager_and_in_graphs(gpu_registry) -> None:
    # A narrow shape (n 256) at 1 and 4 tokens has too few tiles to fill an H200's SMs: a
    # cluster of CTAs splits each tile's k (4 and 2 CTAs), and the op still meets the reference.
    # A preload at 16 tokens covers both: nothing loads after it.
    from b12x_aot.ops import register_moe_w4a16

    n, experts, dtype = 256, EXPERTS, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(12)
    w, s = random_weights(experts, n, K, GROUP, dtype, device="cuda", generator=gen)
    op = register_moe_w4a16(gpu_registry, namespace="b12x_test_moe_cluster")
    op.preload(torch.zeros(16, K, device="cuda", dtype=dtype), w, s, TOPK, dtype)
    loads = gpu_registry.stats.loads
    clustered = 0
    for m in (1, 4):
        args, fresh = moe_inputs(m, w, s, gen), moe_inputs(m, w, s, gen)
        regime = op.regime(m, topk=TOPK, experts=experts, n=n, device=0)
        _, gemm = op.launches_for(args[0], w, s, TOPK, dtype)
        want_ctas = op.tiles.choices(regime)[0]["k_ctas"]
        assert gemm.entry.params["k_ctas"] == want_ctas, (regime, gemm.entry.params)
        clustered += want_ctas > 1
        _eager_graph_compiled(
            lambda a, w_, s_, ids: op.op(a, w_, s_, ids, experts, dtype), args, fresh, check_moe
        )
    assert gpu_registry.stats.loads == loads, "a variant was loaded after the preload"
    if not clustered:
        pytest.skip("this GPU's SM count puts neither batch in a cluster regime")


def test_moe_w4a16_decode_regimes_on_n64k128_weights_take_their_lead_tiles(gpu_registry) -> None:
    # On atom-ordered weights each decode regime leads with a bulk-copy tile (the 2-stage
    # four-part ones: 64 wide in clusters of 2 and alone, 128 wide in `resident`). At the
    # fewest tokens that pick each regime on this GPU, N 256 and FC1's N 2048 over 32 experts
    # (an H100 / H200: cluster4 at 1 token and cluster2 at 3 for N 256; tiny at 1, resident
    # at 2 and decode at 6 for N 2048), the op takes the regime's first held tile and meets
    # the reference, eagerly and replayed from a graph.
    from b12x_aot.ops import register_moe_w4a16, w4a16_weights

    op = register_moe_w4a16(gpu_registry, namespace="b12x_test_moe_regimes", w_layout="n64k128")
    dtype = torch.bfloat16
    seen = set()
    for n in (256, N):
        gen = torch.Generator(device="cuda").manual_seed(14)
        w, s = random_weights(EXPERTS, n, K, GROUP, dtype, device="cuda", generator=gen)
        atoms = w4a16_weights(w, "n64k128")
        firsts: dict[str, int] = {}
        for m in range(1, op.decode_tokens + 1):
            firsts.setdefault(op.regime(m, topk=TOPK, experts=EXPERTS, n=n, device=0), m)
        for regime, m in firsts.items():
            (a, _, _, ids), (a2, _, _, ids2) = moe_inputs(m, w, s, gen), moe_inputs(m, w, s, gen)
            picked = op.launches_for(a, atoms, s, TOPK, dtype)[1].entry.params
            assert tile_of(picked) == first_held(gpu_registry, regime, picked), (n, m, regime, picked)
            seen.add(regime)

            def check(out, given, w=w) -> None:  # the reference reads nk rows
                check_moe(out, (given[0], w, given[2], given[3]))

            # torch.compile would recompile per regime and add nothing to the tile check.
            _eager_and_graph(
                lambda a_, w_, s_, ids_: op.op(a_, w_, s_, ids_, EXPERTS, dtype),
                (a, atoms, s, ids),
                (a2, atoms, s, ids2),
                check,
            )
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:  # an H100 / H200
        assert seen == {"cluster4", "cluster2", "tiny", "resident", "decode"}, seen


def test_moe_w4a16_op_on_n64k128_weights_gives_the_nk_results(gpu_registry) -> None:
    # The op built for atom-ordered weights takes the first tile of each regime, the one for
    # nk rows the first without bulk weight copies (which only n64k128 variants have): on an
    # H200, the 2-stage four-part split-k tile at 1 and 16 tokens (n64k128), the 3-stage
    # four-part one at 1 and the two-part one at 16 (nk), the tail_rows prefill tile for
    # both at 512 (32 experts: prefill_tail). The prefill tile gives the same bits; decode
    # tiles sum other k's per MMA step in each order, so their fp32 sums may differ in the
    # last bits: one bf16 rounding step apart.
    from b12x_aot.ops import register_moe_w4a16, w4a16_weights

    rows_op, gen, w, s = moe_op_and_weights(gpu_registry, "b12x_test_moe_rows", 10)
    atoms_op = register_moe_w4a16(gpu_registry, namespace="b12x_test_moe_atoms", w_layout="n64k128")
    atoms = w4a16_weights(w, "n64k128")
    dtype = torch.bfloat16
    for m in (1, 16, 512):
        a = torch.randn(m, K, device="cuda", generator=gen).to(dtype)
        ids = torch.randint(-1, EXPERTS, (m, TOPK), device="cuda", generator=gen, dtype=torch.int32)
        want = rows_op(a, w, s, ids, EXPERTS, dtype)
        got = atoms_op(a, atoms, s, ids, EXPERTS, dtype)
        regime = rows_op.regime(m, topk=TOPK, experts=EXPERTS, n=N, device=0)
        picks = {}
        for op, x, layout in ((rows_op, w, "nk"), (atoms_op, atoms, "n64k128")):
            params = op.launches_for(a, x, s, TOPK, dtype)[1].entry.params
            assert params["w_layout"] == layout
            picks[layout] = tile_of(params)
            assert picks[layout] == first_held(gpu_registry, regime, params), (regime, picks)
        assert picks["nk"][rows_op.tiles.params.index("w_copy")] != "bulk", picks
        torch.cuda.synchronize()
        if picks["nk"][0] != 16:
            assert picks["nk"] == picks["n64k128"] and torch.equal(got, want), m
        else:
            assert one_rounding_apart(got, want), m
    with pytest.raises(LaunchArgumentError, match="w_layout"):
        register_moe_w4a16(gpu_registry, namespace="b12x_test_moe_bad", w_layout="kn")
