"""Prepared launches: everything bound once, so a launch is one ``pack_into`` and one driver call.

``Kernel.prepare()`` builds a :class:`PreparedLaunch` from plain inputs (the variant's index
entry, a device, its function handle and a stream): a preallocated parameter buffer, the
``void*[]`` that points into it, the per-device function, the block, the shared memory and
the grid. Its ``__call__`` and ``checked`` are generated for the variant's ABI (see
``_codegen``), so a call does no loops or parsing: it converts pointer arguments (ints pass
through; tensors give ``data_ptr()``), packs the buffer and calls ``cuLaunchKernel``
(``cuLaunchKernelEx`` with the cluster size, for a variant that has clusters of more than one
CTA). A variant with tensor arguments first looks its tensors' pointers, shapes and strides up
in its memo (``_memo``) and launches the buffer packed for them before: a repeated launch on
the same tensors derives, encodes and packs nothing.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

from cuda.bindings import driver as cu

from b12x_aot.contract import Arg, Expr, ParamLayout, TensorMap

from ._cuda import check, torch_stream_getter
from ._index import IndexEntry
from ._memo import EMPTY, LaunchMemo
from .errors import LaunchArgumentError

# The code generators (``_codegen``, ``_checks``) load on the first prepare, not at import:
# ``import b12x_aot.loader`` stays within its budget.

__all__ = ["PreparedLaunch"]

_SUCCESS = cu.CUresult.CUDA_SUCCESS

_CALL = """\
def __call__(self, {sig}*, stream=None):
    try:
{prelude}{args}        pack(buf, 0, {values})
    except Exception as exc:
        raise diagnose(({sig}), exc) from None
{launch}"""

# A variant with tensor arguments looks its input words up in its memo (``_memo``): a hit
# launches the buffer packed for them before; a miss runs ``fill``, which derives and packs
# every word into the memo's oldest slot.
_MEMO_CALL = """\
def __call__(self, {sig}*, stream=None):
    try:
        key = ({key})
        hit = recall(key)
        if hit is None:
            hit = fill(key, {sig})
    except Exception as exc:
        raise diagnose(({sig}), exc) from None
    if hit is EMPTY:
        return
{launch}"""
_FILL = """\
def fill(key, {sig}):
{prelude}{args}    return store(key, ({gx}, {gy}, {gz}), ({values}))
"""
_MEMO_PLAIN = (
    "    argv, gx, gy, gz = hit\n"
    "    result = launch(func, gx, gy, gz, {bx}, {by}, {bz}, {smem}, stream, argv, 0)\n"
)
_MEMO_CLUSTER = (
    "    argv, config, last = hit\n"
    "    if last is not stream:\n"
    "        config.hStream = hit[2] = stream\n"
    "    result = launch_ex(config, func, argv, 0)\n"
)
_PACKED = """\
def packed(self, {sig}):
    try:
{prelude}{args}        return pack_bytes({values})
    except Exception as exc:
        raise diagnose(({sig}), exc) from None
"""

# ``checked`` packs after its checks; a derived word that still cannot pack (one too wide for
# its width, a division by zero) is reported like a plain call's.
_CHECKED_PACK = """\
    try:
        pack(buf, 0, {packed})
    except Exception as exc:
        raise diagnose(({sig}), exc) from None
"""

# The lines from the grid guard to the driver call; {call} is one of the two below.
_LAUNCH = """\
{guard}    if stream is None:
{default_stream}    elif stream.__class__ is not CUstream:
        stream = as_stream(stream)
{call}    if result[0] is not SUCCESS:
        failed(result)
