"""A rank's window: device memory that its peers map, created and shared with the CUDA VMM API.

The owner allocates physical memory with ``cuMemCreate`` (pinned, on its device, exportable as
a POSIX file descriptor), reserves an address range, maps it and grants its device read-write
access, then exports an fd. A peer in another process imports that fd once
(``cuMemImportFromShareableHandle``, closing the fd right after), maps it into its own address
space the same way and grants its own device access. A peer in the same process uses the
owner's address directly and maps nothing.

Sizes are rounded up to the allocation granularity (2 MiB on an H200). Nothing here uses
multicast objects.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Sequence
from typing import Any

from cuda.bindings import driver as cu

from ._device import DeviceContext, check
from .errors import CommArgumentError
from .layout import DATA_OFFSET, ERROR_PTR_OFFSET, FLAGS_OFFSET, MAX_WORLD, PEERS_OFFSET, TIMEOUT_OFFSET

__all__ = ["Window", "header_image", "peer_table", "round_up"]

_FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def header_image(timeout_ns: int, error_ptr: int) -> bytes:
    """The window's first ``FLAGS_OFFSET`` bytes at creation: counters zero, the timeout and the
    error record's device address set, the peer table zero (written after the exchange)."""
    image = bytearray(FLAGS_OFFSET)
    struct.pack_into("<Q", image, TIMEOUT_OFFSET, timeout_ns)
    struct.pack_into("<Q", image, ERROR_PTR_OFFSET, error_ptr)
    return bytes(image)


def peer_table(addresses: Sequence[int]) -> bytes:
    """The ``peers[MAX_WORLD]`` table: each rank's window base as mapped here, zero past world."""
    if len(addresses) > MAX_WORLD:
        raise CommArgumentError("peer table", f"holds at most {MAX_WORLD} ranks", len(addresses))
    return struct.pack(f"<{MAX_WORLD}Q", *addresses, *([0] * (MAX_WORLD - len(addresses))))


def _prop(device: int) -> Any:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = _FD
    return prop


def _access(device: int) -> Any:
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


