"""Loader resolution and packing against a registry of real cubins (no GPU needed)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from b12x_aot.compiler import inspect_cubin
from b12x_aot.loader import (
    Buffer,
    LaunchArgumentError,
    Manifest,
    PreparedLaunch,
    Registry,
    RequirementError,
    VariantMissError,
)

from .conftest import RecordingDriver

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


def test_holds_is_a_lookup_without_a_miss(built_registry: Path) -> None:
    with Registry.open(built_registry) as reg:
        assert reg.holds("moe.topk_sum", 1, arch="sm_90a", **PARAMS)
        assert not reg.holds("moe.topk_sum", 1, arch="sm_90a", **{**PARAMS, "hidden": 7168})
        assert not reg.holds("moe.topk_sum", 2, arch="sm_90a", **PARAMS)
        assert reg.stats.misses == 0


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
    assert {(m.variant.params["output"], m.variant.params["topk"]) for m in misses} == {
        ("fp16", 2),
        ("fp32", 8),
        ("bf16", 8),
        ("fp16", 8),
    }
    assert str(err.value).count("build it: b12x-compile") == 4


def test_prepared_buffer_matches_the_cubin_param_table(built_registry: Path, driver: RecordingDriver) -> None:
    """Launch through the real hot path and read the values back at the cubin's own offsets."""
    with Registry.open(built_registry) as reg:
        for entry in reg.entries():
            launch = PreparedLaunch(entry, device=0, function=None, stream=7)
            info = inspect_cubin(reg._index.read_artifact(entry))
            table = info.kernel(entry.symbol).params
            values = [
                0x7F00_0000_1000 + 0x100 * i if a.is_pointer else 1000 + i for i, a in enumerate(entry.args)
            ]
            launch(*values)
            raw = bytes(launch._buf)
            assert len(table) == len(entry.args)
            for param, arg, value in zip(table, entry.args, values, strict=True):
                fmt = {8: "<Q", 4: "<i"}[param.size]
                assert struct.unpack_from(fmt, raw, param.offset)[0] == value, (entry.arch, arg.name)
            grid, block, smem, stream, argv = driver.calls[-1]
            hidden, cta = entry.params["hidden"], entry.params["cta_threads"]
            assert grid == (values[4], -(-hidden // (cta * 8)), 1)
            assert block == (cta, 1, 1) and smem == 0 and stream == 7
            # argv[i] points at the byte the driver reads for parameter i
            pointers = driver.argv(argv, len(table))
            assert [q - pointers[0] for q in pointers] == [p.offset for p in table]


def test_prepared_launch_converts_tensors_and_skips_empty_grids(
    built_registry: Path, driver: RecordingDriver
) -> None:
    class FakeTensor:
        def __init__(self, ptr: int) -> None:
            self.ptr = ptr

        def data_ptr(self) -> int:
            return self.ptr

    with Registry.open(built_registry) as reg:
        entry = reg.resolve("moe.topk_sum", 1, arch="sm_90a", **{**PARAMS, "cta_threads": 256})
        launch = PreparedLaunch(entry, 0, None, None)
        launch(FakeTensor(0x1000), 0x2000, FakeTensor(0x3000), 0x4000, 37, 8, stream=5)
        grid, block, _, stream, _ = driver.calls[-1]
        assert (grid, block, stream) == ((37, 1, 1), (256, 1, 1), 5)
        assert struct.unpack_from("<QQQQii", bytes(launch._buf)) == (0x1000, 0x2000, 0x3000, 0x4000, 37, 8)
        launch(0x1000, 0x2000, 0x3000, 0x4000, 0, 8)  # M = 0: nothing to launch
        assert len(driver.calls) == 1
        with pytest.raises(LaunchArgumentError, match="must be a device pointer"):
            launch("not a pointer", 0x2000, 0x3000, 0x4000, 1, 8)
        with pytest.raises(LaunchArgumentError, match=r"must be in \[-2147483648, 2147483647\]"):
            launch(0x1000, 0x2000, 0x3000, 0x4000, 2**31, 8)
        with pytest.raises(LaunchArgumentError, match="count is wrong"):
            launch.checked(0x1000, 0x2000)
        big = 1 << 20
        with pytest.raises(LaunchArgumentError, match="must be 16-byte aligned"):
            launch.checked(
                Buffer(0x1008, big), Buffer(0x2000, big), Buffer(0x3000, big), Buffer(0x4000, big), 1, 8
            )
        with pytest.raises(LaunchArgumentError, match="is a raw address"):
            launch.checked(0x1000, 0x2000, 0x3000, 0x4000, 1, 8)
        assert len(driver.calls) == 1
        launch.checked(
            Buffer(0x1000, big), Buffer(0x2000, big), Buffer(0x3000, big), Buffer(0x4000, big), 1, 8
        )
        assert len(driver.calls) == 2
