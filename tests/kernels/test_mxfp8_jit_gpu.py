"""quant.mxfp8: AOT cubins from the registry against the CuTe DSL's JIT path, bit for bit."""

from __future__ import annotations

import pytest

from ..conftest import family_variants
from .jit import jit_launcher
from .mxfp8_reference import BLOCK, TORCH_DTYPES, adversarial_input

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")
pytestmark = [pytest.mark.gpu, pytest.mark.dsl]


def test_aot_equals_jit(gpu_registry, device_arch) -> None:
    from b12x_aot.kernels.mxfp8 import Mxfp8Quant

    entries = family_variants(gpu_registry, "quant.mxfp8", device_arch)
    gen = torch.Generator(device="cuda").manual_seed(5)
    for entry in entries:
        p = dict(entry.params)
        prepared = gpu_registry.kernel(entry.family, entry.abi, **p).prepare()
        m, k = 37, p["K"]
        x = adversarial_input(m, k, TORCH_DTYPES[p["dtype"]], gen, "cuda")
        outs = []
        for poison in (0x5A, 0xA5):  # two poisons: a byte neither path writes cannot compare equal
            q = torch.full((m, k), poison, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
            s = torch.full((m, k // BLOCK), poison, dtype=torch.uint8, device="cuda")
            outs.append((q, s))
        (q_aot, s_aot), (q_jit, s_jit) = outs
        prepared.checked(q_aot, s_aot, x, m)
        launch = jit_launcher(Mxfp8Quant, entry, [q_jit, s_jit, x, m])
        launch(q_jit, s_jit, x, m)
        torch.cuda.synchronize()
        assert torch.equal(q_aot.view(torch.uint8), q_jit.view(torch.uint8)), f"q: AOT != JIT for {p}"
        assert torch.equal(s_aot, s_jit), f"scales: AOT != JIT for {p}"