"""
_PLAIN_CALL = "    result = launch(func, {gx}, {gy}, {gz}, {bx}, {by}, {bz}, {smem}, stream, argv, 0)\n"
# A variant with a cluster launches through cuLaunchKernelEx: the DSL's cubins carry no
# compile-time cluster size, so it goes in a launch attribute, on a config bound once.
_CLUSTER_CALL = (
    "    config.gridDimX, config.gridDimY, config.gridDimZ, config.hStream = {gx}, {gy}, {gz}, stream\n"
    "    result = launch_ex(config, func, argv, 0)\n"
)


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

    Pointer arguments are ints (device addresses), :class:`Buffer` s or torch tensors (the
    plain call takes any object with ``data_ptr()``; :meth:`checked` wants a tensor's dtype,
    device, layout and shape too); scalars are ints (floats for ``f32``/``f64``). ``stream`` is
    a ``CUstream`` or an int handle; by default it is torch's current stream on this device
    when torch was imported before :meth:`Kernel.prepare`, else the stream given to
    ``prepare``, else the legacy default stream. An empty grid launches nothing.

    Not thread-safe: calls share the parameter buffers (and a cluster launch's config, which
    holds the grid and stream); threads that launch concurrently each prepare their own.

    The plain call trusts its arguments: use it on hot paths whose inputs are already known to
    be right. :meth:`checked` first validates count, scalar kinds and ranges, the spec's launch
    requirements, and each pointer's dtype, device, contiguity, size (see ``_checks``) and
    alignment, and raises :class:`LaunchArgumentError` (a ``ValueError``) before launching.
    """

    __slots__ = ("_argv", "_buf", "args", "device", "entry", "layout", "name")

    def __new__(cls, entry: IndexEntry, device: int, function: Any, stream: Any = None) -> PreparedLaunch:
        # Each prepared launch gets a subclass whose __call__ and checked are generated for its
        # ABI, so a call dispatches straight into them.
        namespace: dict[str, Any] = {}
        self = object.__new__(type("PreparedLaunch", (cls,), {"__slots__": ()}))
        self._bind(entry, device, function, stream, namespace)
        type(self).__call__ = namespace["__call__"]
        type(self).checked = namespace["checked"]
        type(self).packed = namespace["packed"]
        return self

    def _bind(
        self, entry: IndexEntry, device: int, function: Any, stream: Any, namespace: dict[str, Any]
    ) -> None:
        from ._checks import UncheckedSizeWarning

        self.entry = entry
        self.device = device
        self.name = entry.label
        self.args: tuple[Arg, ...] = entry.args
        params = entry.kernel_params
        self.layout = ParamLayout.of(params, entry.arch)
        slots = [s if isinstance(s, TensorMap) else Expr.parse(s) for s in ParamLayout.slots(params)]
        self._buf = ctypes.create_string_buffer(max(self.layout.size, 1))
        base = ctypes.addressof(self._buf)
        self._argv = (ctypes.c_void_p * max(len(params), 1))(*(base + o for o in self.layout.offsets))
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
        default_stream = self._stream_source(device, stream, env)
        if entry.static.cluster is not None:
            env["config"], env["launch_ex"] = _cluster_config(entry), cu.cuLaunchKernelEx
        source = _sources(entry, env, slots, default_stream, device, self.layout)
        exec(compile(source, f"<prepared launch {entry.family}>", "exec"), env, namespace)
        if "fill" in namespace:  # the plain call finds it among its globals
            env["fill"] = namespace["fill"]
        unsized = [a.name for a in self.args if a.is_pointer and a.shape is None]
        if unsized:
            import warnings

            warnings.warn(
                f"{self.name}: the spec declares no shape for {', '.join(unsized)}, so checked() "
                "cannot bound their sizes",
                UncheckedSizeWarning,
                stacklevel=4,
            )

    @staticmethod
    def _stream_source(device: int, stream: Any, env: dict[str, Any]) -> str:
        """The lines that pick the stream of a call that names none."""
        if stream is not None:
            env["bound_stream"] = stream if isinstance(stream, cu.CUstream) else cu.CUstream(int(stream))
            return "        stream = bound_stream\n"
        raw_stream = torch_stream_getter()
        if raw_stream is not None:
            env["raw_stream"] = raw_stream
            env["cache"] = _StreamCache()
            env["device"] = device
            return (
                "        raw = raw_stream(device)\n"
                "        stream = cache.stream if raw == cache.raw else cache.get(raw)\n"
            )
        env["legacy_stream"] = cu.CUstream(0)
        return "        stream = legacy_stream\n"

    def __call__(self, *args: Any, stream: Any = None) -> None:  # replaced per instance class
        raise NotImplementedError

    def checked(self, *args: Any, stream: Any = None) -> None:  # replaced per instance class
        """Validate every argument against the variant's ABI and sizes, then launch."""
        raise NotImplementedError

    def packed(self, *args: Any) -> bytes:  # replaced per instance class
        """The kernel parameter bytes a plain call with ``args`` launches (tensor maps encoded
        as it would encode them), without launching: for inspection and benchmarks."""
        raise NotImplementedError

    def shapes(self, **scalars: int) -> dict[str, tuple[int, ...]]:
        """Every pointer argument's shape for these scalar arguments (see ``IndexEntry.shapes``)."""
        return self.entry.shapes(**scalars)

    def _failed(self, result: tuple[Any, ...]) -> None:
        driver_call = "cuLaunchKernel" if self.entry.static.cluster is None else "cuLaunchKernelEx"
        check(result, f"{driver_call}({self.name})")

    def _diagnose(self, args: Sequence[Any], exc: Exception) -> LaunchArgumentError:
        """Why a plain call could not pack its arguments (the slow path, for errors only)."""
        from ._checks import NOT_A_POINTER, scalar_error
        from ._tensors import NOT_A_TENSOR, is_tensor_like

        if isinstance(exc, LaunchArgumentError):  # a tensor map's encoder names its tensor
            return exc
        for arg, value in zip(self.args, args, strict=True):
            if arg.is_pointer and value.__class__ is not int and not hasattr(value, "data_ptr"):
                return LaunchArgumentError(self.name, arg.name, NOT_A_POINTER, type(value).__name__)
            if arg.is_tensor and not is_tensor_like(value):
                return LaunchArgumentError(self.name, arg.name, NOT_A_TENSOR, type(value).__name__)
            error = scalar_error(self.name, arg, value) if arg.is_scalar else None
            if error is not None:
                return error
        return LaunchArgumentError(
            self.name, "*", f"do not pack ({exc})", tuple(type(a).__name__ for a in args)
        )


