"""quant.mxfp8 compiles offline for all three archs and keeps the launch contract.

A subset of the real spec (same args, launch and limits; fewer params) is built with
b12x-compile. Each cubin's own parameter table must be the spec's C struct, and its SASS must
use 16-byte global loads and stores and no local memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from b12x_aot.compiler._arch import ARCHS
from b12x_aot.loader._index import RegistryIndex

from ..conftest import build_spec_subset, checked_cubin, current_rows

pytestmark = pytest.mark.dsl

SUBSET = {"dtype": ["bf16", "fp16"], "K": [1536], "rounding": ["floor", "ceil"], "cta_threads": [256]}


@pytest.fixture(scope="module")
def mxfp8_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db, summary = build_spec_subset(tmp_path_factory, "quant_mxfp8.yaml", SUBSET)
    assert not summary["failed"] and not summary["rejected"], summary
    return db


def test_builds_every_arch_with_the_spec_param_table(mxfp8_registry: Path) -> None:
    entries = list(RegistryIndex(mxfp8_registry).entries.values())
    assert sorted((e.arch, e.params["dtype"], e.params["rounding"]) for e in entries) == sorted(
        (a, d, r) for a in ARCHS for d in SUBSET["dtype"] for r in SUBSET["rounding"]
    )
    index = RegistryIndex(mxfp8_registry)
    for entry in entries:
        assert [(a.name, a.kind, a.dtype, a.align) for a in entry.args] == [
            ("q", "ptr", "fp8_e4m3", 16),
            ("scales", "ptr", "u8", 1),
            ("x", "ptr", entry.params["dtype"], 16),
            ("num_rows", "i32", None, None),
        ]
        kernel = checked_cubin(index, entry).kernel(entry.symbol)
        assert [(p.offset, p.size) for p in kernel.params] == [(0, 8), (8, 8), (16, 8), (24, 4)]
        assert [p.log_align for p in kernel.params[:3]] == [4, 0, 4]  # 16-byte q and x
        assert kernel.max_threads == entry.params["cta_threads"]
        assert kernel.frame_bytes == 0 and kernel.static_smem_bytes == 0


@pytest.mark.usefixtures("needs_nvdisasm")
def test_sass_is_vectorised_and_spill_free(mxfp8_registry: Path) -> None:
    rows = current_rows(mxfp8_registry)  # the histograms the build stored from nvdisasm
    assert len(rows) == len(RegistryIndex(mxfp8_registry).entries)
    for row in rows:
        ops = row.opcodes
        assert ops, row.key
        where = f"{row.arch} {dict(row.params)}"
        # One 32-element block per thread: 64 input bytes, 32 output bytes, one scale byte.
        assert {k: v for k, v in ops.items() if k.startswith("LDG")} == {"LDG.E.128": 4}, where
        assert {k: v for k, v in ops.items() if k.startswith("STG")} == {"STG.E.128": 2, "STG.E.U8": 1}, where
        assert not any(k.startswith(("LDL", "STL", "LDS", "STS")) for k in ops), where
        # The fp32 -> E4M3 conversion is the saturating hardware one.
        assert any(k.startswith("F2FP.SATFINITE.E4M3") for k in ops), where


def test_kernel_rejects_bad_params() -> None:
    from b12x_aot.contract import Geometry
    from b12x_aot.kernels.mxfp8 import Mxfp8Quant

    geometry = Geometry.parse(["cdiv(num_rows * (K // 32), cta_threads)", 1, 1], ["cta_threads", 1, 1])
    good = {"dtype": "bf16", "K": 2048, "rounding": "floor", "cta_threads": 128}
    Mxfp8Quant(geometry, geometry.bind_static(good), **good)
    for bad in ({"dtype": "fp32"}, {"K": 2047}, {"K": 0}, {"rounding": "nearest"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Mxfp8Quant(geometry, geometry.bind_static({**good, **bad}), **{**good, **bad})
