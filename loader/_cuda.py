"""The loader's only door to the CUDA driver (``cuda.bindings.driver``).

Every driver call goes through :func:`check`, which turns a failing ``CUresult`` into a
:class:`~b12x_aot.loader.errors.CudaError` with the error's name and meaning. Nothing here
runs at import: ``cuInit`` happens on the first registry that loads a kernel.
"""

from __future__ import annotations

import threading
from typing import Any

from cuda.bindings import driver as cu

from b12x_aot.contract import arch_of

from .errors import CudaError

__all__ = [
    "check",
    "current_device",
    "device_arch",
    "device_count",
    "ensure_init",
    "stream_is_capturing",
    "torch_stream_getter",
]

_init_lock = threading.Lock()
_initialized = False
_SUCCESS = cu.CUresult.CUDA_SUCCESS
_DRIVER_NOT_FOUND = "DRIVER_NOT_FOUND"
# cuInit's answers that mean the machine has no GPU, not that its driver is broken.
_NO_GPU = frozenset({_DRIVER_NOT_FOUND, "CUDA_ERROR_STUB_LIBRARY", "CUDA_ERROR_NO_DEVICE"})


def check(result: tuple[Any, ...], call: str) -> Any:
    """Unwrap a ``(CUresult, *values)`` tuple; raise :class:`CudaError` on failure."""
    err = result[0]
    if err != _SUCCESS:
        code = int(err)
        _, name = cu.cuGetErrorName(err)
        _, meaning = cu.cuGetErrorString(err)
        raise CudaError(
            call,
            code,
            name.decode() if isinstance(name, bytes) else str(name),
            meaning.decode() if isinstance(meaning, bytes) else str(meaning),
        )
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def ensure_init() -> None:
    """``cuInit(0)`` once per process."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if not _initialized:
            try:
                result = cu.cuInit(0)
            except Exception as exc:  # cuda.bindings raises when libcuda itself is missing
                raise CudaError(
                    "cuInit", -1, _DRIVER_NOT_FOUND, f"no CUDA driver on this machine ({exc})"
                ) from None
            check(result, "cuInit")
            _initialized = True


def device_count() -> int:
    """CUDA devices present: 0 when the machine has none (no driver, the driver's stub, no
    device); any other driver failure raises."""
    try:
        ensure_init()
    except CudaError as exc:
        if exc.name in _NO_GPU:
            return 0
        raise
    return int(check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def device_arch(ordinal: int) -> str:
    """The arch-specific target (e.g. ``sm_90a``) of device ``ordinal``."""
    ensure_init()
    dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    attr = cu.CUdevice_attribute
    major = check(
        cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
        "cuDeviceGetAttribute",
    )
    minor = check(
        cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
        "cuDeviceGetAttribute",
    )
    return arch_of(int(major), int(minor))


def current_device() -> int:
    """The device a launch goes to when the caller names none.

    torch's current device when torch is in use, else the device of the current context,
    else device 0.
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    ensure_init()
    err, dev = cu.cuCtxGetDevice()
    if err == _SUCCESS:
        return int(dev)
    return 0


def torch_stream_getter() -> Any:
    """torch's "current raw stream of device d" function, when torch with CUDA is imported."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_is_capturing(stream: int) -> bool:
    """Whether ``stream`` is capturing a graph.

    ``cuStreamIsCapturing`` is one of the calls CUDA permits during capture. The legacy
    default stream (0) is never asked: querying it while another stream captures would
    invalidate that capture, and capturing on it is itself illegal.
    """
    if stream == 0:
        return False
    status = check(cu.cuStreamIsCapturing(cu.CUstream(stream)), "cuStreamIsCapturing")
    return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
