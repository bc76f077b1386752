"""The communicator's driver-side helpers: a device's primary context, device facts, the
host-mapped error record, and streams.

Every driver call goes through the loader's :func:`check`, which turns a failing ``CUresult``
into a :class:`~b12x_aot.loader.CudaError`.
"""

from __future__ import annotations

import ctypes
from typing import Any

from cuda.bindings import driver as cu

from b12x_aot.loader import CudaError, check, current_device, ensure_init

from .errors import CommArgumentError
from .layout import ERROR_BYTES, ERROR_TIMEOUT

__all__ = [
    "DeviceContext",
    "ErrorRecord",
    "check",
    "current_device",
    "decode_error",
    "raw_stream",
]


def raw_stream(stream: Any) -> Any:
    """A stream argument as the loader takes it: torch streams become their raw handle.

    Raises :class:`CommArgumentError` for anything that is not None, an int handle, a
    ``CUstream`` or an object with a ``cuda_stream`` handle (``torch.cuda.Stream``).
    """
    if stream is None or stream.__class__ is int or isinstance(stream, cu.CUstream):
        return stream
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream / ExternalStream
    try:
        return int(handle) if handle is not None else int(stream)
    except (TypeError, ValueError):
        raise CommArgumentError(
            "stream",
            "is not a CUDA stream",
            type(stream).__name__,
            "Pass a torch.cuda.Stream, a cuda.bindings CUstream, an int handle, or None.",
        ) from None


class DeviceContext:
    """The primary context of one device, retained while this object is open.

    ``with ctx:`` makes it current on the calling thread for the block (push/pop, so nesting
    and other threads are safe). :meth:`close` releases the retain; it is idempotent.
    """

    __slots__ = ("_ctx", "_dev", "device")

    def __init__(self, device: int) -> None:
        ensure_init()
        self.device = device
        self._dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
        self._ctx: Any = check(cu.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")

    def __enter__(self) -> DeviceContext:
        check(cu.cuCtxPushCurrent(self._ctx), "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc: object) -> None:
        check(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def make_current_if_none(self) -> None:
        """Leave the primary context current on this thread if none is, as torch does, so that
        launches from a thread that never touched CUDA find it."""
        current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if current is None or int(current) == 0:
            check(cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def attribute(self, attr: Any) -> int:
        return int(check(cu.cuDeviceGetAttribute(attr, self._dev), "cuDeviceGetAttribute"))

    def sm_count(self) -> int:
        return self.attribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)

    def uuid(self) -> str:
        """The device's UUID in hex: the same physical GPU gives the same text in every process."""
        return bytes(check(cu.cuDeviceGetUuid(self._dev), "cuDeviceGetUuid").bytes).hex()

    def synchronize(self, stream: Any = None) -> None:
        """Wait for ``stream`` (a handle or torch stream), or for the whole context when None."""
        with self:
            if stream is None:
                check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
            else:
                handle = raw_stream(stream)
                if not isinstance(handle, cu.CUstream):
                    handle = cu.CUstream(handle)
                check(cu.cuStreamSynchronize(handle), "cuStreamSynchronize")

    def create_stream(self) -> int:
        """A new non-blocking stream on this device (raw handle); destroy it with :meth:`destroy_stream`."""
        with self:
            stream = check(
                cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate"
            )
        return int(stream)

    def destroy_stream(self, stream: int) -> None:
        with self:
            check(cu.cuStreamDestroy(cu.CUstream(stream)), "cuStreamDestroy")

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx = None
            check(cu.cuDevicePrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")


def decode_error(word0: int, word1: int) -> tuple[int, int, int, int] | None:
    """``(barrier, missing_rank, block, generation)`` from an error record, or None when healthy."""
    if not word0 & ERROR_TIMEOUT:
        return None
    return (word0 >> 24) & 0x7F, (word0 >> 16) & 0xFF, word0 & 0xFFFF, word1


class ErrorRecord:
    """16 bytes of pinned host memory mapped into the device, where a kernel records a timeout.

    ``words`` reads it from the host with no synchronisation: word 0 is 0 while healthy.
    ``device_ptr`` is the address the kernel writes through. :meth:`close` frees it (idempotent).
    """

    __slots__ = ("_ctx", "device_ptr", "host_ptr", "words")

    def __init__(self, ctx: DeviceContext) -> None:
        self._ctx = ctx
        with ctx:
            self.host_ptr = int(
                check(cu.cuMemHostAlloc(ERROR_BYTES, cu.CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc")
            )
            try:
                self.device_ptr = int(
                    check(cu.cuMemHostGetDevicePointer(self.host_ptr, 0), "cuMemHostGetDevicePointer")
                )
            except CudaError:
                check(cu.cuMemFreeHost(self.host_ptr), "cuMemFreeHost")
                raise
        ctypes.memset(self.host_ptr, 0, ERROR_BYTES)
        self.words = (ctypes.c_uint32 * (ERROR_BYTES // 4)).from_address(self.host_ptr)

    def close(self) -> None:
        if self.host_ptr:
            host, self.host_ptr = self.host_ptr, 0
            # The kernel may write until the context is idle; the caller synchronised first.
            self.words = (ctypes.c_uint32 * (ERROR_BYTES // 4))()
            with self._ctx:
                check(cu.cuMemFreeHost(host), "cuMemFreeHost")
