"""Fixtures of the loader tests."""

from __future__ import annotations

import ctypes

import pytest


class RecordingDriver:
    """Stands in for cuLaunchKernel: records each call's grid, block, shared memory, stream and
    ``void*[]`` address (read it with :meth:`argv` while the launch object lives)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, func, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        from cuda.bindings import driver as cu

        self.calls.append(((gx, gy, gz), (bx, by, bz), smem, int(stream), argv))
        return (cu.CUresult.CUDA_SUCCESS,)

    @staticmethod
    def argv(address: int, count: int) -> list[int]:
        """The first ``count`` parameter addresses of a recorded ``void*[]``."""
        pointers = ctypes.cast(address, ctypes.POINTER(ctypes.c_void_p))
        return [pointers[i] for i in range(count)]


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> RecordingDriver:
    from cuda.bindings import driver as cu

    recorder = RecordingDriver()
    monkeypatch.setattr(cu, "cuLaunchKernel", recorder)
    return recorder
