"""Prepared launches: everything bound once, so a launch is one ``pack_into`` and one driver call.

``Kernel.prepare()`` builds a :class:`PreparedLaunch` from plain inputs (the variant's index
entry, a device, its function handle and a stream): a preallocated parameter buffer, the
``void*[]`` that points into it, the per-device function, the block, the shared memory and
the grid. Its ``__call__`` is generated for the variant's ABI (as Triton's binder does), so a
call does no loops, lookups or parsing: it converts pointer arguments (ints pass through;
tensors give ``data_ptr()``), packs the buffer and calls ``cuLaunchKernel``.

The generated source is assembled from a fixed template, positional names ``a0``, ``a1``, ...
and integers only; no text from a spec ever reaches it. Grid dimensions that are constants or
plain scalar arguments are inlined; any other dimension calls a closure compiled from the
spec's expression by the whitelisted evaluator in ``_expr``.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Sequence
from typing import Any

from cuda.bindings import driver as cu

from ._abi import DTYPES, SCALAR_KINDS, Arg, ParamLayout
from ._cuda import check, torch_stream_getter
from ._index import IndexEntry
from .errors import LaunchArgumentError

__all__ = ["PreparedLaunch"]

_SUCCESS = cu.CUresult.CUDA_SUCCESS

_TEMPLATE = """\
def __call__(self, {params}*, stream=None):
    try:
        pack(buf, 0, {values})
    except Exception as exc:
        raise diagnose(({tuple}), exc) from None
{grid}{guard}    if stream is None:
{default_stream}    elif stream.__class__ is not CUstream:
        stream = as_stream(stream)
    result = launch(func, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, {smem}, stream, argv, 0)
    if result[0] is not SUCCESS:
        failed(result)
