"""Loader resolution and packing against a registry of real cubins (no GPU needed)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from b12x_aot.compiler._cubin import inspect_cubin
from b12x_aot.loader import (
    Manifest,
    Registry,
    RegistryFormatError,
    RequirementError,
    VariantMissError,
)
from b12x_aot.loader._launch import PreparedLaunch
from b12x_aot.loader._registry import Kernel

pytestmark = pytest.mark.dsl

PARAMS = {"element": "bf16", "output": "fp32", "topk": 2, "hidden": 2048, "cta_threads": 128}


def test_resolve_hits_each_arch(built_registry: Path) -> None:
    with Registry.open(built_registry) as reg:
        assert len(reg) == 12
        for arch in ("sm_90a", "sm_100a", "sm_120a"):
            entry = reg.resolve("moe.topk_sum", 1, arch=arch, **PARAMS)
            assert entry.arch == arch and entry.params == PARAMS
            assert [a.name for a in entry.args] == [
                "out",
                "routed",
                "weights",
                "route_ids",
                "num_tokens",
                "num_experts",
            ]


def test_miss_names_nearest_spec_and_command(built_registry: Path) -> None:
    with Registry.open(built_registry) as reg, pytest.raises(VariantMissError) as err:
        reg.resolve("moe.topk_sum", 1, arch="sm_90a", **{**PARAMS, "hidden": 7168})
    msg = str(err.value)
    assert "moe.topk_sum abi=1 sm_90a" in msg and "hidden=7168" in msg
    assert "nearest variants in the registry:" in msg and "hidden=2048" in msg
    assert "spec: " in msg and "topk_small.yaml" in msg
    assert f"b12x-compile {err.value.miss.spec_path} --registry {built_registry} --arch sm_90a" in msg
    assert "--where hidden=7168" in msg
    assert reg.stats.misses == 1


def test_miss_of_unknown_family_and_arch(built_registry: Path) -> None:
    with Registry.open(built_registry) as reg:
        with pytest.raises(
            VariantMissError,
            match=re.escape("no variant of quant.mxfp8 at all; families present: moe.topk_sum abi=1"),
        ):
            reg.resolve("quant.mxfp8", 1, arch="sm_90a", k=1)
        with pytest.raises(
            VariantMissError, match=re.escape("moe.topk_sum abi=1 is built only for sm_100a, sm_120a, sm_90a")
        ):
            reg.resolve("moe.topk_sum", 1, arch="sm_89a", **PARAMS)
        with pytest.raises(VariantMissError, match="built only at abi 1"):
            reg.resolve("moe.topk_sum", 2, arch="sm_90a", **PARAMS)


def test_require_reports_every_missing_variant(built_registry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = Manifest.from_mapping(
        {
            "variants": [
                {
                    "family": "moe.topk_sum",
                    "abi": 1,
                    "params": {**PARAMS, "output": ["fp32", "bf16", "fp16"], "topk": [2, 8]},
                },
            ]
        }
    )
    with Registry.open(built_registry) as reg:
        monkeypatch.setattr(reg, "arch", lambda device: "sm_90a")
        with pytest.raises(RequirementError) as err:
            reg.require(manifest, device=0)
    misses = err.value.misses
    # Of 3 outputs x 2 topk, only (fp32, 2) and (bf16, 2) exist.
    assert len(misses) == 4
    assert {(m.params["output"], m.params["topk"]) for m in misses} == {
        ("fp16", 2),
        ("fp32", 8),
        ("bf16", 8),
        ("fp16", 8),
    }
    assert str(err.value).count("build it: b12x-compile") == 4


def test_open_rejects_non_registries(tmp_path: Path) -> None:
    with pytest.raises(RegistryFormatError, match="does not exist"):
        Registry.open(tmp_path / "absent.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(RegistryFormatError, match="is not a b12x-aot registry"):
        Registry.open(junk)


def test_prepared_buffer_matches_the_cubin_param_table(built_registry: Path) -> None:
    """Pack real values and read them back at the offsets the cubin itself declares."""
    with Registry.open(built_registry) as reg:
        for entry in reg.entries():
            kernel = Kernel(reg, entry, library=None, handle=None)
            launch = PreparedLaunch(kernel, device=0, function=None, stream=0)
            info = inspect_cubin(reg._index.read_artifact(entry))
            table = info.kernel(entry.symbol).params
            values = [
                0x7F00_0000_1000 + 0x100 * i if a.is_pointer else 1000 + i for i, a in enumerate(entry.args)
            ]
            launch._pack(launch._buf, 0, *values)
            raw = bytes(launch._buf)
            assert len(table) == len(entry.args)
            for param, arg, value in zip(table, entry.args, values, strict=True):
                fmt = {8: "<Q", 4: "<i"}[param.size]
                assert struct.unpack_from(fmt, raw, param.offset)[0] == value, (entry.arch, arg.name)
            # and argv[i] points at the byte the driver will read for parameter i
            base = launch._argv[0]
            assert [launch._argv[i] - base for i in range(len(table))] == [p.offset for p in table]


def test_prepared_grid_follows_the_spec(built_registry: Path) -> None:
    with Registry.open(built_registry) as reg:
        entry = reg.resolve("moe.topk_sum", 1, arch="sm_90a", **{**PARAMS, "cta_threads": 256})
        launch = PreparedLaunch(Kernel(reg, entry, None, None), 0, None, 0)
        assert launch._grid_fn is not None
        assert launch._grid_fn([1, 2, 3, 4, 37, 8]) == (37, 1, 1)
        assert launch._block == (256, 1, 1) and launch._smem == 0
