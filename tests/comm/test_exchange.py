"""Passing fds between real processes, and the rendezvous all-gathers, without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from b12x_aot.comm import (
    ExchangeError,
    FdServer,
    RendezvousError,
    ThreadRendezvous,
    UnixSocketRendezvous,
    _rendezvous,
    fetch_fd,
)


def python(code: str, *args: str, timeout: float = 60) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child exited {proc.returncode}\n{out}\n{err}"
    return out


FETCH_AND_READ = """
    import os, sys
    from b12x_aot.comm import fetch_fd
    fd, payload = fetch_fd(sys.argv[1], timeout=20)
    data = os.read(fd, 1 << 16) if sys.argv[2] == "pipe" else os.pread(fd, 1 << 16, 0)
    os.close(fd)
    print(f"{payload.hex()}:{data.hex()}")
"""


def test_fd_of_a_file_reaches_another_process(tmp_path: Path) -> None:
    secret = os.urandom(4096)
    path = tmp_path / "payload.bin"
    path.write_bytes(secret)
    fd = os.open(path, os.O_RDONLY)
    try:
        with FdServer(fd, b"meta") as server:
            out = finish(python(FETCH_AND_READ, server.address, "file"))
            assert server.served == 1
    finally:
        os.close(fd)
    payload, data = out.strip().split(":")
    assert bytes.fromhex(payload) == b"meta"
    assert bytes.fromhex(data) == secret


def test_fd_of_a_pipe_reaches_another_process() -> None:
    read_end, write_end = os.pipe()
    secret = os.urandom(1000)
    try:
        with FdServer(read_end) as server:
            child = python(FETCH_AND_READ, server.address, "pipe")
            os.write(write_end, secret)
            os.close(write_end)
            write_end = -1
            out = finish(child)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    payload, data = out.strip().split(":")
    assert payload == ""
    assert bytes.fromhex(data) == secret


def test_filesystem_socket_and_several_clients(tmp_path: Path) -> None:
    secret = os.urandom(64)
    path = tmp_path / "data"
    path.write_bytes(secret)
    fd = os.open(path, os.O_RDONLY)
    sock = str(tmp_path / "fd.sock")
    try:
        with FdServer(fd, path=sock) as server:
            assert server.address == sock
            children = [python(FETCH_AND_READ, sock, "file") for _ in range(3)]
            outs = [finish(c) for c in children]
        assert not os.path.exists(sock)  # unlinked on close
    finally:
        os.close(fd)
    assert all(bytes.fromhex(o.strip().split(":")[1]) == secret for o in outs)


def test_fetch_from_nobody_times_out() -> None:
    start = time.monotonic()
    with pytest.raises(ExchangeError, match=r"no server answered within 0.3 s"):
        fetch_fd("@b12x-comm-test-nobody-listens-here", timeout=0.3)
    assert time.monotonic() - start < 5


RANK = """
    import json, sys
    from b12x_aot.comm import UnixSocketRendezvous
    path, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with UnixSocketRendezvous(path, rank, world, timeout=30) as rdv:
        first = rdv(f"rank{rank}-round0".encode())
        second = rdv(bytes([rank]) * (rank * 70000))  # large enough to need several reads
        third = rdv(b"")
    print(json.dumps([[x.decode() for x in first], [len(x) for x in second], [len(x) for x in third]]))
