"""Passing a file descriptor to another process over an ``AF_UNIX`` socket (``SCM_RIGHTS``).

An :class:`FdServer` hands one fd (and a few bytes of payload) to every process that connects,
from a background thread, until it is closed. :func:`fetch_fd` connects to one and returns a
new fd of this process for the same open file. The kernel duplicates the fd in flight, so no
ptrace rights are needed (unlike ``pidfd_getfd``).

Addresses are text: ``@name`` is a Linux abstract-namespace socket (nothing on disk; the name
carries a random token), anything else a filesystem path. The server answers only processes of
its own user (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time

from .errors import CommArgumentError, ExchangeError

__all__ = ["FdServer", "fetch_fd"]

_REQUEST = b"B12XFD1?"
_HEADER = struct.Struct(">I")  # payload length
_MAX_PAYLOAD = 1 << 16
_POLL_S = 0.1  # how often the accept loop looks at its stop flag


def _sockaddr(address: str) -> str | bytes:
    return b"\0" + address[1:].encode() if address.startswith("@") else address


class FdServer:
    """Serve ``fd`` with ``payload`` to every peer that connects, until :meth:`close`.

    ``path`` picks a filesystem socket (created here, unlinked on close); by default the server
    binds a fresh abstract-namespace name. The fd stays owned by the caller: the server never
    closes it. ``timeout`` bounds each conversation with one peer.
    """

    def __init__(
        self, fd: int, payload: bytes = b"", *, path: str | None = None, timeout: float = 10.0
    ) -> None:
        if len(payload) > _MAX_PAYLOAD:
            raise CommArgumentError("FdServer payload", f"must be at most {_MAX_PAYLOAD} bytes", len(payload))
        self._fd, self._payload, self._timeout = fd, payload, timeout
        self.address = path if path is not None else f"@b12x-comm-{os.getpid()}-{os.urandom(8).hex()}"
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(_sockaddr(self.address))
            self._sock.listen(64)
            self._sock.settimeout(_POLL_S)
        except OSError as exc:
            self._sock.close()
            raise ExchangeError(
                self.address, f"cannot listen ({exc.strerror})", "Pass another path or directory"
            ) from None
        self._stop = threading.Event()
        self.served = 0
        self.refused = 0
        self._thread = threading.Thread(target=self._serve, name=f"b12x-comm fd server {self.address}")
        self._thread.daemon = True  # never keeps a dying process alive
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listening socket was closed
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        """One peer: check its user, read its request, send the payload with the fd."""
        conn.settimeout(self._timeout)
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid != os.getuid():
                self.refused += 1
                return
            request = _recv_exact(conn, len(_REQUEST))
            if request != _REQUEST:
                self.refused += 1
                return
            socket.send_fds(conn, [_HEADER.pack(len(self._payload)) + self._payload], [self._fd])
            self.served += 1
        except OSError:
            # A peer that hangs up or stalls mid-conversation fails on its own side with an
            # ExchangeError; the server keeps serving the others.
            self.refused += 1

    def close(self) -> None:
        """Stop serving and unlink a filesystem socket. Idempotent; the fd stays open."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._sock.close()
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):  # already gone: nothing to clean up
                os.unlink(self._path)

    def __enter__(self) -> FdServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("peer closed the connection")
        data += chunk
    return data


def fetch_fd(address: str, *, timeout: float = 10.0) -> tuple[int, bytes]:
    """Connect to the :class:`FdServer` at ``address`` and receive its fd and payload.

    Retries the connection until ``timeout`` seconds pass (the server may still be starting).
    Returns a new fd of this process, which the caller must close. Raises
    :class:`ExchangeError` when nothing answers in time, the server refuses, or no fd arrives.
    """
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while True:
            try:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock.connect(_sockaddr(address))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() >= deadline:
                    raise ExchangeError(
                        address,
                        f"no server answered within {timeout:g} s",
                        "Check that the peer process is alive and shares this host and network namespace",
                    ) from None
                time.sleep(0.02)
            except TimeoutError:
                raise ExchangeError(address, f"connecting timed out after {timeout:g} s") from None
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(_REQUEST)
            msg, fds, flags, _ = socket.recv_fds(sock, _HEADER.size + _MAX_PAYLOAD, 1)
        except TimeoutError:
            raise ExchangeError(address, f"the server did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise ExchangeError(address, f"receiving failed ({exc})") from None
        if not fds:
            raise ExchangeError(
                address,
                "the server sent no file descriptor" + (" (it refused this process)" if not msg else ""),
                "Both processes must run as the same user",
            )
        fd = fds[0]
        for extra in fds[1:]:
            os.close(extra)
        try:
            if flags & socket.MSG_CTRUNC:
                raise ExchangeError(address, "the file descriptor was truncated in flight (MSG_CTRUNC)")
            if len(msg) < _HEADER.size:
                raise ExchangeError(address, f"short reply ({len(msg)} bytes)")
            (length,) = _HEADER.unpack_from(msg)
            payload = msg[_HEADER.size :]
            if len(payload) < length:
                payload += _recv_exact(sock, length - len(payload))
        except OSError as exc:
            os.close(fd)
            raise ExchangeError(address, f"receiving the payload failed ({exc})") from None
        except BaseException:
            os.close(fd)
            raise
        return fd, payload
    finally:
        sock.close()
