"""AOT cubins from the registry against the CuTe DSL's JIT path of the same kernel, bit for bit."""

from __future__ import annotations

import pytest

from ..conftest import family_variants
from .jit import jit_launcher
from .reference import TORCH_DTYPES, same_bits
from .test_topk_sum_gpu import NUM_EXPERTS, make_inputs

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")
pytestmark = [pytest.mark.gpu, pytest.mark.dsl]


def test_aot_equals_jit(gpu_registry, device_arch) -> None:
    from b12x_aot.kernels.topk_sum import TopKSum

    entries = family_variants(gpu_registry, "moe.topk_sum", device_arch)
    gen = torch.Generator(device="cuda").manual_seed(77)
    for entry in entries:
        p = dict(entry.params)
        prepared = gpu_registry.kernel(entry.family, entry.abi, **p).prepare()
        m = 37
        inputs = make_inputs(m, p, gen)
        aot = torch.full((m, p["hidden"]), float("nan"), device="cuda", dtype=TORCH_DTYPES[p["output"]])
        jit = torch.full_like(aot, float("-inf"))  # another poison: unwritten cannot compare equal
        args = [aot, inputs["routed"], inputs["weights"], inputs["route_ids"], m, NUM_EXPERTS]
        prepared.checked(*args)
        launch = jit_launcher(TopKSum, entry, [jit, *args[1:]])
        launch(jit, *args[1:])
        torch.cuda.synchronize()
        assert same_bits(aot, jit), f"AOT != JIT for {p}"
