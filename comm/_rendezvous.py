"""Rendezvous: the one collective that creating a communicator needs, an all-gather of bytes.

A :data:`Rendezvous` is any callable that takes this rank's bytes and returns every rank's, in
rank order, once all ranks have called it; calling it again is the next round. Three come with
the package:

- :class:`UnixSocketRendezvous` for processes on one host: rank 0 is a hub on a Unix socket
  path, the others connect to it (retrying until the timeout) and keep the connection for
  every later round;
- :class:`ThreadRendezvous` for ranks that are threads of one process (virtual ranks, tests);
- :func:`torch_rendezvous` for an initialised ``torch.distributed`` group.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import CommArgumentError, RendezvousError

__all__ = ["Rendezvous", "ThreadRendezvous", "UnixSocketRendezvous", "torch_rendezvous"]

Rendezvous = Callable[[bytes], list[bytes]]

_HELLO = struct.Struct(">8sii")  # magic, rank, world
_MAGIC = b"B12XRDV1"
_FRAME = struct.Struct(">cIQ")  # kind (D data, E error), round, length
_LEN = struct.Struct(">Q")


class _Deadline:
    """Seconds left before a fixed moment, for socket timeouts."""

    __slots__ = ("at", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds, self.at = seconds, time.monotonic() + seconds

    def left(self) -> float:
        return max(self.at - time.monotonic(), 0.0)

    def expired(self) -> bool:
        return time.monotonic() >= self.at


def _recv(sock: socket.socket, n: int, deadline: _Deadline) -> bytes:
    data = bytearray()
    while len(data) < n:
        sock.settimeout(max(deadline.left(), 0.001))
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the other side closed the connection")
        data += chunk
    return bytes(data)


def _send_frame(sock: socket.socket, kind: bytes, round_: int, body: bytes, deadline: _Deadline) -> None:
    sock.settimeout(max(deadline.left(), 0.001))
    sock.sendall(_FRAME.pack(kind, round_, len(body)) + body)


def _recv_frame(sock: socket.socket, deadline: _Deadline) -> tuple[bytes, int, bytes]:
    kind, round_, length = _FRAME.unpack(_recv(sock, _FRAME.size, deadline))
    return kind, round_, _recv(sock, length, deadline)


def _pending_refusal(sock: socket.socket) -> tuple[bytes, int, bytes] | None:
    """The hub's refusal (an ``E`` frame) already in ``sock``, if one is there to read."""
    try:
        frame = _recv_frame(sock, _Deadline(0.5))
    except OSError:
        return None
    return frame if frame[0] == b"E" else None