"""


class _StreamCache:
    """Turns raw stream handles into ``CUstream``s, reusing the last one (no per-launch allocation)."""

    __slots__ = ("raw", "stream")

    def __init__(self) -> None:
        self.raw: int | None = None
        self.stream: Any = None

    def get(self, raw: int) -> Any:
        if raw != self.raw:
            self.raw, self.stream = raw, cu.CUstream(raw)
        return self.stream


class PreparedLaunch:
    """A variant bound to one device: call it with the spec's arguments, in order.

    Pointer arguments are ints (device addresses) or objects with ``data_ptr()`` (torch
    tensors); scalars are ints (floats for ``f32``/``f64``). ``stream`` is a ``CUstream`` or an
    int handle; by default it is torch's current stream on this device when torch was imported
    before :meth:`Kernel.prepare`, else the stream given to ``prepare``, else the legacy default
    stream. An empty grid launches nothing.

    The plain call trusts its arguments: use it on hot paths whose inputs are already known to
    be right. :meth:`checked` validates dtype, alignment, device, contiguity, count and scalar
    ranges first and raises :class:`LaunchArgumentError` (a ``ValueError``) before launching.
    """

    __slots__ = ("_argv", "_buf", "_torch_dtypes", "args", "device", "entry", "grid", "layout", "name")

    def __new__(cls, entry: IndexEntry, device: int, function: Any, stream: Any = None) -> PreparedLaunch:
        # Each prepared launch gets a subclass whose __call__ is generated for its ABI, so the
        # call dispatches straight into it.
        namespace: dict[str, Any] = {}
        self = object.__new__(type("PreparedLaunch", (cls,), {"__slots__": ()}))
        self._bind(entry, device, function, stream, namespace)
        type(self).__call__ = namespace["__call__"]
        return self

    def _bind(
        self, entry: IndexEntry, device: int, function: Any, stream: Any, namespace: dict[str, Any]
    ) -> None:
        self.entry = entry
        self.device = device
        self.name = entry.label
        self.args: tuple[Arg, ...] = entry.args
        self.layout = ParamLayout.of(self.args)
        self._torch_dtypes: tuple[Any, ...] | None = None
        self._buf = ctypes.create_string_buffer(max(self.layout.size, 1))
        base = ctypes.addressof(self._buf)
        self._argv = (ctypes.c_void_p * max(len(self.args), 1))(*(base + o for o in self.layout.offsets))
        positions = {a.name: i for i, a in enumerate(self.args) if not a.is_pointer}
        grid = entry.geometry.grid_closure(entry.params, positions)
        self.grid = grid  # a constant tuple, or a closure over the argument tuple
        names = [f"a{i}" for i in range(len(self.args))]
        values = [
            f"{n} if {n}.__class__ is int else {n}.data_ptr()" if a.is_pointer else n
            for n, a in zip(names, self.args, strict=True)
        ]
        env: dict[str, Any] = {
            "pack": struct.Struct(self.layout.fmt).pack_into,
            "buf": self._buf,
            "argv": ctypes.addressof(self._argv),
            "func": function,
            "launch": cu.cuLaunchKernel,
            "CUstream": cu.CUstream,
            "SUCCESS": _SUCCESS,
            "as_stream": _StreamCache().get,
            "diagnose": self._diagnose,
            "failed": self._failed,
        }
        dims, guard = self._grid_source(grid, names, positions, env)
        self._stream_source(device, stream, env, namespace)
        source = _TEMPLATE.format(
            params="".join(f"{n}, " for n in names),
            values=", ".join(values),
            tuple="".join(f"{n}, " for n in names),
            grid="".join(f"    {line}\n" for line in dims[3:]),
            guard=f"    if not ({' and '.join(guard)}):\n        return\n" if guard else "",
            default_stream=namespace.pop("_default_stream_source"),
            gx=dims[0],
            gy=dims[1],
            gz=dims[2],
            bx=entry.static.block[0],
            by=entry.static.block[1],
            bz=entry.static.block[2],
            smem=entry.static.smem,
        )
        exec(compile(source, f"<prepared launch {entry.family}>", "exec"), env, namespace)

    def _grid_source(
        self, grid: Any, names: list[str], positions: dict[str, int], env: dict[str, Any]
    ) -> tuple[list[str], list[str]]:
        """Expressions for gx, gy, gz (then any setup lines), and the names to guard for zero."""
        if not callable(grid):
            return [str(int(d)) for d in grid], [] if all(grid) else ["0"]
        env["grid_of"] = grid
        dims = self.entry.geometry.grid
        out: list[str] = []
        guard: list[str] = []
        for i, expr in enumerate(dims):
            folded = expr.compile(self.entry.params, positions)
            if not callable(folded):
                out.append(str(int(folded)))
                if not folded:
                    guard.append("0")
            elif expr.source in positions:
                out.append(names[positions[expr.source]])
                guard.append(out[-1])
            else:
                out.append(f"g[{i}]")
                guard.append(out[-1])
        if any(d.startswith("g[") for d in out):
            out.append(f"g = grid_of(({''.join(f'{n}, ' for n in names)}))")
        return out, guard

    def _stream_source(
        self, device: int, stream: Any, env: dict[str, Any], namespace: dict[str, Any]
    ) -> None:
        if stream is not None:
            env["bound_stream"] = stream if isinstance(stream, cu.CUstream) else cu.CUstream(int(stream))
            namespace["_default_stream_source"] = "        stream = bound_stream\n"
            return
        raw_stream = torch_stream_getter()
        if raw_stream is not None:
            env["raw_stream"] = raw_stream
            env["cache"] = _StreamCache()
            env["device"] = device
            namespace["_default_stream_source"] = (
                "        raw = raw_stream(device)\n"
                "        stream = cache.stream if raw == cache.raw else cache.get(raw)\n"
            )
        else:
            env["legacy_stream"] = cu.CUstream(0)
            namespace["_default_stream_source"] = "        stream = legacy_stream\n"

    def __call__(self, *args: Any, stream: Any = None) -> None:  # replaced per instance class
        raise NotImplementedError

    def _failed(self, result: tuple[Any, ...]) -> None:
        check(result, f"cuLaunchKernel({self.name})")

    def _diagnose(self, args: Sequence[Any], exc: Exception) -> LaunchArgumentError:
        """Why a plain call could not pack its arguments (the slow path, for errors only)."""
        for arg, value in zip(self.args, args, strict=True):
            if arg.is_pointer and value.__class__ is not int and not hasattr(value, "data_ptr"):
                return LaunchArgumentError(
                    self.name, arg.name, "must be a device pointer (int) or a tensor", type(value).__name__
                )
            if not arg.is_pointer:
                try:
                    _check_scalar(self.name, arg, value)
                except LaunchArgumentError as err:
                    return err
        return LaunchArgumentError(
            self.name, "*", f"do not pack ({exc})", tuple(type(a).__name__ for a in args)
        )

    def checked(self, *args: Any, stream: Any = None) -> None:
        """Validate every argument against the variant's ABI, then launch."""
        name = self.name
        if len(args) != len(self.args):
            names = ", ".join(a.name for a in self.args)
            raise LaunchArgumentError(name, "*", f"count is wrong; expected ({names})", len(args))
        dtypes = self._torch_dtypes
        if dtypes is None and "torch" in sys.modules:
            torch = sys.modules["torch"]
            dtypes = self._torch_dtypes = tuple(
                getattr(torch, DTYPES[a.dtype].torch_name, None) if a.is_pointer else None  # type: ignore[index]
                for a in self.args
            )
        for i, (arg, value) in enumerate(zip(self.args, args, strict=True)):
            if arg.is_pointer:
                self._check_pointer(arg, value, dtypes[i] if dtypes else None)
            else:
                _check_scalar(name, arg, value)
        if callable(self.grid):
            grid = self.grid(
                tuple(a if not p.is_pointer else 0 for a, p in zip(args, self.args, strict=True))
            )
            if any(isinstance(g, bool) or not isinstance(g, int) or not 0 <= g < 1 << 31 for g in grid):
                raise LaunchArgumentError(name, "grid", "must be non-negative ints below 2**31", grid)
        self(*args, stream=stream)

    def _check_pointer(self, arg: Arg, value: Any, want: Any) -> None:
        name = self.name
        if value.__class__ is int:
            addr = value
        elif hasattr(value, "data_ptr"):
            if want is not None and getattr(value, "dtype", want) != want:
                raise LaunchArgumentError(name, arg.name, f"must have dtype {want}", value.dtype)
            device = getattr(value, "device", None)
            if device is not None and (device.type != "cuda" or device.index != self.device):
                raise LaunchArgumentError(name, arg.name, f"must be on cuda:{self.device}", device)
            if hasattr(value, "is_contiguous") and not value.is_contiguous():
                raise LaunchArgumentError(
                    name, arg.name, "must be contiguous", f"strides {tuple(value.stride())}"
                )
            addr = value.data_ptr()
        else:
            raise LaunchArgumentError(
                name, arg.name, "must be a device pointer (int) or a tensor", type(value).__name__
            )
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