class Window:
    """Device memory mapped at ``va`` for ``size`` bytes on this process's ``device``.

    Built by :meth:`allocate` (this rank's own window, exportable through :attr:`fd`) or
    :meth:`map_peer` (another process's window, from its fd). :meth:`close` unmaps, frees the
    address range and releases the handle; it is idempotent. Closing the owner's window while a
    peer still maps it is safe: the memory lives until the last mapping and handle are gone.
    """

    __slots__ = ("_ctx", "_fd", "_handle", "device", "owned", "size", "va")

    def __init__(self, ctx: DeviceContext, handle: Any, va: int, size: int, owned: bool) -> None:
        self._ctx, self._handle, self.va, self.size, self.owned = ctx, handle, va, size, owned
        self.device = ctx.device
        self._fd = -1

    @staticmethod
    def granularity(device: int) -> int:
        """The minimum allocation granularity for a window on ``device`` (sizes round up to it)."""
        return int(
            check(
                cu.cuMemGetAllocationGranularity(
                    _prop(device), cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
                ),
                "cuMemGetAllocationGranularity",
            )
        )

    @classmethod
    def allocate(cls, ctx: DeviceContext, nbytes: int) -> Window:
        """A new window of at least ``nbytes`` on ``ctx``'s device, mapped read-write there and
        exported as an fd. Its contents are undefined until written."""
        with ctx:
            size = round_up(max(nbytes, 1), cls.granularity(ctx.device))
            handle = check(cu.cuMemCreate(size, _prop(ctx.device), 0), "cuMemCreate")
            try:
                window = cls._map(ctx, handle, size, owned=True)
            except BaseException:
                check(cu.cuMemRelease(handle), "cuMemRelease")
                raise
            try:
                window._fd = int(
                    check(cu.cuMemExportToShareableHandle(handle, _FD, 0), "cuMemExportToShareableHandle")
                )
            except BaseException:
                window.close()
                raise
        return window

    @classmethod
    def map_peer(cls, ctx: DeviceContext, fd: int, size: int) -> Window:
        """Import a peer's window from ``fd`` (closed here, success or not) and map its ``size``
        bytes read-write for ``ctx``'s device."""
        try:
            with ctx:
                handle = check(cu.cuMemImportFromShareableHandle(fd, _FD), "cuMemImportFromShareableHandle")
        finally:
            os.close(fd)  # the imported handle holds its own reference to the allocation
        with ctx:
            try:
                return cls._map(ctx, handle, size, owned=False)
            except BaseException:
                check(cu.cuMemRelease(handle), "cuMemRelease")
                raise

    @classmethod
    def _map(cls, ctx: DeviceContext, handle: Any, size: int, *, owned: bool) -> Window:
        """Reserve, map and grant access; undo what succeeded if a later step fails."""
        gran = cls.granularity(ctx.device)
        va = check(cu.cuMemAddressReserve(size, gran, 0, 0), "cuMemAddressReserve")
        try:
            check(cu.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
        except BaseException:
            check(cu.cuMemAddressFree(va, size), "cuMemAddressFree")
            raise
        try:
            check(cu.cuMemSetAccess(va, size, [_access(ctx.device)], 1), "cuMemSetAccess")
        except BaseException:
            check(cu.cuMemUnmap(va, size), "cuMemUnmap")
            check(cu.cuMemAddressFree(va, size), "cuMemAddressFree")
            raise
        return cls(ctx, handle, int(va), size, owned)

    @property
    def fd(self) -> int:
        """The exported POSIX fd of an owned window (-1 once :meth:`close_fd` ran, or for a peer)."""
        return self._fd

    def close_fd(self) -> None:
        """Close the exported fd once every peer has imported it (their handles stay valid)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def write(self, offset: int, data: bytes) -> None:
        """Copy host bytes to ``va + offset`` (``cuMemcpyHtoD``; returns once the source is read)."""
        buf = ctypes.create_string_buffer(data, len(data))
        with self._ctx:
            check(cu.cuMemcpyHtoD(self.va + offset, ctypes.addressof(buf), len(data)), "cuMemcpyHtoD")

    def read(self, offset: int, nbytes: int) -> bytes:
        """Copy ``nbytes`` at ``va + offset`` to the host (``cuMemcpyDtoH``, synchronous)."""
        buf = ctypes.create_string_buffer(nbytes)
        with self._ctx:
            check(cu.cuMemcpyDtoH(ctypes.addressof(buf), self.va + offset, nbytes), "cuMemcpyDtoH")
        return buf.raw

    def zero(self, offset: int, nbytes: int) -> None:
        """``cuMemsetD8`` to 0; it may finish after returning, so synchronise before relying on it."""
        with self._ctx:
            check(cu.cuMemsetD8(self.va + offset, 0, nbytes), "cuMemsetD8")

    def reset_control(self, timeout_ns: int, error_ptr: int) -> None:
        """Zero the header and every barrier flag, then write the timeout and the error record's
        address (the peer table stays zero until :meth:`write` puts it at ``PEERS_OFFSET``)."""
        self.zero(0, DATA_OFFSET)
        self.write(0, header_image(timeout_ns, error_ptr))

    def write_peers(self, addresses: Sequence[int]) -> None:
        self.write(PEERS_OFFSET, peer_table(addresses))

    def close(self) -> None:
        """Unmap, free the address range, release the handle and close the fd. Idempotent."""
        self.close_fd()
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        with self._ctx:
            check(cu.cuMemUnmap(self.va, self.size), "cuMemUnmap")
            check(cu.cuMemAddressFree(self.va, self.size), "cuMemAddressFree")
            check(cu.cuMemRelease(handle), "cuMemRelease")

    def __repr__(self) -> str:
        kind = "own" if self.owned else "peer"
        return f"<Window {kind} device={self.device} va={self.va:#x} size={self.size}>"
