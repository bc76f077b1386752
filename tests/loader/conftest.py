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

    def params(self, layout) -> bytes:
        """The parameter buffer the last call launched (``layout``: its launch's ParamLayout)."""
        first = self.argv(self.calls[-1][4], 1)[0]
        return ctypes.string_at(first - layout.offsets[0], layout.size)


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> RecordingDriver:
    from cuda.bindings import driver as cu

    recorder = RecordingDriver()
    monkeypatch.setattr(cu, "cuLaunchKernel", recorder)
    return recorder


class RecordingClusterDriver:
    """Stands in for cuLaunchKernelEx: records each call's grid, block, shared memory, stream
    and cluster size, read from its launch config."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, config, func, argv, extra):
        from cuda.bindings import driver as cu

        (attr,) = config.attrs[: config.numAttrs]
        assert attr.id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        cluster = attr.value.clusterDim
        self.calls.append(
            (
                (config.gridDimX, config.gridDimY, config.gridDimZ),
                (config.blockDimX, config.blockDimY, config.blockDimZ),
                config.sharedMemBytes,
                int(config.hStream),
                (cluster.x, cluster.y, cluster.z),
            )
        )
        return (cu.CUresult.CUDA_SUCCESS,)


@pytest.fixture
def cluster_driver(monkeypatch: pytest.MonkeyPatch) -> RecordingClusterDriver:
    from cuda.bindings import driver as cu

    recorder = RecordingClusterDriver()
    monkeypatch.setattr(cu, "cuLaunchKernelEx", recorder)
    return recorder


class RecordingEncoder:
    """Stands in for cuTensorMapEncodeTiled: records its arguments, returns words that name them."""

    def __init__(self, result: str = "CUDA_SUCCESS") -> None:
        self.calls: list[tuple] = []
        self.result = result

    def __call__(self, dtype, rank, address, dims, strides, box, elements, interleave, swizzle, l2, oob):
        from cuda.bindings import driver as cu

        self.calls.append(
            (
                int(dtype),
                rank,
                address,
                [int(d) for d in dims],
                [int(s) for s in strides],
                [int(b) for b in box],
                [int(e) for e in elements],
                (int(interleave), int(swizzle), int(l2), int(oob)),
            )
        )
        encoded = cu.CUtensorMap()
        encoded.opaque = [address, *[int(d) for d in dims], len(self.calls)] + [0] * 12
        return getattr(cu.CUresult, self.result), encoded


@pytest.fixture
def encoder(monkeypatch: pytest.MonkeyPatch) -> RecordingEncoder:
    from cuda.bindings import driver as cu

    recorder = RecordingEncoder()
    monkeypatch.setattr(cu, "cuTensorMapEncodeTiled", recorder)
    return recorder
