"""examples.elementwise from the registry: torch's results on tensors of any strides, eager and
replayed in a CUDA graph, the same bits as the DSL's own JIT call, and the same grid."""

from __future__ import annotations

import pytest

from ..conftest import family_variants
from ..kernels.reference import TORCH_DTYPES, same_bits
from .graphs import launched_grids
from .jit import jit_call

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

SHAPES = [(1, 1), (37, 300), (128, 128), (257, 1031)]
OPS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}


def _operands(m: int, n: int, dtype: torch.dtype, gen: torch.Generator) -> list[torch.Tensor]:
    """a contiguous; b a transposed view; c (the output) a column slice of a wider buffer."""
    a = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
    b = torch.randn(n, m, device="cuda", generator=gen).to(dtype).t()
    c = torch.full((m, n + 5), float("nan"), device="cuda", dtype=dtype)[:, 2 : n + 2]
    return [a, b, c]


def _refill(tensors: list[torch.Tensor], gen: torch.Generator) -> None:
    for t in tensors[:2]:
        t.copy_(torch.randn(t.shape, device="cuda", generator=gen))
    tensors[2].fill_(float("nan"))


def test_eager_and_graph_equal_torch(examples_registry, device_arch) -> None:
    gen = torch.Generator(device="cuda").manual_seed(11)
    for entry in family_variants(examples_registry, "examples.elementwise", device_arch):
        p = dict(entry.params)
        launch = examples_registry.kernel(entry.family, entry.abi, **p).prepare()
        for m, n in SHAPES:
            a, b, c = _operands(m, n, TORCH_DTYPES[p["dtype"]], gen)
            launch.checked(a, b, c)
            torch.cuda.synchronize()
            assert same_bits(c, OPS[p["op"]](a, b)), (p, m, n)
        graph = torch.cuda.CUDAGraph()
        tensors = _operands(257, 1031, TORCH_DTYPES[p["dtype"]], gen)
        with torch.cuda.graph(graph):
            launch(*tensors)
        for _ in range(2):
            _refill(tensors, gen)
            graph.replay()
            torch.cuda.synchronize()
            assert same_bits(tensors[2], OPS[p["op"]](tensors[0], tensors[1])), p


def test_checked_refuses_what_the_layout_cannot_take(examples_registry, device_arch) -> None:
    from b12x_aot.loader import LaunchArgumentError

    (entry, *_) = family_variants(examples_registry, "examples.elementwise", device_arch)
    launch = examples_registry.kernel(entry.family, entry.abi, **entry.params).prepare()
    dtype = TORCH_DTYPES[entry.params["dtype"]]
    a, b, c = _operands(16, 32, dtype, torch.Generator(device="cuda").manual_seed(1))
    with pytest.raises(LaunchArgumentError, match="argument 'b' mode 1 must have extent 32"):
        launch.checked(a, b[:, :31], c)
    with pytest.raises(LaunchArgumentError, match="argument 'c' must have dtype"):
        launch.checked(a, b, c.to(torch.float64))
    with pytest.raises(LaunchArgumentError, match="argument 'a' must have 2 modes"):
        launch.checked(a.reshape(-1), b, c)


@pytest.mark.dsl
def test_aot_equals_jit_bits_and_grid(examples_registry, device_arch) -> None:
    pytest.importorskip("cutlass")
    from dsl_examples.elementwise import ElementwiseBinary

    gen = torch.Generator(device="cuda").manual_seed(5)
    for entry in family_variants(examples_registry, "examples.elementwise", device_arch):
        p = dict(entry.params)
        aot = examples_registry.kernel(entry.family, entry.abi, **p).prepare()
        tensors = _operands(257, 1031, TORCH_DTYPES[p["dtype"]], gen)
        twin = [tensors[0], tensors[1], torch.full_like(tensors[2], float("-inf"))]
        jit = jit_call(ElementwiseBinary(op=p["op"], threads=p["threads"]), twin)
        aot.checked(*tensors)
        jit(*twin, stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        assert same_bits(tensors[2], twin[2]), f"AOT != JIT for {p}"
        grids = launched_grids(aot, *tensors), launched_grids(jit, *twin)
        assert grids[0] == grids[1] and len(grids[0]) == 1, (p, grids)