class UnixSocketRendezvous:
    """An all-gather of bytes between ``world`` processes of one host through a Unix socket.

    Rank 0 binds ``path`` at construction (replacing a stale socket file there, refusing any
    other kind of file) and accepts the others on the first call; ranks 1.. connect on the
    first call, retrying until ``timeout``. Connections stay open for later rounds, so one
    instance serves several all-gathers (e.g. a final barrier). Each call waits at most
    ``timeout`` seconds and raises :class:`RendezvousError` naming the ranks that did not come;
    when the hub gives up it tells the connected ranks, which then fail at once.

    Not thread-safe: one rank, one caller at a time. :meth:`close` (idempotent) hangs up and,
    on rank 0, unlinks ``path``.
    """

    def __init__(
        self, path: str | os.PathLike[str], rank: int, world: int, *, timeout: float = 120.0
    ) -> None:
        if not (isinstance(world, int) and world >= 1):
            raise CommArgumentError("UnixSocketRendezvous world", "must be an int >= 1", world)
        if not (isinstance(rank, int) and 0 <= rank < world):
            raise CommArgumentError("UnixSocketRendezvous rank", f"must be in [0, {world})", rank)
        self.path, self.rank, self.world, self.timeout = os.fspath(path), rank, world, timeout
        self._round = 0
        self._listener: socket.socket | None = None
        self._peers: list[socket.socket | None] = [None] * world  # hub: one per rank; rank: [hub]
        self._closed = False
        if rank == 0 and world > 1:
            self._listen()

    def _listen(self) -> None:
        with contextlib.suppress(FileNotFoundError):  # the usual case: a fresh path
            if stat.S_ISSOCK(os.stat(self.path).st_mode):
                os.unlink(self.path)  # a socket file left by a run that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            sock.listen(max(self.world, 16))
        except OSError as exc:
            sock.close()
            raise RendezvousError(
                0,
                f"cannot listen on {self.path} ({exc.strerror})",
                "Pass a path in a writable directory where no other file has that name",
            ) from None
        self._listener = sock

    # --- the all-gather ----------------------------------------------------------------------

    def __call__(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order, once all ``world`` ranks have sent theirs."""
        if self._closed:
            raise RendezvousError(self.rank, "this rendezvous is closed", "Create a new one")
        if self.world == 1:
            return [bytes(data)]
        deadline = _Deadline(self.timeout)
        round_ = self._round
        self._round += 1
        try:
            if self.rank == 0:
                return self._hub_round(bytes(data), round_, deadline)
            return self._rank_round(bytes(data), round_, deadline)
        except RendezvousError:
            self.close()  # the ranks no longer agree on the round: nothing later can succeed
            raise

    def _hub_round(self, data: bytes, round_: int, deadline: _Deadline) -> list[bytes]:
        try:
            self._accept_all(deadline)
            gathered: list[bytes] = [data] + [b""] * (self.world - 1)
            pending = {sock: rank for rank, sock in enumerate(self._peers) if sock is not None}
            with selectors.DefaultSelector() as sel:
                for sock in pending:
                    sel.register(sock, selectors.EVENT_READ)
                while pending:
                    ready = sel.select(timeout=deadline.left())
                    if not ready:
                        raise self._fail(
                            f"ranks {sorted(pending.values())} sent nothing for round {round_} within "
                            f"{deadline.seconds:g} s",
                            "Every rank must make the same sequence of rendezvous calls",
                        )
                    for key, _ in ready:
                        sock = key.fileobj
                        rank = pending.pop(sock)  # type: ignore[call-overload]
                        sel.unregister(sock)
                        gathered[rank] = self._read_round(sock, rank, round_, deadline)  # type: ignore[arg-type]
            reply = b"".join(_LEN.pack(len(b)) + b for b in gathered)
            for sock in self._peers[1:]:
                _send_frame(sock, b"D", round_, reply, deadline)  # type: ignore[arg-type]
            return gathered
        except RendezvousError:
            raise
        except OSError as exc:
            raise self._fail(f"round {round_} failed ({exc})") from None

    def _read_round(self, sock: socket.socket, rank: int, round_: int, deadline: _Deadline) -> bytes:
        try:
            kind, got_round, body = _recv_frame(sock, deadline)
        except OSError as exc:
            raise self._fail(f"rank {rank} hung up during round {round_} ({exc})") from None
        if kind == b"E":
            raise self._fail(f"rank {rank} gave up: {body.decode(errors='replace')}")
        if got_round != round_:
            raise self._fail(f"rank {rank} is at round {got_round}, the hub at round {round_}")
        return body

    def _accept_all(self, deadline: _Deadline) -> None:
        """Accept until every rank has said hello (first round only)."""
        listener = self._listener
        assert listener is not None  # rank 0 with world > 1 listens from construction
        while any(s is None for s in self._peers[1:]):
            listener.settimeout(max(deadline.left(), 0.001))
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                missing = [r for r in range(1, self.world) if self._peers[r] is None]
                raise self._fail(
                    f"ranks {missing} did not connect to {self.path} within {deadline.seconds:g} s",
                    "Check that every rank started and uses the same path and world size",
                ) from None
            try:
                magic, rank, world = _HELLO.unpack(_recv(conn, _HELLO.size, deadline))
            except OSError:
                conn.close()  # a stray or dying client: keep waiting for the real ranks
                continue
            problem = ""
            if magic != _MAGIC:
                problem = "a connection that is not a b12x rendezvous client"
            elif world != self.world:
                problem = f"rank {rank} has world {world}, rank 0 has world {self.world}"
            elif not 0 < rank < self.world or self._peers[rank] is not None:
                problem = f"a second or out-of-range rank {rank} connected"
            if problem:
                try:
                    _send_frame(conn, b"E", 0, problem.encode(), deadline)
                finally:
                    conn.close()
                raise self._fail(problem, "Give every rank a distinct rank and the same world size")
            self._peers[rank] = conn

    def _fail(self, problem: str, hint: str = "") -> RendezvousError:
        """Tell every connected rank the hub gave up, then hand back the error to raise."""
        for sock in self._peers[1:]:
            if sock is not None:
                with contextlib.suppress(OSError):  # that rank is gone already: it learns nothing more
                    _send_frame(sock, b"E", self._round, problem.encode(), _Deadline(0.5))
        return RendezvousError(self.rank, problem, hint)

    def _rank_round(self, data: bytes, round_: int, deadline: _Deadline) -> list[bytes]:
        hub = self._peers[0] or self._connect(deadline)
        try:
            try:
                _send_frame(hub, b"D", round_, data, deadline)
            except OSError:
                # The hub may have refused this rank and hung up before the data went out: its
                # refusal then waits in the socket, and is reported as any other.
                refusal = _pending_refusal(hub)
                if refusal is None:
                    raise
                kind, got_round, body = refusal
            else:
                kind, got_round, body = _recv_frame(hub, deadline)
        except TimeoutError:
            raise RendezvousError(
                self.rank,
                f"rank 0 did not complete round {round_} within {deadline.seconds:g} s",
                "Some rank is slow or missing; every rank must make the same rendezvous calls",
            ) from None
        except OSError as exc:
            raise RendezvousError(self.rank, f"lost the hub (rank 0) during round {round_} ({exc})") from None
        if kind == b"E":
            raise RendezvousError(self.rank, f"rank 0 gave up: {body.decode(errors='replace')}")
        if got_round != round_:
            raise RendezvousError(self.rank, f"rank 0 answered round {got_round}, expected {round_}")
        out: list[bytes] = []
        pos = 0
        while pos < len(body):
            (length,) = _LEN.unpack_from(body, pos)
            out.append(body[pos + _LEN.size : pos + _LEN.size + length])
            pos += _LEN.size + length
        if len(out) != self.world:
            raise RendezvousError(self.rank, f"rank 0 sent {len(out)} entries for world {self.world}")
        return out

    def _connect(self, deadline: _Deadline) -> socket.socket:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(max(deadline.left(), 0.001))
                sock.connect(self.path)
                sock.sendall(_HELLO.pack(_MAGIC, self.rank, self.world))
                self._peers[0] = sock
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if deadline.expired():
                    raise RendezvousError(
                        self.rank,
                        f"could not reach rank 0 at {self.path} within {deadline.seconds:g} s",
                        "Check that rank 0 is running and that every rank uses the same path",
                    ) from None
                time.sleep(0.05)
            except OSError as exc:
                sock.close()
                raise RendezvousError(self.rank, f"connecting to {self.path} failed ({exc})") from None

    def close(self) -> None:
        """Hang up every connection; rank 0 also unlinks its socket file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for sock in self._peers:
            if sock is not None:
                sock.close()
        self._peers = [None] * self.world
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):  # removed by someone else: nothing to clean
                os.unlink(self.path)

    def __enter__(self) -> UnixSocketRendezvous:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ThreadRendezvous:
    """An all-gather between ``world`` threads of one process.

    ``member(rank)`` is rank ``rank``'s :data:`Rendezvous`. A round completes when every rank
    has called; a rank that waits longer than ``timeout`` breaks the group, and every waiting
    or later call raises :class:`RendezvousError` naming the ranks that did not come.
    """

    def __init__(self, world: int, *, timeout: float = 60.0) -> None:
        if not (isinstance(world, int) and world >= 1):
            raise CommArgumentError("ThreadRendezvous world", "must be an int >= 1", world)
        self.world, self.timeout = world, timeout
        self._cond = threading.Condition()
        self._slots: list[bytes | None] = [None] * world
        self._round = 0
        self._result: list[bytes] = []
        self._broken = ""

    def member(self, rank: int) -> Rendezvous:
        if not (isinstance(rank, int) and 0 <= rank < self.world):
            raise CommArgumentError("ThreadRendezvous rank", f"must be in [0, {self.world})", rank)
        return lambda data: self._gather(rank, bytes(data))

    def _gather(self, rank: int, data: bytes) -> list[bytes]:
        with self._cond:
            if self._broken:
                raise RendezvousError(rank, self._broken)
            if self._slots[rank] is not None:
                raise RendezvousError(rank, f"rank {rank} called twice in round {self._round}")
            round_ = self._round
            self._slots[rank] = data
            if all(s is not None for s in self._slots):
                self._result = [s for s in self._slots if s is not None]
                self._slots = [None] * self.world
                self._round += 1
                self._cond.notify_all()
                return list(self._result)
            done = self._cond.wait_for(lambda: self._round != round_ or bool(self._broken), self.timeout)
            if self._round != round_:
                return list(self._result)
            if not done:
                missing = [r for r, s in enumerate(self._slots) if s is None]
                self._broken = (
                    f"ranks {missing} did not join round {round_} within {self.timeout:g} s; "
                    "the group is broken"
                )
                self._cond.notify_all()
            raise RendezvousError(rank, self._broken)


def torch_rendezvous(group: Any = None) -> Rendezvous:
    """A :data:`Rendezvous` over an initialised ``torch.distributed`` process group.

    Built on ``all_gather_object``; with the NCCL backend, set each process's current CUDA
    device first, as torch requires. Imports torch only when called.
    """
    import torch.distributed as dist

    def gather(data: bytes) -> list[bytes]:
        out: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, bytes(data), group=group)
        return [bytes(x) for x in out]

    return gather