def _tail(entry: IndexEntry, dims: Sequence[str], default_stream: str) -> str:
    """The lines from the grid guard to the driver call, for a call that packs ``buf``."""
    varying = ["0"] if "0" in dims else [d for d in dims if not d.isdigit()]
    block, smem = entry.static.block, entry.static.smem
    call = (_PLAIN_CALL if entry.static.cluster is None else _CLUSTER_CALL).format(
        gx=dims[0], gy=dims[1], gz=dims[2], bx=block[0], by=block[1], bz=block[2], smem=smem
    )
    return _LAUNCH.format(
        guard=f"    if not ({' and '.join(varying)}):\n        return\n" if varying else "",
        default_stream=default_stream,
        call=call,
    )


def _sources(
    entry: IndexEntry,
    env: dict[str, Any],
    slots: Sequence[Expr | TensorMap],
    default_stream: str,
    device: int,
    layout: ParamLayout,
) -> str:
    """The source of the variant's ``__call__``, ``checked`` and ``packed`` (and the plain
    call's ``fill``, for a variant with tensor arguments); binds what they read into ``env``."""
    from ._checks import checked_source, checked_sources
    from ._codegen import Codegen, plain_sources

    inputs = entry.input_words
    call = Codegen(entry, env, inputs, plain_sources(inputs))
    values = ", ".join(call.slot(s, i) for i, s in enumerate(slots))
    grid = [call.value(e) for e in entry.geometry.grid]
    args = call.args_line
    sig = call.signature
    if any(a.is_tensor for a in entry.args):
        config = None if entry.static.cluster is None else (lambda: _cluster_config(entry))
        memo = LaunchMemo(layout.fmt, layout.offsets, config)
        env.update(recall=memo.entries.get, store=memo.store, EMPTY=EMPTY)
        block, smem = entry.static.block, entry.static.smem
        launch = (_MEMO_PLAIN if entry.static.cluster is None else _MEMO_CLUSTER).format(
            bx=block[0], by=block[1], bz=block[2], smem=smem
        )
        source = _MEMO_CALL.format(
            sig=sig,
            key=", ".join(call.key_parts()) + ",",
            launch=_LAUNCH.format(guard="", default_stream=default_stream, call=launch),
        )
        source += _FILL.format(
            sig=sig,
            prelude=call.prelude("    "),
            args=args,
            gx=grid[0],
            gy=grid[1],
            gz=grid[2],
            values=values + "," if values else "",
        )
    else:
        source = _CALL.format(
            sig=sig,
            prelude=call.prelude(),
            values=values,
            args="    " + args if args else "",
            launch=_tail(entry, grid, default_stream),
        )
    env["pack_bytes"] = struct.Struct(layout.fmt).pack
    source += _PACKED.format(
        sig=sig, prelude=call.prelude(), args="    " + args if args else "", values=values
    )
    checks = Codegen(entry, env, inputs, checked_sources(inputs))
    body, packed, dims = checked_source(entry, checks, device, slots)
    return (
        source
        + body
        + _CHECKED_PACK.format(packed=packed, sig=checks.signature)
        + _tail(entry, dims, default_stream)
    )


def _cluster_config(entry: IndexEntry) -> Any:
    """A ``CUlaunchConfig`` with ``entry``'s block, shared memory and cluster size; each call
    sets the grid and the stream."""
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster = attr.value.clusterDim
    cluster.x, cluster.y, cluster.z = entry.static.cluster
    config = cu.CUlaunchConfig()
    config.blockDimX, config.blockDimY, config.blockDimZ = entry.static.block
    config.sharedMemBytes = entry.static.smem
    config.attrs, config.numAttrs = [attr], 1
    return config
