"""A GPU's operating state through NVML: clocks, temperature, power and why the clocks are held.

A slow series often has a slow GPU behind it (a power cap, a thermal slowdown, clocks not at
their maximum); the benchmarks record this state before and after each series so the JSON
says which. ``pynvml`` (the ``nvidia-ml-py`` package) is imported only when a state is read;
where it is missing or NVML cannot start, the sample says so instead of failing the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "THROTTLE_REASONS",
    "GpuState",
    "Unavailable",
    "decode_throttle",
    "from_json",
    "recorded",
    "sample",
]

# NVML's clock event (throttle) reason bits, nvml.h's nvmlClocksEventReason* values.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clock_setting"),
)
_KNOWN = sum(bit for bit, _ in THROTTLE_REASONS)


def decode_throttle(mask: int) -> tuple[str, ...]:
    """The names of the reasons set in ``mask``; bits NVML may add later read ``unknown_0x..``."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    rest = mask & ~_KNOWN
    if rest:
        names.append(f"unknown_{rest:#x}")
    return tuple(names)


@dataclass(frozen=True, slots=True)
class GpuState:
    """One NVML reading of one device. A field NVML does not report on this GPU is None."""

    device: int  # the CUDA ordinal it was asked for
    name: str
    pci_bus_id: str
    driver: str
    sm_mhz: int | None
    sm_max_mhz: int | None
    mem_mhz: int | None
    mem_max_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    power_limit_w: float | None
    throttle_mask: int | None
    throttle: tuple[str, ...]
    unix_time: float

    def to_json(self) -> dict[str, Any]:
        return {"available": True, **asdict(self), "throttle": list(self.throttle)}

    def line(self) -> str:
        """One compact line: ``sm 1980/1980 MHz mem 2619/2619 MHz 41 C 120/700 W throttle: none``."""
        reasons = "?" if self.throttle_mask is None else ", ".join(self.throttle) or "none"
        return (
            f"sm {_n(self.sm_mhz)}/{_n(self.sm_max_mhz)} MHz mem {_n(self.mem_mhz)}/{_n(self.mem_max_mhz)} MHz "
            f"{_n(self.temperature_c)} C {_n(self.power_w)}/{_n(self.power_limit_w)} W throttle: {reasons}"
        )


@dataclass(frozen=True, slots=True)
class Unavailable:
    """No state could be read, and why (no ``pynvml``, NVML failed to start, no such device)."""

    device: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"available": False, "device": self.device, "reason": self.reason}

    def line(self) -> str:
        return f"gpu state unavailable: {self.reason}"


def _n(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


# id(nvml module) -> (the module, kept so its id stays unique; None once initialised, else why not)
_started: dict[int, tuple[Any, str | None]] = {}


def _start(nvml: Any) -> str | None:
    """nvmlInit once per process (and per module, so a test's stand-in starts on its own)."""
    key = id(nvml)
    if key not in _started:
        try:
            nvml.nvmlInit()
            _started[key] = (nvml, None)
        except nvml.NVMLError as exc:
            _started[key] = (nvml, f"NVML failed to initialise ({exc}); is the NVIDIA driver loaded?")
    return _started[key][1]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _handle(nvml: Any, device: int) -> Any:
    """The NVML handle of CUDA device ``device``: matched by PCI bus id where torch reports it,
    because NVML numbers devices in PCI order and CUDA need not."""
    try:
        import torch

        props = torch.cuda.get_device_properties(device)
        bus_id = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    except (ImportError, AttributeError, RuntimeError, AssertionError, nvml.NVMLError):
        return nvml.nvmlDeviceGetHandleByIndex(device)


def _throttle_mask(nvml: Any, handle: Any) -> int:
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if read is None:  # nvidia-ml-py before 12.535 names it after throttling
        read = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(read(handle))


def _read(nvml: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None where this GPU or driver does not report it."""
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


def sample(device: int, *, nvml: Any = None) -> GpuState | Unavailable:
    """Read CUDA device ``device``'s state now. ``nvml`` stands in for ``pynvml`` (tests)."""
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            return Unavailable(device, "pynvml is not installed: pip install nvidia-ml-py")
    failure = _start(nvml)
    if failure is not None:
        return Unavailable(device, failure)
    try:
        h = _handle(nvml, device)
        name = _text(nvml.nvmlDeviceGetName(h))
        bus_id = _text(nvml.nvmlDeviceGetPciInfo(h).busId)
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError as exc:
        return Unavailable(device, f"NVML could not read device {device} ({exc})")
    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    mask = _read(nvml, _throttle_mask, nvml, h)
    return GpuState(
        device=device,
        name=name,
        pci_bus_id=bus_id,
        driver=driver,
        sm_mhz=_read(nvml, nvml.nvmlDeviceGetClockInfo, h, sm),
        sm_max_mhz=_read(nvml, nvml.nvmlDeviceGetMaxClockInfo, h, sm),
        mem_mhz=_read(nvml, nvml.nvmlDeviceGetClockInfo, h, mem),
        mem_max_mhz=_read(nvml, nvml.nvmlDeviceGetMaxClockInfo, h, mem),
        temperature_c=_read(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
        power_w=_watts(_read(nvml, nvml.nvmlDeviceGetPowerUsage, h)),
        power_limit_w=_watts(_read(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, h)),
        throttle_mask=mask,
        throttle=() if mask is None else decode_throttle(mask),
        unix_time=time.time(),
    )


@contextmanager
def recorded(device: int, *, nvml: Any = None) -> Iterator[dict[str, Any]]:
    """Around one series: yields ``{"before": state}`` and adds ``"after"`` when it ends."""
    states = {"before": sample(device, nvml=nvml).to_json()}
    yield states
    states["after"] = sample(device, nvml=nvml).to_json()


def from_json(data: dict[str, Any]) -> GpuState | Unavailable:
    """The record ``to_json`` wrote (as gathered from other ranks), for printing its line."""
    if not data["available"]:
        return Unavailable(data["device"], data["reason"])
    fields = {k: v for k, v in data.items() if k != "available"}
    return GpuState(**{**fields, "throttle": tuple(fields["throttle"])})
