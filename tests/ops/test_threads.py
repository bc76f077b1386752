"""The torch ops give each thread its own prepared launch (off the GPU): one launch packs its
arguments into one buffer, so two threads sharing it could launch each other's."""

from __future__ import annotations

import threading
from typing import Any

import pytest

pytest.importorskip("torch")

from b12x_aot.ops import Mxfp8QuantOp


class OneVariantRegistry:
    """Holds every variant; each prepare() is a new launch, counted."""

    def __init__(self) -> None:
        self.prepared = 0
        self.kernels: list[tuple] = []

    def arch(self, device: int) -> str:
        return "sm_90a"

    def holds(self, family: str, abi: int, *, arch: str, **params: Any) -> bool:
        return True

    def kernel(self, family: str, abi: int, *, device: int, **params: Any) -> Any:
        self.kernels.append((family, device, tuple(sorted(params.items()))))
        registry = self

        class Kernel:
            def prepare(self, *, device: int) -> object:
                registry.prepared += 1
                return object()

        return Kernel()


def test_each_thread_prepares_its_own_launch_once() -> None:
    registry = OneVariantRegistry()
    op = Mxfp8QuantOp(registry, namespace="b12x_threads_test")  # type: ignore[arg-type]
    params = [{"dtype": "bf16", "K": 2048, "rounding": "floor", "cta_threads": 256}]
    seen: dict[str, list[object]] = {}

    def calls(name: str) -> None:
        seen[name] = [op._launch(("key",), 0, params) for _ in range(3)]

    threads = [threading.Thread(target=calls, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    calls("main")
    assert all(len({id(x) for x in launches}) == 1 for launches in seen.values())  # cached per thread
    assert len({id(launches[0]) for launches in seen.values()}) == 3  # never shared across threads
    assert registry.prepared == 3
