"""CUDA IPC windows between two processes on one GPU, and the driver plumbing of a window.

Two processes create windows (``cuMemCreate`` with POSIX fds), hand their fds to each other
through the fd servers, addressed via a ``UnixSocketRendezvous``, map each other's windows,
write patterns with ``cuMemcpyHtoD`` and read the peer's back with ``cuMemcpyDtoH``. No
spinning kernel crosses the processes.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from b12x_aot.comm._device import DeviceContext, ErrorRecord, check
from b12x_aot.comm._window import Window, header_image
from b12x_aot.comm.layout import DATA_OFFSET, ERROR_TIMEOUT, FLAGS_OFFSET, WindowLayout

pytestmark = pytest.mark.gpu

CHILD = """
    import json, os, random, sys
    from b12x_aot.comm import DeviceContext, FdServer, UnixSocketRendezvous, Window, fetch_fd

    path, rank = sys.argv[1], int(sys.argv[2])
    other = 1 - rank
    N = 1 << 20

    def pattern(seed, n):
        return random.Random(seed).randbytes(n)

    ctx = DeviceContext(0)
    own = Window.allocate(ctx, 3 << 20)
    server = FdServer(own.fd)
    rdv = UnixSocketRendezvous(path, rank, 2, timeout=60)
    me = {"pid": os.getpid(), "address": server.address, "size": own.size}
    peer_info = json.loads(rdv(json.dumps(me).encode())[other])
    assert peer_info["pid"] != me["pid"]
    fd, _ = fetch_fd(peer_info["address"], timeout=30)
    peer = Window.map_peer(ctx, fd, peer_info["size"])
    try:
        os.fstat(fd)
        raise AssertionError("the imported fd should be closed")
    except OSError:
        pass
    rdv(b"mapped")
    server.close()
    own.close_fd()

    # each writes its own window: head and tail, so the whole mapping is exercised
    own.write(0, pattern(rank, N))
    own.write(own.size - 4096, pattern(100 + rank, 4096))
    ctx.synchronize()
    rdv(b"written")
    assert peer.read(0, N) == pattern(other, N), "peer head differs"
    assert peer.read(peer.size - 4096, 4096) == pattern(100 + other, 4096), "peer tail differs"

    # each writes into the peer's window, then reads what the peer wrote into its own
    peer.write(N, pattern(200 + rank, 4096))
    ctx.synchronize()
    rdv(b"cross-written")
    assert own.read(N, 4096) == pattern(200 + other, 4096), "cross write differs"

    # rank 0 drops its window; rank 1's mapping keeps the memory alive
    rdv(b"before close")
    if rank == 0:
        own.close()
    rdv(b"closed")
    if rank == 1:
        assert peer.read(0, N) == pattern(0, N), "memory vanished with its owner"
    rdv(b"done")
    peer.close()
    own.close()
    own.close()
    rdv.close()
    ctx.close()
    print("ok", own.size)
"""


def test_two_processes_share_windows_on_one_gpu(tmp_path: Path) -> None:
    path = str(tmp_path / "rdv.sock")
    code = textwrap.dedent(CHILD)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, path, str(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"rank exited {proc.returncode}\n{out}\n{err}"
        outs.append(out.split())
    for word, size in outs:
        assert word == "ok"
        assert int(size) >= 3 << 20 and int(size) % (2 << 20) == 0


@pytest.fixture
def ctx():
    context = DeviceContext(0)
    yield context
    context.close()


def test_window_rounds_to_the_granularity_and_resets_its_control_block(ctx) -> None:
    layout = WindowLayout(4, 4096)
    window = Window.allocate(ctx, layout.bytes)
    try:
        gran = Window.granularity(0)
        assert window.size % gran == 0 and window.size >= layout.bytes
        assert window.fd >= 0
        window.write(0, b"\xff" * DATA_OFFSET)
        window.reset_control(123_456_789, 0xDEAD_BEEF_0000)
        window.write_peers([window.va, 1, 2, 3])
        ctx.synchronize()
        head = window.read(0, DATA_OFFSET)
        expect = bytearray(header_image(123_456_789, 0xDEAD_BEEF_0000))
        expect[64 : 64 + 32] = b"".join(v.to_bytes(8, "little") for v in (window.va, 1, 2, 3))
        assert head[:FLAGS_OFFSET] == bytes(expect)
        assert head[FLAGS_OFFSET:] == bytes(DATA_OFFSET - FLAGS_OFFSET)  # every flag zero
    finally:
        window.close()
        window.close()
    assert window.fd == -1


def test_error_record_is_seen_by_the_host_without_a_copy(ctx) -> None:
    from cuda.bindings import driver as cu

    record = ErrorRecord(ctx)
    try:
        assert record.words[0] == 0 and record.words[1] == 0
        word = ERROR_TIMEOUT | 1 << 24 | 2 << 16 | 9
        with ctx:  # the device writes through its own address of the record
            check(cu.cuMemsetD32(record.device_ptr, word, 1), "cuMemsetD32")
            check(cu.cuMemsetD32(record.device_ptr + 4, 77, 1), "cuMemsetD32")
            check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        assert (record.words[0], record.words[1]) == (word, 77)
        assert ctypes.c_uint32.from_address(record.host_ptr).value == word
    finally:
        record.close()
        record.close()
