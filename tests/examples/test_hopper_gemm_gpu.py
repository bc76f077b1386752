"""examples.hopper_gemm from the registry: a TMA kernel whose tensor maps the loader encodes.

Exact on small-integer operands (the fp32 sums are exact, so one rounding into C's type gives
torch's bits) at shapes that are and are not tile multiples, on strided operands, eager and
graph-replayed with new inputs; the tensor maps cached across launches on the same buffers and
the graph's node holding the encoded bytes; the same bits and grid as the DSL's own JIT call
of the same class."""

from __future__ import annotations

import pytest

from ..conftest import family_variants
from ..kernels.reference import same_bits
from .gemm_cases import compact_k_major, gemm_operands, gemm_reference, randn_operands
from .graphs import launched_grids
from .jit import jit_call

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

FAMILY = "examples.hopper_gemm"
SHAPES = [(256, 128, 64), (200, 136, 40), (1, 8, 8), (300, 264, 520), (64, 1024, 2048), (1000, 520, 192)]


def _variants(registry, arch: str) -> list:
    if arch != "sm_90a":
        pytest.skip("examples.hopper_gemm is built for sm_90a only")
    return family_variants(registry, FAMILY, arch)


def test_eager_and_graph_equal_torch(examples_registry, device_arch) -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    for entry in _variants(examples_registry, device_arch):
        p = dict(entry.params)
        launch = examples_registry.kernel(entry.family, entry.abi, **p).prepare()
        for m, n, k in SHAPES:
            a, b, c = gemm_operands(m, n, k, p, gen)
            launch.checked(a, b, c)
            torch.cuda.synchronize()
            assert same_bits(c, gemm_reference(a, b, c.dtype)), (p, m, n, k)
            c.fill_(float("nan"))
            launch(a, b, c)  # the maps of these buffers are cached now
            torch.cuda.synchronize()
            assert same_bits(c, gemm_reference(a, b, c.dtype)), (p, m, n, k, "cached")
        a, b, c = gemm_operands(300, 264, 520, p, gen)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch(a, b, c)
        other = gemm_operands(64, 64, 64, p, gen)  # launches between capture and replay change no node
        launch(*other)
        for _ in range(2):
            a.copy_(torch.randint(-3, 4, a.shape, device="cuda", generator=gen))
            b.copy_(torch.randint(-3, 4, b.shape, device="cuda", generator=gen))
            c.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert same_bits(c, gemm_reference(a, b, c.dtype)), p


def test_checked_refuses_what_tma_cannot_address(examples_registry, device_arch) -> None:
    from b12x_aot.loader import LaunchArgumentError

    (entry, *_) = _variants(examples_registry, device_arch)
    launch = examples_registry.kernel(entry.family, entry.abi, **entry.params).prepare()
    gen = torch.Generator(device="cuda").manual_seed(2)
    a, b, c = gemm_operands(64, 64, 64, dict(entry.params), gen)
    with pytest.raises(LaunchArgumentError, match="'k' must be a multiple of 8"):
        launch.checked(a[:, :36], b[:, :36], c)
    with pytest.raises(LaunchArgumentError, match=r"'a'.*aligned"):
        launch.checked(a[:, 1:57], b[:, :56], c)


@pytest.mark.dsl
def test_aot_equals_jit_bits_and_grid(examples_registry, device_arch) -> None:
    cutlass = pytest.importorskip("cutlass")
    from dsl_examples.hopper_gemm import HopperGemm

    gen = torch.Generator(device="cuda").manual_seed(9)
    for entry in _variants(examples_registry, device_arch):
        p = dict(entry.params)
        aot = examples_registry.kernel(entry.family, entry.abi, **p).prepare()
        gemm = HopperGemm(cutlass.Float32, (128, p["tile_n"], 64), (2, 1, 1), p["stages"])
        m, n, k = 300, 264, 520  # not tile multiples: TMA's zero fill and clipped stores on both sides
        a, b, c, twin = randn_operands(m, n, k, p, gen)
        jit = jit_call(gemm, [a, b, twin], compact_k_major)
        aot.checked(a, b, c)
        jit(a, b, twin, stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        assert same_bits(c, twin), f"AOT != JIT for {p}"
        grids = launched_grids(aot, a, b, c), launched_grids(jit, a, b, twin)
        assert grids[0] == grids[1] and len(grids[0]) == 1, (p, grids)
