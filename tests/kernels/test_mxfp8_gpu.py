"""quant.mxfp8 on a GPU: every variant, bit-exact against the torch reference.

Outputs are poisoned before each launch and carry a poisoned guard row past ``M`` that must
survive; inputs must come back unchanged; a captured CUDA graph replayed over new inputs must
equal eager launches.
"""

from __future__ import annotations

import itertools

import pytest

from ..conftest import family_variants
from .mxfp8_reference import BLOCK, TORCH_DTYPES, adversarial_input, quantize_mxfp8, random_input

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

FAMILY = "quant.mxfp8"
ROWS = (1, 5, 128, 8192)
POISON = (0xFF, 0x5A)  # E4M3 -NaN and an arbitrary pattern: an unwritten byte shows under one


def make_input(kind: str, m: int, params: dict, gen: torch.Generator) -> torch.Tensor:
    make = adversarial_input if kind == "adversarial" else random_input
    return make(m, params["K"], TORCH_DTYPES[params["dtype"]], gen, "cuda")


def outputs(m: int, k: int, poison: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, scales, q_guarded, scales_guarded)``: views of M rows over buffers with one guard row."""
    q_all = torch.full((m + 1, k), poison, dtype=torch.uint8, device="cuda")
    s_all = torch.full((m + 1, k // BLOCK), poison, dtype=torch.uint8, device="cuda")
    return q_all[:m].view(torch.float8_e4m3fn), s_all[:m], q_all, s_all


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def describe_mismatch(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor, per: int) -> str:
    """The first differing element: where, its block's input, and both bytes."""
    bad = (got.view(torch.uint8) != want.view(torch.uint8)).nonzero()
    if bad.numel() == 0:
        return "shapes differ"
    row, col = bad[0].tolist()
    blk = col // per
    block = x[row, blk * BLOCK : (blk + 1) * BLOCK].float().tolist()
    return (
        f"{bad.shape[0]} bytes differ; first at [{row}, {col}]: got {int(got.view(torch.uint8)[row, col]):#04x}, "
        f"want {int(want.view(torch.uint8)[row, col]):#04x}; block input {block}"
    )


def check_launch(prepared, x: torch.Tensor, ref: tuple[torch.Tensor, torch.Tensor], where: str) -> None:
    m, k = x.shape
    before = x.clone()
    results = []
    for poison in POISON:
        q, s, q_all, s_all = outputs(m, k, poison)
        prepared.checked(q, s, x, m)
        torch.cuda.synchronize()
        assert bool((q_all[m] == poison).all()) and bool((s_all[m] == poison).all()), (
            f"wrote past row {m}: {where}"
        )
        assert same_bytes(s, ref[1]), f"scales not bit-exact: {where}: {describe_mismatch(x, s, ref[1], 1)}"
        assert same_bytes(q, ref[0]), f"q not bit-exact: {where}: {describe_mismatch(x, q, ref[0], BLOCK)}"
        results.append((q.clone(), s.clone()))
    assert same_bytes(x, before), f"input changed: {where}"
    assert same_bytes(results[0][0], results[1][0]) and same_bytes(results[0][1], results[1][1])


def test_cuda_reference_matches_cpu_reference() -> None:
    """The GPU tests trust the reference on CUDA: it must agree with the CPU one bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(17)
    for dtype, rounding in itertools.product(TORCH_DTYPES.values(), ("floor", "ceil")):
        x = adversarial_input(64, 2048, dtype, gen, "cuda")
        q_gpu, s_gpu = quantize_mxfp8(x, rounding)
        q_cpu, s_cpu = quantize_mxfp8(x.cpu(), rounding)
        assert same_bytes(q_gpu.cpu(), q_cpu) and same_bytes(s_gpu.cpu(), s_cpu), (dtype, rounding)


def test_every_variant_is_bit_exact(gpu_registry, device_arch: str) -> None:
    entries = family_variants(gpu_registry, FAMILY, device_arch)
    groups: dict[tuple[str, int], list] = {}
    for entry in entries:
        groups.setdefault((entry.params["dtype"], entry.params["K"]), []).append(entry)
    gen = torch.Generator(device="cuda").manual_seed(2024)
    for (dtype, k), members in sorted(groups.items()):
        prepared = [(e, gpu_registry.kernel(FAMILY, e.abi, **e.params).prepare()) for e in members]
        for m, kind in itertools.product(ROWS, ("random", "adversarial")):
            x = make_input(kind, m, {"dtype": dtype, "K": k}, gen)
            refs = {r: quantize_mxfp8(x, r) for r in ("floor", "ceil")}
            for entry, launch in prepared:
                where = f"{dict(entry.params)} m={m} {kind}"
                check_launch(launch, x, refs[entry.params["rounding"]], where)


def test_zero_rows_launches_nothing(gpu_registry, device_arch: str) -> None:
    entry = family_variants(gpu_registry, FAMILY, device_arch)[0]
    prepared = gpu_registry.kernel(FAMILY, entry.abi, **entry.params).prepare()
    k = entry.params["K"]
    x = torch.randn(1, k, device="cuda").to(TORCH_DTYPES[entry.params["dtype"]])
    q, s, q_all, s_all = outputs(0, k, 0xFF)
    prepared.checked(q, s, x, 0)
    torch.cuda.synchronize()
    assert bool((q_all == 0xFF).all()) and bool((s_all == 0xFF).all())


def test_graph_replay_with_new_inputs_equals_eager(gpu_registry, device_arch: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(99)
    entries = family_variants(gpu_registry, FAMILY, device_arch)
    # One variant per (dtype, rounding, cta_threads), each with a different K.
    picked: dict[tuple, list] = {}
    for entry in entries:
        p = entry.params
        picked.setdefault((p["dtype"], p["rounding"], p["cta_threads"]), []).append(entry)
    chosen = [group[i % len(group)] for i, group in enumerate(picked.values())]
    for entry in chosen:
        p = dict(entry.params)
        prepared = gpu_registry.kernel(FAMILY, entry.abi, **p).prepare()
        m = 300
        static_x = make_input("adversarial", m, p, gen)
        q, s, _, _ = outputs(m, p["K"], 0xFF)
        loads = gpu_registry.stats.loads
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            prepared(q, s, static_x, m)  # warm up on the capture stream
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            prepared(q, s, static_x, m)
        assert gpu_registry.stats.loads == loads  # nothing loaded during capture
        for kind in ("random", "adversarial", "random"):
            fresh = make_input(kind, m, p, gen)
            static_x.copy_(fresh)
            q.view(torch.uint8).fill_(0xFF)
            s.fill_(0xFF)
            graph.replay()
            torch.cuda.synchronize()
            eager_q, eager_s, _, _ = outputs(m, p["K"], 0x5A)
            prepared.checked(eager_q, eager_s, fresh, m)
            torch.cuda.synchronize()
            assert same_bytes(q, eager_q) and same_bytes(s, eager_s), f"graph != eager: {p} {kind}"
            ref_q, ref_s = quantize_mxfp8(fresh, p["rounding"])
            assert same_bytes(q, ref_q) and same_bytes(s, ref_s), f"graph != reference: {p} {kind}"
