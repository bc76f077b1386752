"""examples.tensorop_gemm from the registry: exact on small-integer operands (the fp32 sums are
exact, so one rounding into C's type must give torch's bits) at shapes that are and are not
tile multiples, on strided operands, eager and graph-replayed; the same bits and grid as the
DSL's own JIT call of the same class."""

from __future__ import annotations

import pytest

from ..conftest import family_variants
from ..kernels.reference import TORCH_DTYPES, same_bits
from .graphs import launched_grids
from .jit import jit_call

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

SHAPES = [(128, 128, 64), (200, 136, 40), (1, 8, 8), (300, 264, 520), (64, 1024, 2048)]


def _operands(m: int, n: int, k: int, p: dict, gen: torch.Generator) -> list[torch.Tensor]:
    """A a column slice of a wider buffer (its row stride k + 8), B contiguous, C a slice too."""
    ab, out = TORCH_DTYPES[p["ab"]], TORCH_DTYPES[p["out"]]
    a = torch.randint(-3, 4, (m, k + 8), device="cuda", generator=gen).to(ab)[:, :k]
    b = torch.randint(-3, 4, (n, k), device="cuda", generator=gen).to(ab)
    c = torch.full((m, n + 8), float("nan"), device="cuda", dtype=out)[:, :n]
    return [a, b, c]


def _reference(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (a.double() @ b.double().t()).to(dtype)


def test_eager_and_graph_equal_torch(examples_registry, device_arch) -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    for entry in family_variants(examples_registry, "examples.tensorop_gemm", device_arch):
        p = dict(entry.params)
        launch = examples_registry.kernel(entry.family, entry.abi, **p).prepare()
        for m, n, k in SHAPES:
            a, b, c = _operands(m, n, k, p, gen)
            launch.checked(a, b, c)
            torch.cuda.synchronize()
            assert same_bits(c, _reference(a, b, c.dtype)), (p, m, n, k)
        a, b, c = _operands(300, 264, 520, p, gen)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch(a, b, c)
        for _ in range(2):
            a.copy_(torch.randint(-3, 4, a.shape, device="cuda", generator=gen))
            b.copy_(torch.randint(-3, 4, b.shape, device="cuda", generator=gen))
            c.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert same_bits(c, _reference(a, b, c.dtype)), p


def test_checked_refuses_a_k_the_chunks_cannot_cover(examples_registry, device_arch) -> None:
    from b12x_aot.loader import LaunchArgumentError

    (entry, *_) = family_variants(examples_registry, "examples.tensorop_gemm", device_arch)
    launch = examples_registry.kernel(entry.family, entry.abi, **entry.params).prepare()
    a, b, c = _operands(64, 64, 36, dict(entry.params), torch.Generator(device="cuda").manual_seed(2))
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
        a = torch.randn(m, k, device="cuda", generator=gen).to(TORCH_DTYPES[p["ab"]])
        b = torch.randn(n, k, device="cuda", generator=gen).to(TORCH_DTYPES[p["ab"]])
        c = torch.full((m, n), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["out"]])
        twin = torch.full_like(c, float("-inf"))

        def mark(t):
            return t.mark_compact_shape_dynamic(mode=1, stride_order=(0, 1), divisibility=8)

        jit = jit_call(gemm, [a, b, twin], mark)
        aot.checked(a, b, c)
        jit(a, b, twin, stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        assert same_bits(c, twin), f"AOT != JIT for {p}"
        grids = launched_grids(aot, a, b, c), launched_grids(jit, a, b, twin)
        assert grids[0] == grids[1] and len(grids[0]) == 1, (p, grids)
