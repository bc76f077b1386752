"""The benchmarks' GPU-state and digest helpers, on the CPU: NVML stood in for by a fake."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # not a package

import _gpu_state as gs

from _timing import host_us_per_call


class FakeNvmlError(Exception):
    pass


def fake_nvml(*, init_fails: bool = False, power_missing: bool = False, old_api: bool = False, mask: int = 0):
    """A stand-in for pynvml answering like one H100; every call counted in ``calls``."""
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_fails:
            raise FakeNvmlError("Driver Not Loaded")

    def power(_h):
        if power_missing:
            raise FakeNvmlError("Not Supported")
        return 120_500

    clocks = {("cur", 0): 1755, ("max", 0): 1980, ("cur", 2): 2619, ("max", 2): 2619}
    nvml = SimpleNamespace(
        NVMLError=FakeNvmlError,
        NVML_CLOCK_SM=0,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=init,
        nvmlDeviceGetHandleByPciBusId=lambda bus: ("bus", bus),
        nvmlDeviceGetHandleByIndex=lambda i: ("index", i),
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:19:00.0"),
        nvmlSystemGetDriverVersion=lambda: "570.86.15",
        nvmlDeviceGetClockInfo=lambda h, c: clocks[("cur", c)],
        nvmlDeviceGetMaxClockInfo=lambda h, c: clocks[("max", c)],
        nvmlDeviceGetTemperature=lambda h, s: 41,
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        calls=calls,
    )
    if old_api:
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: mask
    else:
        nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: mask
    return nvml


def test_decode_throttle_names_every_bit_and_unknown_ones():
    assert gs.decode_throttle(0) == ()
    assert gs.decode_throttle(0x4 | 0x20) == ("sw_power_cap", "sw_thermal")
    assert gs.decode_throttle(0x1 | 0x8 | 0x40 | 0x80) == (
        "gpu_idle",
        "hw_slowdown",
        "hw_thermal",
        "hw_power_brake",
    )
    assert gs.decode_throttle(0x4 | 0x1000) == ("sw_power_cap", "unknown_0x1000")
    names = [name for _, name in gs.THROTTLE_REASONS]
    assert len(set(names)) == len(names)
    bits = [bit for bit, _ in gs.THROTTLE_REASONS]
    assert all(b & (b - 1) == 0 for b in bits) and len(set(bits)) == len(bits)


def test_sample_reads_every_field_and_serialises():
    nvml = fake_nvml(mask=0x4)
    before = time.time()
    state = gs.sample(0, nvml=nvml)
    assert isinstance(state, gs.GpuState)
    data = json.loads(json.dumps(state.to_json()))
    assert data == {
        "available": True,
        "device": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:19:00.0",
        "driver": "570.86.15",
        "sm_mhz": 1755,
        "sm_max_mhz": 1980,
        "mem_mhz": 2619,
        "mem_max_mhz": 2619,
        "temperature_c": 41,
        "power_w": 120.5,
        "power_limit_w": 700.0,
        "throttle_mask": 4,
        "throttle": ["sw_power_cap"],
        "unix_time": data["unix_time"],
    }
    assert data["unix_time"] >= before
    assert state.line() == "sm 1755/1980 MHz mem 2619/2619 MHz 41 C 120/700 W throttle: sw_power_cap"
    with pytest.raises(AttributeError):
        state.sm_mhz = 0  # frozen


def test_sample_uses_the_older_throttle_call_and_none_for_unreported_fields():
    state = gs.sample(1, nvml=fake_nvml(old_api=True, power_missing=True, mask=0))
    assert isinstance(state, gs.GpuState)
    assert state.power_w is None and state.power_limit_w == 700.0
    assert state.throttle_mask == 0 and state.throttle == ()
    assert state.line() == "sm 1755/1980 MHz mem 2619/2619 MHz 41 C ?/700 W throttle: none"


def test_init_failure_is_recorded_not_raised_and_tried_once():
    nvml = fake_nvml(init_fails=True)
    first, second = gs.sample(0, nvml=nvml), gs.sample(0, nvml=nvml)
    assert isinstance(first, gs.Unavailable)
    assert first.to_json() == {"available": False, "device": 0, "reason": first.reason}
    assert "Driver Not Loaded" in first.reason and first.line().startswith("gpu state unavailable: ")
    assert second == first and nvml.calls == ["init"]


def test_missing_pynvml_is_recorded(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    state = gs.sample(0)
    assert state.to_json() == {
        "available": False,
        "device": 0,
        "reason": "pynvml is not installed: pip install nvidia-ml-py",
    }


def test_recorded_brackets_a_series():
    nvml = fake_nvml()
    with gs.recorded(0, nvml=nvml) as states:
        assert set(states) == {"before"}
    assert set(states) == {"before", "after"}
    assert states["before"]["available"] and states["after"]["unix_time"] >= states["before"]["unix_time"]


def test_digest_is_sha256_of_the_tensor_bytes():
    torch = pytest.importorskip("torch")
    from _digest import digest

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert digest(x) == hashlib.sha256(x.numpy().tobytes()).hexdigest()
    assert digest(x.t()) == hashlib.sha256(x.t().contiguous().numpy().tobytes()).hexdigest()
    assert digest(x.t()) != digest(x)
    b = torch.randn(64, generator=torch.Generator().manual_seed(0)).bfloat16()
    again = torch.randn(64, generator=torch.Generator().manual_seed(0)).bfloat16()
    assert digest(b) == digest(again) and len(digest(b)) == 64
    assert digest(b) != digest(again + 1)


def test_host_us_per_call_keeps_raw_batches_on_request():
    calls = []
    result = host_us_per_call(lambda: calls.append(1), lambda: None, batch=4, batches=6, warmup=2, raw=True)
    assert len(calls) == 4 * 8
    assert len(result["samples_us"]) == 6
    assert min(result["samples_us"]) <= result["median_us"] <= max(result["samples_us"])
    assert "samples_us" not in host_us_per_call(lambda: None, lambda: None, batch=2, batches=4)


def test_from_json_round_trips_both_records():
    state = gs.sample(0, nvml=fake_nvml(mask=0x24))
    assert gs.from_json(json.loads(json.dumps(state.to_json()))) == state
    missing = gs.Unavailable(3, "no pynvml")
    assert gs.from_json(missing.to_json()) == missing


def test_allreduce_prints_one_state_line_per_rank_and_flags_differing_outputs():
    pytest.importorskip("torch")
    import bench_allreduce as ar

    states = [gs.sample(r, nvml=fake_nvml(mask=0x4 if r else 0)).to_json() for r in range(2)]
    printed: list[str] = []
    ar.show_states(printed.append, "before world=2", states, "")
    assert printed == [
        "GPU state before world=2:",
        "  rank 0: sm 1755/1980 MHz mem 2619/2619 MHz 41 C 120/700 W throttle: none",
        "  rank 1: sm 1755/1980 MHz mem 2619/2619 MHz 41 C 120/700 W throttle: sw_power_cap",
    ]
    printed.clear()
    ar.show_states(printed.append, "after", [gs.Unavailable(0, "no pynvml").to_json()], "device 0")
    assert printed == ["GPU state after:", "  device 0: gpu state unavailable: no pynvml"]

    timing = ar.percentiles([3.0, 1.0, 2.0])
    assert timing["samples_us"] == [3.0, 1.0, 2.0] and timing["median_us"] == 2.0
    nccl_only = {"world": 9, "variant": "nccl", "bytes": 1024, "nccl_eager": timing, "nccl_graph": timing}
    assert ar.line(nccl_only).endswith("nccl    2.00 / graph    2.00 us")
    assert "eager" not in ar.line(nccl_only).split("nccl")[0]
    ours = {"world": 2, "variant": "oneshot/pull", "bytes": 1024, "eager": timing, "graph": timing}
    assert "DIFFER" not in ar.line({**ours, "ranks_agree": True})
    assert ar.line({**ours, "ranks_agree": False}).endswith("OUTPUTS DIFFER BETWEEN RANKS")
