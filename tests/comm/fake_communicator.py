"""A communicator assembled from its parts with a fake launch (it records its arguments) and a
plain host buffer standing in for the host-mapped error record: the seam that
``Communicator.create`` fills with driver objects. Shared by the tests that need no GPU."""

from __future__ import annotations

import ctypes
from typing import Any

from b12x_aot.comm import Communicator
from b12x_aot.comm._policy import Settings, Variant
from b12x_aot.comm._setup import Built

VA = 0x7F00_0000_0000


class FakeLaunch:
    def __init__(self, key: tuple[str, str, str]) -> None:
        self.key = key
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, stream: Any = None) -> None:
        self.calls.append((*args, stream))


class FakeResources:
    def __init__(self) -> None:
        self.closed = 0
        self.synced: list[Any] = []

    def synchronize(self, stream: Any = None) -> None:
        self.synced.append(stream)

    def close(self) -> None:
        self.closed += 1


def make(
    *, dtypes=("bf16", "fp16"), capacity=1 << 20, keys=None, policy=None, rank=1, world=4
) -> tuple[Communicator, dict, Any, FakeResources]:
    settings = Settings.of(
        rank=rank, world=world, capacity_bytes=capacity, dtypes=dtypes, timeout_s=0.5, policy=policy
    )
    if keys is None:
        keys = [(d, a, t) for d in dtypes for a in ("oneshot", "twoshot") for t in ("pull", "push")]
    launches = {k: FakeLaunch(k) for k in keys}
    variants = {k: Variant(*k, 512, 16) for k in keys}
    words = (ctypes.c_uint32 * 4)()
    resources = FakeResources()
    built = Built(variants, launches, {}, VA, words, None)
    return Communicator(settings, device=0, built=built, resources=resources), launches, words, resources


def only_call(launches: dict) -> tuple[tuple[str, str, str], tuple[Any, ...]]:
    calls = [(k, c) for k, launch in launches.items() for c in launch.calls]
    assert len(calls) == 1, calls
    return calls[0]
