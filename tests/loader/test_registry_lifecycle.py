"""A registry's loads and its close against a driver that only keeps count (no GPU): every
library it loads is unloaded once, whatever fails on the way, and a closed registry says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from b12x_aot.loader import CudaError, Registry, RegistryClosedError
from b12x_aot.loader import _registry as registry_module

pytestmark = pytest.mark.dsl  # the registry holds real cubins (built_registry)

PARAMS = {"element": "bf16", "output": "fp32", "topk": 2, "hidden": 2048}


class CountingDriver:
    """The driver calls a registry makes to load, create functions and close, with the live
    libraries and context retains counted; ``fail`` names calls that return an error."""

    OK = 0
    ERROR = 500  # CUDA_ERROR_NOT_FOUND

    def __init__(self) -> None:
        self.live: set[int] = set()
        self.loads = 0
        self.retains = 0
        self.fail: set[str] = set()
        self.fail_unload_of: set[int] = set()

    def cuLibraryLoadData(self, *_: Any) -> tuple:
        self.loads += 1
        self.live.add(self.loads)
        return (self._result("cuLibraryLoadData"), self.loads)

    def cuLibraryGetKernel(self, library: int, symbol: bytes) -> tuple:
        return (self._result("cuLibraryGetKernel"), ("kernel", library))

    def cuLibraryUnload(self, library: int) -> tuple:
        if library in self.fail_unload_of:
            return (self._code(self.ERROR),)
        self.live.remove(library)  # a second unload of one library would raise here
        return (self._code(self.OK),)

    def cuKernelGetFunction(self, kernel: Any) -> tuple:
        return (self._code(self.OK), ("function", kernel))

    def cuFuncSetAttribute(self, *_: Any) -> tuple:
        return (self._code(self.OK),)

    def cuDeviceGet(self, device: int) -> tuple:
        return (self._code(self.OK), device)

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple:
        self.retains += 1
        return (self._code(self.OK), ("context", device))

    def cuDevicePrimaryCtxRelease(self, device: int) -> tuple:
        self.retains -= 1
        return (self._code(self.OK),)

    def cuCtxPushCurrent(self, ctx: Any) -> tuple:
        return (self._code(self.OK),)

    def cuCtxPopCurrent(self) -> tuple:
        return (self._code(self.OK), None)

    def cuGetErrorName(self, err: Any) -> tuple:
        return (self._code(self.OK), b"CUDA_ERROR_NOT_FOUND")

    def cuGetErrorString(self, err: Any) -> tuple:
        return (self._code(self.OK), b"named symbol not found")

    def _result(self, call: str) -> Any:
        return self._code(self.ERROR if call in self.fail else self.OK)

    @staticmethod
    def _code(value: int) -> Any:
        from cuda.bindings import driver as cu

        return cu.CUresult(value)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingDriver:
    from cuda.bindings import driver as cu

    fake = CountingDriver()
    for name in dir(CountingDriver):
        if name.startswith("cu"):
            monkeypatch.setattr(cu, name, getattr(fake, name))
    monkeypatch.setattr(registry_module, "ensure_init", lambda: None)
    return fake


def opened(path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    registry = Registry.open(path)
    monkeypatch.setattr(registry, "arch", lambda device: "sm_90a")
    return registry


def test_a_variant_named_twice_is_loaded_once_and_unloaded_at_close(
    built_registry: Path, counting: CountingDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = opened(built_registry, monkeypatch)
    same = {"family": "moe.topk_sum", "abi": 1, "params": {**PARAMS, "cta_threads": 128}}
    kernels = registry.preload({"variants": [same, same]}, devices=[0])
    assert counting.loads == 1 and len(counting.live) == 1
    assert len({k.key for k in kernels}) == 1
    registry.close()
    assert counting.live == set() and counting.retains == 0


def test_a_failed_kernel_lookup_unloads_the_library_it_loaded(
    built_registry: Path, counting: CountingDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = opened(built_registry, monkeypatch)
    counting.fail.add("cuLibraryGetKernel")
    for _ in range(3):
        with pytest.raises(
            CudaError,
            match=r"cuLibraryGetKernel\(kernel_\w+\) of moe\.topk_sum\[.*\]@sm_90a \([0-9a-f]{16}\)",
        ):
            registry.kernel("moe.topk_sum", 1, device=0, **PARAMS, cta_threads=128)
    assert counting.loads == 3 and counting.live == set()
    counting.fail.clear()
    registry.kernel("moe.topk_sum", 1, device=0, **PARAMS, cta_threads=128)
    registry.close()
    assert counting.live == set()


def test_close_releases_everything_when_one_unload_fails_and_then_refuses_loads(
    built_registry: Path, counting: CountingDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = opened(built_registry, monkeypatch)
    for threads in (128, 256):
        registry.kernel("moe.topk_sum", 1, device=0, **PARAMS, cta_threads=threads)
    assert counting.live == {1, 2} and counting.retains == 1
    counting.fail_unload_of.add(1)
    with pytest.raises(CudaError, match=r"cuLibraryUnload of variant [0-9a-f]{16}"):
        registry.close()
    assert counting.live == {1} and counting.retains == 0  # the other library and the context went
    registry.close()  # closing again is harmless
    with pytest.raises(RegistryClosedError, match=r"is closed: its libraries are unloaded\. Open it again"):
        registry.kernel("moe.topk_sum", 1, device=0, **PARAMS, cta_threads=128)
