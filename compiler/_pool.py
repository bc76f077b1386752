"""A process pool for compiles: workers bound to one arch, a timeout per job, crash-proof.

``cute.compile`` is not thread-safe and reads its arch at import, so each worker is a fresh
process (spawn) that imports the DSL once for one arch and then compiles many jobs. Jobs are
handed out one at a time over a pipe per worker, so the parent always knows which job a worker
holds: a job past its timeout gets its worker killed and replaced, and a worker that dies
(segfault, OOM) fails only its own job. Every job ends as exactly one outcome.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from ._driver import CompileJob, CompileOutcome, compile_job, prepare_worker

__all__ = ["run_jobs"]

_START_TIMEOUT = 300.0  # seconds for a worker to import the DSL


def _worker_main(arch: str, scratch: str, conn: Connection) -> None:
    prepare_worker(arch, scratch)
    conn.send(("ready", None))
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(("done", compile_job(job)))


@dataclass(slots=True)
class _Worker:
    arch: str
    process: Any
    conn: Connection
    ready: bool = False
    job: CompileJob | None = None
    started: float = field(default_factory=time.monotonic)


def _spawn(ctx: Any, arch: str, scratch: str) -> _Worker:
    parent, child = ctx.Pipe()
    proc = ctx.Process(
        target=_worker_main, args=(arch, scratch, child), daemon=True, name=f"b12x-compile-{arch}"
    )
    proc.start()
    child.close()
    return _Worker(arch, proc, parent)


def _stop(worker: _Worker, *, kill: bool) -> None:
    if kill:
        worker.process.kill()
    else:
        try:
            worker.conn.send(None)
        except (BrokenPipeError, OSError):
            worker.process.kill()
    worker.process.join(timeout=10)
    if worker.process.is_alive():
        worker.process.kill()
        worker.process.join()
    worker.conn.close()


def _failure(job: CompileJob, status: str, reason: str, seconds: float) -> CompileOutcome:
    return CompileOutcome(job.variant, status, "worker", reason, reason, seconds)


def run_jobs(
    jobs: Sequence[CompileJob],
    on_outcome: Callable[[CompileOutcome], None],
    *,
    workers: int,
    timeout: float | None,
) -> None:
    """Compile ``jobs`` on up to ``workers`` processes; call ``on_outcome`` in this process.

    Jobs are grouped by arch so that workers rarely switch arch (a switch costs a DSL import).
    """
    if not jobs:
        return
    ctx = mp.get_context("spawn")
    scratch = tempfile.mkdtemp(prefix="b12x-compile-")
    pending: deque[CompileJob] = deque(sorted(jobs, key=lambda j: j.arch))
    pool: list[_Worker] = []
    try:
        while pending or any(w.job is not None for w in pool):
            # Fill idle capacity: reuse a ready worker of the right arch, else start one.
            for worker in list(pool):
                if worker.ready and worker.job is None and pending:
                    job = next((j for j in pending if j.arch == worker.arch), None)
                    if job is None:
                        _stop(worker, kill=False)
                        pool.remove(worker)
                        continue
                    pending.remove(job)
                    worker.job, worker.started = job, time.monotonic()
                    worker.conn.send(job)
            while len(pool) < workers and pending:
                busy_archs = [w.arch for w in pool]
                arch = next((j.arch for j in pending if j.arch not in busy_archs), pending[0].arch)
                pool.append(_spawn(ctx, arch, scratch))
            if not pool:
                break
            ready = wait([w.conn for w in pool] + [w.process.sentinel for w in pool], timeout=1.0)
            now = time.monotonic()
            for worker in list(pool):
                died = worker.process.sentinel in ready and not worker.conn.poll()
                if worker.conn in ready and worker.conn.poll():
                    try:
                        kind, payload = worker.conn.recv()
                    except (EOFError, OSError):
                        died = True
                    else:
                        if kind == "ready":
                            worker.ready = True
                        else:
                            worker.job = None
                            on_outcome(payload)
                        continue
                limit = timeout if worker.ready else _START_TIMEOUT
                if worker.job is not None and limit is not None and now - worker.started > limit:
                    job = worker.job
                    _stop(worker, kill=True)
                    pool.remove(worker)
                    on_outcome(
                        _failure(
                            job,
                            "timeout",
                            f"compile exceeded the {limit:.0f} s timeout",
                            now - worker.started,
                        )
                    )
                elif died or (not worker.ready and now - worker.started > _START_TIMEOUT):
                    job = worker.job
                    code = worker.process.exitcode
                    _stop(worker, kill=True)
                    pool.remove(worker)
                    if job is not None:
                        on_outcome(
                            _failure(
                                job, "failed", f"compile worker died (exit code {code})", now - worker.started
                            )
                        )
                    elif not worker.ready:
                        # The worker could not even start: fail its arch's jobs rather than loop.
                        for lost in [j for j in pending if j.arch == worker.arch]:
                            pending.remove(lost)
                            on_outcome(
                                _failure(
                                    lost,
                                    "failed",
                                    f"compile worker for {worker.arch} failed to start (exit code {code})",
                                    0.0,
                                )
                            )
    finally:
        for worker in pool:
            _stop(worker, kill=worker.job is not None)
        shutil.rmtree(scratch, ignore_errors=True)
