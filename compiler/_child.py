"""The compile child: one process bound to one arch, shared by every executor.

``cute.compile`` is not thread-safe and reads its arch at import, so compiles run in a child
process that imports the DSL once for one arch (:func:`prepare_worker`) and then compiles many
jobs, one at a time. The child is started with :mod:`subprocess`, not :mod:`multiprocessing`:
a dask worker under its nanny is a daemonic process, and daemonic processes may not start
multiprocessing children, but they may run programs. Jobs and outcomes travel as pickled
``multiprocessing.connection`` frames over a socket pair the child inherits; the child's stdout
goes to stderr, so nothing the DSL prints reaches the protocol or a ``--json`` report.

The parent always knows which job its child holds: past its time limit the child is killed and
the job ends as ``timeout``, and a child that dies (segfault, OOM, ``os._exit``) fails only the
job it held. Every job sent ends as exactly one outcome. A child that cannot start sends its
traceback, which the jobs that never ran record as their log. A child whose parent dies, or
closes the pipe, exits too, quietly: nobody is left to read a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait

from ._driver import CompileJob, CompileOutcome, compile_job, prepare_worker
from ._status import Status

__all__ = ["START_TIMEOUT", "CompileChild"]

START_TIMEOUT = 300.0  # seconds for a child to import the DSL
_STOP_GRACE_S = 10.0
_BOOT = "from b12x_aot.compiler._child import main; main()"


class CompileChild:
    """A running compile process for one arch. Its owner drives it from one thread.

    ``ready`` once the DSL is imported; ``job`` is the job it holds, if any; ``gone`` once it has
    exited or been killed, with ``start_failure`` set if that happened before it was ready (and
    ``start_log``, the child's traceback, when it could send one).
    """

    __slots__ = (
        "_conn",
        "_process",
        "_since",
        "arch",
        "gone",
        "job",
        "ready",
        "start_failure",
        "start_log",
    )

    def __init__(self, arch: str, scratch: str) -> None:
        ours, theirs = Pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, arch, scratch, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=2,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._conn = ours
        self.arch = arch
        self.job: CompileJob | None = None
        self.ready = False
        self.gone = False
        self.start_failure: str | None = None
        self.start_log = ""
        self._since = time.monotonic()
        self._post(list(sys.path))  # the child finds modules where this process does

    def fileno(self) -> int:
        """For :func:`multiprocessing.connection.wait`: readable when a message or EOF arrives."""
        return self._conn.fileno()

    def send(self, job: CompileJob) -> None:
        """Hand a ready, idle child its next job; its timeout counts from now."""
        if not self.ready or self.job is not None or self.gone:
            raise RuntimeError(f"compile child for {self.arch} cannot take a job now")
        self.job, self._since = job, time.monotonic()
        self._post(job)

    def update(self, readable: bool, timeout: float | None) -> CompileOutcome | None:
        """Take in what happened since the last wait: a message, a death, or a time limit passed.

        ``readable`` says whether the last wait found this child readable. Returns the held
        job's outcome when it ended (compiled, died, timed out), else None; afterwards ``gone``
        says whether the child must be dropped.
        """
        if self.gone:
            return None
        if readable or self._process.poll() is not None:
            try:
                if self._conn.poll():
                    kind, payload = self._conn.recv()
                    if kind == "ready":
                        self.ready = True
                        return None
                    if kind == "start_failed":
                        self.start_log = payload
                        last = payload.strip().splitlines()[-1] if payload.strip() else "no traceback"
                        return self._lost(
                            Status.FAILED, f"compile worker for {self.arch} failed to start: {last}"
                        )
                    self.job = None
                    return payload
            except (EOFError, OSError):
                pass
            code = self._exit_code()
            if self.ready:
                return self._lost(Status.FAILED, f"compile worker died (exit code {code})")
            return self._lost(
                Status.FAILED, f"compile worker for {self.arch} failed to start (exit code {code})"
            )
        elapsed = time.monotonic() - self._since
        if not self.ready and elapsed > START_TIMEOUT:
            return self._lost(
                Status.FAILED, f"compile worker for {self.arch} did not start within {START_TIMEOUT:.0f} s"
            )
        if self.job is not None and timeout is not None and elapsed > timeout:
            return self._lost(Status.TIMEOUT, f"compile exceeded the {timeout:.0f} s timeout")
        return None

    def run(self, job: CompileJob, timeout: float | None) -> CompileOutcome:
        """Compile ``job`` in this child and block until it ends. Never raises for the job's sake:
        a start failure, a death or the timeout comes back as the job's outcome."""
        while not self.ready:
            self.update(bool(wait([self], 1.0)), None)
            if self.gone:
                reason = self.start_failure or f"compile worker for {self.arch} failed to start"
                return CompileOutcome.worker_failure(job, Status.TRANSIENT, reason, log=self.start_log)
        self.send(job)
        while True:
            outcome = self.update(bool(wait([self], 1.0)), timeout)
            if outcome is not None:
                return outcome

    def stop(self) -> None:
        """Ask an idle child to exit; kill it if it does not within a grace period."""
        if not self.gone:
            try:
                self._conn.send(None)
                self._process.wait(timeout=_STOP_GRACE_S)
            except (OSError, subprocess.TimeoutExpired):
                pass  # a closed pipe or a slow exit: killed below either way
        self.kill()

    def kill(self) -> None:
        """Kill the process now and release the pipe; safe to call more than once."""
        self.gone = True
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._conn.close()

    def interrupt(self) -> None:
        """Kill the process from another thread; the owning thread sees the death and ends the
        job as failed (the pipe stays open until it does)."""
        if self._process.poll() is None:
            self._process.kill()

    def _post(self, message: object) -> None:
        # A child that just died cannot take it: the next update() sees the death (and fails
        # the job, if this was one), so the send error itself carries nothing.
        with contextlib.suppress(OSError):
            self._conn.send(message)

    def _exit_code(self) -> int | None:
        try:
            return self._process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            return None  # EOF from a live process; killed by _lost

    def _lost(self, status: Status, reason: str) -> CompileOutcome | None:
        """The child is gone, or is killed now: end its job with ``status`` and ``reason``."""
        self.kill()
        job, self.job = self.job, None
        if job is not None:
            return CompileOutcome.worker_failure(job, status, reason, time.monotonic() - self._since)
        if not self.ready:
            self.start_failure = reason
        return None


def _exit_with(parent: int) -> None:
    """Exit when ``parent`` does, even mid-compile (an orphan would hold its memory forever)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="b12x-watch-parent", daemon=True).start()


def main() -> None:
    """The child's side: ``python -c _BOOT ARCH SCRATCH FD PARENT_PID``."""
    arch, scratch, fd, parent = sys.argv[1:5]
    conn = Connection(int(fd))
    _exit_with(int(parent))
    # Ctrl-C reaches the whole process group; the parent ends its children itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _serve(conn, arch, scratch)
    except (EOFError, OSError):
        # The parent closed the pipe (killed, or stopping the build): nobody reads an answer.
        os._exit(1)


def _serve(conn: Connection, arch: str, scratch: str) -> None:
    sys.path[:] = conn.recv()
    try:
        prepare_worker(arch, scratch)
    except Exception:
        log = traceback.format_exc()
        sys.stderr.write(log)
        conn.send(("start_failed", log))
        raise SystemExit(1) from None
    conn.send(("ready", None))
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(("done", compile_job(job)))
