"""examples.tensorop_gemm from the registry: exact on small-integer operands (the fp32 sums are
exact, so one rounding into C's type must give torch's bits) at shapes that are and are not
tile multiples, on strided operands, eager and graph-replayed; the same bits and grid as the
DSL's own JIT call of the same class."""

from __future__ import annotations

import pytest

from ..conftest import family_variants
from ..kernels.reference import same_bits
from .gemm_cases import compact_k_major, gemm_operands, gemm_reference, randn_operands
from .graphs import launched_grids
from .jit import jit_call

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

SHAPES = [(128, 128, 64), (200, 136, 40), (1, 8, 8), (300, 264, 520), (64, 1024, 2048)]


def test_eager_and_graph_equal_torch(examples_registry, device_arch) -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    for entry in family_variants(examples_registry, "examples.tensorop_gemm", device_arch):
        p = dict(entry.params)
        launch = examples_registry.kernel(entry.family, entry.abi, **p).prepare()
        for m, n, k in SHAPES:
            a, b, c = gemm_operands(m, n, k, p, gen)
            launch.checked(a, b, c)
            torch.cuda.synchronize()
            assert same_bits(c, gemm_reference(a, b, c.dtype)), (p, m, n, k)
        a, b, c = gemm_operands(300, 264, 520, p, gen)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch(a, b, c)
        for _ in range(2):
            a.copy_(torch.randint(-3, 4, a.shape, device="cuda", generator=gen))
            b.copy_(torch.randint(-3, 4, b.shape, device="cuda", generator=gen))
            c.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert same_bits(c, gemm_reference(a, b, c.dtype)), p


def test_checked_refuses_a_k_the_chunks_cannot_cover(examples_registry, device_arch) -> None:
    from b12x_aot.loader import LaunchArgumentError

    (entry, *_) = family_variants(examples_registry, "examples.tensorop_gemm", device_arch)
    launch = examples_registry.kernel(entry.family, entry.abi, **entry.params).prepare()
    a, b, c = gemm_operands(64, 64, 36, dict(entry.params), torch.Generator(device="cuda").manual_seed(2))
    with pytest.raises(LaunchArgumentError, match="'k' must be a multiple of 8"):
        launch.checked(a, b, c)


@pytest.mark.dsl
def test_aot_equals_jit_bits_and_grid(examples_registry, device_arch) -> None:
    cutlass = pytest.importorskip("cutlass")
    from dsl_examples.tensorop_gemm import TensorOpGemm

    gen = torch.Generator(device="cuda").manual_seed(9)
    for entry in family_variants(examples_registry, "examples.tensorop_gemm", device_arch):
        p = dict(entry.params)
        aot = examples_registry.kernel(entry.family, entry.abi, **p).prepare()
        gemm = TensorOpGemm(cutlass.Float32, (p["tile_m"], p["tile_n"], 32), (2, 2, 1), p["stages"])
        # compact operands, marked as the DSL's GEMM examples mark them: k (and so each row)
        # a multiple of 16 bytes; any values: the same MMAs add them in the same order
        m, n, k = 300, 264, 520
        a, b, c, twin = randn_operands(m, n, k, p, gen)
        jit = jit_call(gemm, [a, b, twin], compact_k_major)
        aot.checked(a, b, c)
        jit(a, b, twin, stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        assert same_bits(c, twin), f"AOT != JIT for {p}"
        grids = launched_grids(aot, a, b, c), launched_grids(jit, a, b, twin)
        assert grids[0] == grids[1] and len(grids[0]) == 1, (p, grids)
