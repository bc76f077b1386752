"""comm.allreduce_rmsnorm compiles offline for sm_90a and keeps the launch contract.

A subset of the real spec (same args, launch and limits): both dtypes, hiddens 2048 and 7168,
worlds 2 (bf16) and 9 (fp16), both packs per thread. Each cubin's parameter table must be the
spec's C struct, its CTA the spec's width, and its SASS the system-scope barrier, no local
memory, plain fp32 adds and multiplies per element (no fma: every product is rounded on its own)
and a reciprocal square root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from b12x_aot.loader._index import RegistryIndex

from ..conftest import build_spec_subset, checked_cubin, current_rows

pytestmark = pytest.mark.dsl

SUBSET = {"dtype": ["bf16", "fp16"], "hidden": [2048, 7168], "world": [2, 9], "packs_per_thread": [1, 2]}
PAIRED = "(world == 2) == (dtype == 'bf16')"


@pytest.fixture(scope="module")
def fused_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db, summary = build_spec_subset(
        tmp_path_factory, "comm_allreduce_rmsnorm.yaml", SUBSET, (PAIRED,), archs=["sm_90a"]
    )
    assert not summary["failed"] and not summary["rejected"], summary
    assert summary["counts"]["built"] == 8, summary
    return db


def test_builds_with_the_spec_param_table(fused_registry: Path) -> None:
    index = RegistryIndex(fused_registry)
    entries = list(index.entries.values())
    assert len(entries) == 8
    for entry in entries:
        p = entry.params
        assert p["dtype"] == ("bf16" if p["world"] == 2 else "fp16")
        dtype = p["dtype"]
        assert [(a.name, a.kind, a.dtype) for a in entry.args] == [
            ("out", "ptr", dtype),
            ("residual_out", "ptr", dtype),
            ("inp", "ptr", dtype),
            ("residual", "ptr", dtype),
            ("gamma", "ptr", dtype),
            ("peers", "ptr", "u64"),
            ("ctrl", "ptr", "u32"),
            ("rank", "i32", None),
            ("rows", "i32", None),
            ("capacity", "i32", None),
            ("eps", "f32", None),
        ]
        kernel = checked_cubin(index, entry).kernel(entry.symbol)
        assert [(q.offset, q.size) for q in kernel.params] == [(8 * i, 8) for i in range(7)] + [
            (56, 4),
            (60, 4),
            (64, 4),
            (68, 4),
        ]
        assert kernel.max_threads == p["hidden"] // (8 * p["packs_per_thread"])
        assert kernel.frame_bytes == 0
        assert entry.static.smem == 4 * kernel.max_threads // 32  # one fp32 partial per warp


def _has(ops: dict[str, int], *parts: str) -> bool:
    return any(all(p in op.split(".") for p in parts) for op in ops)


def _count(ops: dict[str, int], name: str) -> int:
    """How many SASS instructions of opcode ``name``, any modifiers."""
    return sum(n for op, n in ops.items() if op.split(".")[0] == name)


@pytest.mark.usefixtures("needs_nvdisasm")
def test_sass_has_the_barrier_fixed_rounding_math_and_no_spills(fused_registry: Path) -> None:
    rows = current_rows(fused_registry)
    assert len(rows) == 8
    for row in rows:
        ops = row.opcodes
        where = f"{row.arch} {dict(row.params)}"
        assert row.spill_store_bytes == 0 and row.classes["local"] == 0, where
        assert not any(k.startswith(("LDL", "STL")) for k in ops), where
        assert _has(ops, "MEMBAR", "SYS") and _has(ops, "STG", "STRONG", "SYS"), where
        assert _has(ops, "LDG", "STRONG", "SYS") and _has(ops, "ATOMG", "CAS", "SYS"), where
        assert _has(ops, "LDG", "128", "STRONG", "GPU") and _has(ops, "STG", "128"), where
        # Per element: plain FADD and FMUL, 3 multiplies each (y*y, *rstd, *gamma), no fma. The
        # only FFMAs are div.rn.f32's fixed, correctly rounded sequence (with its MUFU.RCP).
        assert _count(ops, "FMUL") >= 24 * row.params["packs_per_thread"] and _has(ops, "FADD"), where
        assert _count(ops, "FFMA") <= 16 and _has(ops, "MUFU", "RCP"), where
        assert _has(ops, "MUFU", "RSQ") and _has(ops, "SHFL", "BFLY") and _has(ops, "F2FP"), where
        assert not any("MULTIMEM" in k for k in ops), where


def test_kernel_rejects_bad_params() -> None:
    from b12x_aot.contract import Geometry
    from b12x_aot.kernels.allreduce_rmsnorm import AllReduceRMSNorm

    geometry = Geometry.parse(["rows", 1, 1], ["hidden // (8 * packs_per_thread)", 1, 1])
    good = {"dtype": "bf16", "hidden": 4096, "world": 2, "packs_per_thread": 1}
    kernel = AllReduceRMSNorm(geometry, geometry.bind_static(good), **good)
    assert (kernel.cta_threads, kernel.warps) == (512, 16)
    for bad in ({"dtype": "fp32"}, {"hidden": 1024}, {"world": 1}, {"world": 17}, {"packs_per_thread": 3}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AllReduceRMSNorm(geometry, geometry.bind_static({**good, **bad}), **{**good, **bad})
