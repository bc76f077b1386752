"""Prepared launches: everything bound once, so a launch is one ``pack_into`` and one driver call.

``Kernel.prepare()`` builds a :class:`PreparedLaunch`. It owns a preallocated parameter
buffer, the ``void*[]`` that points into it, the grid closure and the per-device function.
A call converts pointer arguments (ints pass through; tensors give ``data_ptr()``), packs the
buffer, and calls ``cuLaunchKernel`` on the stream: no allocation beyond the argument list, no
lookups, no parsing, no loads. :meth:`PreparedLaunch.checked` validates every argument first.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as cu

from ._abi import DTYPES, SCALAR_KINDS, Arg, ParamLayout
from ._cuda import check
from .errors import LaunchArgumentError

if TYPE_CHECKING:
    from ._registry import Kernel

__all__ = ["PreparedLaunch"]

_PLAIN = (int, float)
_SUCCESS = cu.CUresult.CUDA_SUCCESS


def _torch_stream_source(device: int) -> Callable[[], int] | None:
    """A zero-argument callable giving torch's current raw stream on ``device``, if torch is used."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    raw = torch._C._cuda_getCurrentRawStream
    return lambda: raw(device)


class PreparedLaunch:
    """A variant bound to one device: call it with the spec's arguments, in order.

    Pointer arguments are ints (device addresses) or objects with ``data_ptr()`` (torch
    tensors); scalars are ints (floats for ``f32``/``f64``). ``stream`` is an int handle or a
    ``CUstream``; by default it is torch's current stream on this device when torch is
    imported, else the legacy default stream.

    The plain call trusts its arguments: use it on hot paths whose inputs are already known to
    be right. :meth:`checked` validates dtype, alignment, device, contiguity, count and scalar
    ranges first and raises :class:`LaunchArgumentError` (a ``ValueError``) before launching.
    """

    __slots__ = (
        "_argv",
        "_argv_addr",
        "_block",
        "_buf",
        "_cached_raw",
        "_cached_stream",
        "_default_stream",
        "_func",
        "_grid",
        "_grid_fn",
        "_pack",
        "_smem",
        "args",
        "device",
        "kernel",
        "layout",
    )

    def __init__(self, kernel: Kernel, device: int, function: Any, stream: Any = None) -> None:
        self.kernel = kernel
        self.device = device
        self.args: tuple[Arg, ...] = kernel.entry.args
        self.layout = ParamLayout.of(self.args)
        self._func = function
        self._pack = struct.Struct(self.layout.fmt).pack_into
        self._buf = ctypes.create_string_buffer(max(self.layout.size, 1))
        base = ctypes.addressof(self._buf)
        self._argv = (ctypes.c_void_p * max(len(self.args), 1))(*(base + o for o in self.layout.offsets))
        self._argv_addr = ctypes.addressof(self._argv)
        static = kernel.static
        self._block = static.block
        self._smem = static.smem
        positions = {a.name: i for i, a in enumerate(self.args) if not a.is_pointer}
        grid = kernel.entry.geometry.grid_closure(kernel.entry.params, positions)
        self._grid_fn: Callable[[Sequence[Any]], tuple[int, int, int]] | None = (
            grid if callable(grid) else None
        )
        self._grid = None if callable(grid) else grid
        self._cached_raw: int | None = None
        self._cached_stream: Any = None
        if stream is not None:
            self._default_stream = None
            self._cached_stream = stream if isinstance(stream, cu.CUstream) else cu.CUstream(int(stream))
        else:
            self._default_stream = _torch_stream_source(device)
            if self._default_stream is None:
                self._cached_stream = cu.CUstream(0)

    def _stream(self, stream: Any) -> Any:
        if stream is None:
            if self._default_stream is None:
                return self._cached_stream
            stream = self._default_stream()
        elif isinstance(stream, cu.CUstream):
            return stream
        # One-entry cache: a launch site keeps using the same stream, so this rarely allocates.
        if stream != self._cached_raw:
            self._cached_raw = stream
            self._cached_stream = cu.CUstream(stream)
        return self._cached_stream

    def __call__(self, *args: Any, stream: Any = None) -> None:
        values = [a if a.__class__ in _PLAIN else a.data_ptr() for a in args]
        try:
            self._pack(self._buf, 0, *values)
        except struct.error as exc:
            raise LaunchArgumentError(self.kernel.name, "*", f"do not pack ({exc})", len(args)) from None
        gx, gy, gz = self._grid if self._grid_fn is None else self._grid_fn(values)
        if not (gx and gy and gz):
            return  # an empty grid has nothing to do
        bx, by, bz = self._block
        (err,) = cu.cuLaunchKernel(
            self._func, gx, gy, gz, bx, by, bz, self._smem, self._stream(stream), self._argv_addr, 0
        )
        if err != _SUCCESS:
            check((err,), f"cuLaunchKernel({self.kernel.name})")

    def checked(self, *args: Any, stream: Any = None) -> None:
        """Validate every argument against the variant's ABI, then launch."""
        name = self.kernel.name
        if len(args) != len(self.args):
            names = ", ".join(a.name for a in self.args)
            raise LaunchArgumentError(name, "*", f"count is wrong; expected ({names})", len(args))
        for arg, value in zip(self.args, args, strict=True):
            if arg.is_pointer:
                self._check_pointer(arg, value)
            else:
                _check_scalar(name, arg, value)
        values = [a if a.__class__ in _PLAIN else a.data_ptr() for a in args]
        grid = self._grid if self._grid_fn is None else self._grid_fn(values)
        if any((not isinstance(g, int)) or g < 0 or g >= 1 << 31 for g in grid):
            raise LaunchArgumentError(name, "grid", "must be non-negative ints below 2**31", grid)
        self(*args, stream=stream)

    def _check_pointer(self, arg: Arg, value: Any) -> None:
        name = self.kernel.name
        if isinstance(value, bool) or not (isinstance(value, int) or hasattr(value, "data_ptr")):
            raise LaunchArgumentError(
                name, arg.name, "must be a device pointer (int) or a tensor", type(value).__name__
            )
        if isinstance(value, int):
            addr = value
        else:
            dtype = DTYPES[arg.dtype]  # type: ignore[index]
            torch = sys.modules.get("torch")
            want = getattr(torch, dtype.torch_name, None) if torch is not None else None
            if want is not None and getattr(value, "dtype", None) != want:
                raise LaunchArgumentError(
                    name, arg.name, f"must have dtype torch.{dtype.torch_name}", value.dtype
                )
            device = getattr(value, "device", None)
            if device is not None and (device.type != "cuda" or device.index != self.device):
                raise LaunchArgumentError(name, arg.name, f"must be on cuda:{self.device}", device)
            if hasattr(value, "is_contiguous") and not value.is_contiguous():
                raise LaunchArgumentError(
                    name, arg.name, "must be contiguous", f"strides {tuple(value.stride())}"
                )
            addr = value.data_ptr()
        if addr % arg.align:  # type: ignore[operator]
            raise LaunchArgumentError(name, arg.name, f"must be {arg.align}-byte aligned", hex(addr))


def _check_scalar(kernel: str, arg: Arg, value: Any) -> None:
    kind = SCALAR_KINDS[arg.kind]
    if kind.lo is None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LaunchArgumentError(kernel, arg.name, f"must be a number ({arg.kind})", repr(value))
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise LaunchArgumentError(kernel, arg.name, f"must be an int ({arg.kind})", repr(value))
    if not kind.lo <= value <= kind.hi:  # type: ignore[operator]
        raise LaunchArgumentError(kernel, arg.name, f"must be in [{kind.lo}, {kind.hi}] ({arg.kind})", value)
