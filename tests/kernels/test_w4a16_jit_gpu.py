"""moe.route_pack + moe.w4a16: AOT cubins against the CuTe DSL's JIT path, bit for bit."""

from __future__ import annotations

import pytest

from ..conftest import family_variants
from .jit import jit_launcher
from .reference import same_bits
from .w4a16_cases import Case, prepared, route_pack_for

torch = pytest.importorskip("torch")
pytest.importorskip("cutlass")
# The 128-wide four-part decode tile sums its parts in a 64-iteration trace-time loop, which the
# DSL advises against for compile time; under warnings-as-errors that advice would fail the trace.
pytestmark = [pytest.mark.gpu, pytest.mark.dsl, pytest.mark.filterwarnings("ignore:This static loop has")]


def test_aot_equals_jit(gpu_registry, device_arch) -> None:
    from b12x_aot.kernels.route_pack import RoutePack
    from b12x_aot.kernels.w4a16 import W4A16

    gen = torch.Generator(device="cuda").manual_seed(31)
    for entry in family_variants(gpu_registry, "moe.w4a16", device_arch):
        p = dict(entry.params)
        gemm = prepared(gpu_registry, entry)
        pack = route_pack_for(gpu_registry, device_arch, p)
        aot = Case(p, 37, gen, pack)
        aot.launch(pack, gemm)
        jit = aot.twin()
        pack_args = [jit.scratch, jit.ids, jit.m, jit.experts]
        gemm_args = [jit.out, jit.a, jit.w, jit.s, jit.scratch, jit.m, jit.experts]
        jit_launcher(RoutePack, pack.entry, pack_args)(*pack_args)
        jit_launcher(W4A16, entry, gemm_args)(*gemm_args)
        torch.cuda.synchronize()
        assert same_bits(aot.scratch, jit.scratch), f"route_pack scratch: AOT != JIT for {pack.entry.params}"
        assert same_bits(aot.out, jit.out), f"w4a16: AOT != JIT for {p}"