"""


def test_unix_socket_rendezvous_three_processes_three_rounds(tmp_path: Path) -> None:
    path = str(tmp_path / "rdv.sock")
    # Ranks start in reverse order: the others must retry until rank 0 listens.
    procs = [python(RANK, path, str(rank), "3") for rank in (2, 1)]
    time.sleep(0.3)
    procs.append(python(RANK, path, "0", "3"))
    results = [json.loads(finish(p)) for p in procs]
    for first, second, third in results:
        assert first == ["rank0-round0", "rank1-round0", "rank2-round0"]
        assert second == [0, 70000, 140000]
        assert third == [0, 0, 0]
    assert not os.path.exists(path)  # rank 0 unlinks its socket on close


def test_hub_times_out_naming_the_ranks_that_never_came(tmp_path: Path) -> None:
    with UnixSocketRendezvous(str(tmp_path / "r.sock"), 0, 3, timeout=0.4) as hub:
        start = time.monotonic()
        with pytest.raises(RendezvousError, match=r"ranks \[1, 2\] did not connect") as err:
            hub(b"x")
        assert time.monotonic() - start < 5
        assert err.value.rank == 0


def test_rank_times_out_without_a_hub(tmp_path: Path) -> None:
    rdv = UnixSocketRendezvous(str(tmp_path / "none.sock"), 1, 2, timeout=0.3)
    with pytest.raises(RendezvousError, match="could not reach rank 0"):
        rdv(b"x")


def test_a_rank_missing_from_a_later_round_is_named_and_the_others_fail_fast(tmp_path: Path) -> None:
    path = str(tmp_path / "r.sock")
    hub = UnixSocketRendezvous(path, 0, 3, timeout=1.0)
    ranks = [UnixSocketRendezvous(path, r, 3, timeout=30.0) for r in (1, 2)]
    errors: dict[int, BaseException] = {}

    def first_round_then(rank: int, again: bool) -> None:
        ranks[rank - 1](b"hello")
        if again:
            try:
                ranks[rank - 1](b"second")
            except RendezvousError as exc:
                errors[rank] = exc

    one, two = (threading.Thread(target=first_round_then, args=(r, r == 1)) for r in (1, 2))
    one.start()
    two.start()
    assert hub(b"hub") == [b"hub", b"hello", b"hello"]
    two.join()  # rank 2 leaves after round 0; rank 1 is already waiting in round 1
    start = time.monotonic()
    with pytest.raises(RendezvousError, match=r"ranks \[2\] sent nothing for round 1"):
        hub(b"hub again")
    one.join()
    assert time.monotonic() - start < 5  # rank 1 did not wait for its own 30 s timeout
    assert "rank 0 gave up: ranks [2] sent nothing" in str(errors[1])
    for r in ranks:
        r.close()


def _raising_in_thread(call, data: bytes) -> tuple[threading.Thread, list[BaseException]]:
    """``call(data)`` started in a thread, and the list its RendezvousError will land in."""
    seen: list[BaseException] = []

    def run() -> None:
        try:
            call(data)
        except RendezvousError as exc:
            seen.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, seen


def _mismatched_pair(tmp_path: Path) -> tuple[UnixSocketRendezvous, UnixSocketRendezvous]:
    """A hub of world 2 and a rank 1 that says world 3."""
    path = str(tmp_path / "r.sock")
    return UnixSocketRendezvous(path, 0, 2, timeout=5.0), UnixSocketRendezvous(path, 1, 3, timeout=5.0)


def test_a_refused_rank_hears_why_though_the_hub_hung_up_first(tmp_path: Path) -> None:
    # The hub refuses a rank at its hello and closes before the rank sends its data: the send
    # fails, and the hub's reason, already in the socket, is what the rank reports.
    hub, odd = _mismatched_pair(tmp_path)
    refusing, seen = _raising_in_thread(hub, b"x")
    odd._connect(_rendezvous._Deadline(5.0))  # its hello only
    refusing.join()
    assert seen, "the hub accepted a rank of another world"
    with pytest.raises(RendezvousError, match="rank 0 gave up: rank 1 has world 3, rank 0 has world 2"):
        odd(b"x")
    hub.close()
    odd.close()


def test_world_mismatch_is_refused_on_both_sides(tmp_path: Path) -> None:
    hub, odd = _mismatched_pair(tmp_path)
    thread, seen = _raising_in_thread(odd, b"x")
    with pytest.raises(RendezvousError, match="rank 1 has world 3, rank 0 has world 2"):
        hub(b"x")
    thread.join()
    assert seen and "world 3" in str(seen[0])
    hub.close()
    with pytest.raises(RendezvousError, match="closed"):
        hub(b"x")


def test_world_of_one_needs_no_socket(tmp_path: Path) -> None:
    rdv = UnixSocketRendezvous(str(tmp_path / "solo.sock"), 0, 1)
    assert rdv(b"alone") == [b"alone"]
    assert not os.path.exists(tmp_path / "solo.sock")


def test_thread_rendezvous_rounds() -> None:
    world = 4
    group = ThreadRendezvous(world, timeout=10)
    results: dict[int, list[list[bytes]]] = {}

    def rank(r: int) -> None:
        member = group.member(r)
        results[r] = [member(f"{r}:{k}".encode()) for k in range(5)]

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(world):
        for k in range(5):
            assert results[r][k] == [f"{s}:{k}".encode() for s in range(world)]


def test_thread_rendezvous_timeout_names_the_missing_rank_and_breaks_the_group() -> None:
    group = ThreadRendezvous(3, timeout=0.3)
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            group.member(r)(b"x")
        except RendezvousError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2
    assert all("ranks [1] did not join round 0" in str(e) for e in errors)
    with pytest.raises(RendezvousError, match="the group is broken"):
        group.member(1)(b"late")


TORCH_RANK = """
    import json, sys
    import torch.distributed as dist
    from b12x_aot.comm import torch_rendezvous
    store = dist.FileStore(sys.argv[1], 2)
    dist.init_process_group("gloo", store=store, rank=int(sys.argv[2]), world_size=2)
    gather = torch_rendezvous()
    rounds = [gather(f"{sys.argv[2]}:{k}".encode()) for k in range(2)]
    dist.destroy_process_group()
    print(json.dumps([[x.decode() for x in r] for r in rounds]))
"""


def test_torch_rendezvous_over_gloo(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    store = str(tmp_path / "store")
    procs = [python(TORCH_RANK, store, str(rank)) for rank in (0, 1)]
    for proc in procs:
        assert json.loads(finish(proc, timeout=120)) == [["0:0", "1:0"], ["0:1", "1:1"]]
