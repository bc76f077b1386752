"""comm.allreduce compiles offline for all three archs and keeps the launch contract.

A subset of the real spec (same args, launch and limits) is built with b12x-compile: both
algorithms and transports, world 2 (bf16), 9 and 16 (fp16: an odd world, and the layout's
widest). Each cubin's parameter table must be the spec's C struct; its SASS must carry the
system-scope barrier (fence, release store, acquire load, CAS) with no local memory and no
NVLink multicast.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from b12x_aot.compiler._arch import ARCHS
from b12x_aot.loader._index import RegistryIndex

from ..conftest import build_spec_subset, checked_cubin, current_rows

pytestmark = pytest.mark.dsl

SUBSET = {
    "dtype": ["bf16", "fp16"],
    "world": [2, 9, 16],
    "algorithm": ["oneshot", "twoshot"],
    "transport": ["pull", "push"],
    "cta_threads": [256],
    "blocks": [8],
}
PAIRED = "(world == 2) == (dtype == 'bf16')"  # both dtypes and both worlds, half the compiles


@pytest.fixture(scope="module")
def allreduce_registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db, summary = build_spec_subset(tmp_path_factory, "comm_allreduce.yaml", SUBSET, (PAIRED,))
    assert not summary["failed"], summary
    assert not summary["rejected"] and summary["planned"]["pruned"], summary  # PAIRED's prune
    return db


def test_builds_every_arch_with_the_spec_param_table(allreduce_registry: Path) -> None:
    index = RegistryIndex(allreduce_registry)
    entries = list(index.entries.values())
    assert sorted(
        (e.arch, e.params["world"], e.params["algorithm"], e.params["transport"]) for e in entries
    ) == sorted(
        (a, w, al, t)
        for a in ARCHS
        for w in SUBSET["world"]
        for al in SUBSET["algorithm"]
        for t in SUBSET["transport"]
    )
    for entry in entries:
        dtype = entry.params["dtype"]
        assert dtype == ("bf16" if entry.params["world"] == 2 else "fp16")
        assert [(a.name, a.kind, a.dtype, a.align) for a in entry.args] == [
            ("out", "ptr", dtype, 16),
            ("inp", "ptr", dtype, 16),
            ("peers", "ptr", "u64", 8),
            ("ctrl", "ptr", "u32", 16),
            ("rank", "i32", None, None),
            ("num_elements", "i32", None, None),
            ("capacity", "i32", None, None),
        ]
        kernel = checked_cubin(index, entry).kernel(entry.symbol)
        assert [(p.offset, p.size) for p in kernel.params] == [
            (0, 8),
            (8, 8),
            (16, 8),
            (24, 8),
            (32, 4),
            (36, 4),
            (40, 4),
        ]
        assert kernel.max_threads == entry.params["cta_threads"]
        assert kernel.frame_bytes == 0 and kernel.static_smem_bytes == 0


def _has(ops: dict[str, int], *parts: str) -> bool:
    """Whether some SASS opcode carries all of ``parts`` among its dot-separated pieces."""
    return any(all(p in op.split(".") for p in parts) for op in ops)


@pytest.mark.usefixtures("needs_nvdisasm")
def test_sass_has_system_scope_barriers_and_no_spills(allreduce_registry: Path) -> None:
    rows = current_rows(allreduce_registry)
    assert len(rows) == len(RegistryIndex(allreduce_registry).entries)
    for row in rows:
        ops = row.opcodes
        where = f"{row.arch} {dict(row.params)}"
        assert ops, where
        assert row.spill_store_bytes == 0 and row.classes["local"] == 0, where
        assert not any(k.startswith(("LDL", "STL", "LDS", "STS")) for k in ops), where

        assert _has(ops, "MEMBAR", "SYS"), where  # fence.acq_rel.sys / st.release.sys
        assert _has(ops, "STG", "STRONG", "SYS"), where  # the flag's release store
        assert _has(ops, "LDG", "STRONG", "SYS"), where  # the flag's acquire load
        assert _has(ops, "ATOMG", "CAS", "SYS"), where  # the timeout record
        assert _has(ops, "BAR", "RED"), where  # the timed-out vote over the CTA
        # Data moves in 16-byte accesses; the window is read past L1.
        assert _has(ops, "LDG", "128", "STRONG", "GPU") and _has(ops, "STG", "128"), where
        # Every add is a plain fp32 add, rounded once per element pair into the dtype.
        assert _has(ops, "FADD") and not _has(ops, "FFMA"), where
        assert _has(ops, "F2FP"), where
        assert not any("MULTIMEM" in k or k.startswith(("LDGMC", "REDGMC")) for k in ops), where


def test_kernel_rejects_bad_params() -> None:
    from b12x_aot.contract import Geometry
    from b12x_aot.kernels.allreduce import AllReduce

    geometry = Geometry.parse(
        ["min(blocks, max(cdiv(num_elements, 8 * cta_threads), 1))", 1, 1], ["cta_threads", 1, 1]
    )
    good = {
        "dtype": "bf16",
        "world": 2,
        "algorithm": "oneshot",
        "transport": "pull",
        "cta_threads": 256,
        "blocks": 8,
    }
    AllReduce(geometry, geometry.bind_static(good), **good)
    for world in (3, 9, 16):  # every world up to the layout's MAX_WORLD
        AllReduce(geometry, geometry.bind_static({**good, "world": world}), **{**good, "world": world})
    for bad in (
        {"dtype": "fp32"},
        {"world": 1},
        {"world": 17},
        {"algorithm": "ring"},
        {"transport": "multicast"},
        {"blocks": 65},
        {"cta_threads": 100},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            AllReduce(geometry, geometry.bind_static({**good, **bad}), **{**good, **bad})
