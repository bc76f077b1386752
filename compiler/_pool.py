"""The local executor: a pool of compile children on this machine (``--executor local``).

Up to ``workers`` :class:`CompileChild` processes, each bound to one arch. Jobs are grouped by
arch so that children rarely switch arch (a switch costs a DSL import), and handed out one at a
time, so the pool always knows which job each child holds: a job past its timeout gets its
child killed and replaced, and a child that dies fails only its own job. A child that cannot
even start is replaced, up to :data:`START_ATTEMPTS` times per arch; after that, with no child
of the arch left, its pending jobs end as ``transient`` (retried by the next build) rather than
the pool restarting children forever.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter, deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

from ._child import CompileChild
from ._driver import CompileJob, CompileOutcome
from ._executor import Executor
from ._sass import has_nvdisasm
from ._status import Status
from .errors import ExecutorError

if TYPE_CHECKING:
    from ._plan import Plan

__all__ = ["START_ATTEMPTS", "LocalExecutor"]

START_ATTEMPTS = 3  # children of one arch that may fail to start before its jobs are given up


class LocalExecutor(Executor):
    """Compile on up to ``workers`` child processes of this one; the default executor."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ExecutorError(f"a local executor needs at least one worker (got {workers})")
        self.workers = workers

    def describe(self) -> str:
        return f"local pool of {self.workers}"

    def check(self, plan: Plan) -> None:
        """Nothing to compare: the children run this interpreter in this environment."""

    def without_nvdisasm(self) -> list[str]:
        """The children find nvdisasm as this process does."""
        return [] if has_nvdisasm() else ["this machine"]

    def close(self) -> None:
        """Nothing held between builds: each :meth:`run_jobs` starts and stops its children."""

    def run_jobs(
        self,
        jobs: Sequence[CompileJob],
        on_outcome: Callable[[CompileOutcome], None],
        *,
        timeout: float | None,
    ) -> None:
        """Compile ``jobs``, calling ``on_outcome`` here, in this thread, once per job."""
        if not jobs:
            return
        scratch = tempfile.mkdtemp(prefix="b12x-compile-")
        pending: deque[CompileJob] = deque(sorted(jobs, key=lambda j: j.arch))
        pool: list[CompileChild] = []
        start_failures: Counter[str] = Counter()
        last_start_failure: dict[str, CompileChild] = {}
        try:
            while pending or any(c.job is not None for c in pool):
                # Fill idle capacity: reuse a ready child of the right arch, else start one.
                for child in list(pool):
                    if child.ready and child.job is None and pending:
                        job = next((j for j in pending if j.arch == child.arch), None)
                        if job is None:
                            child.stop()
                            pool.remove(child)
                            continue
                        pending.remove(job)
                        child.send(job)
                while len(pool) < self.workers:
                    startable = [j.arch for j in pending if start_failures[j.arch] < START_ATTEMPTS]
                    if not startable:
                        break
                    busy_archs = [c.arch for c in pool]
                    arch = next((a for a in startable if a not in busy_archs), startable[0])
                    pool.append(CompileChild(arch, scratch))
                # An arch whose children keep failing to start, with none left to run its jobs.
                for arch in sorted({j.arch for j in pending} - {c.arch for c in pool}):
                    if start_failures[arch] < START_ATTEMPTS:
                        continue
                    failed = last_start_failure[arch]
                    reason = f"{failed.start_failure} ({start_failures[arch]} attempts)"
                    for lost in [j for j in pending if j.arch == arch]:
                        pending.remove(lost)
                        on_outcome(
                            CompileOutcome.worker_failure(
                                lost, Status.TRANSIENT, reason, log=failed.start_log
                            )
                        )
                if not pool:
                    break
                readable = wait(pool, timeout=1.0)
                for child in list(pool):
                    outcome = child.update(child in readable, timeout)
                    if outcome is not None:
                        on_outcome(outcome)
                    if not child.gone:
                        continue
                    pool.remove(child)
                    if child.start_failure is not None:
                        start_failures[child.arch] += 1
                        last_start_failure[child.arch] = child
        finally:
            for child in pool:
                if child.job is not None or not child.ready:  # a starting child cannot read a stop
                    child.kill()
                else:
                    child.stop()
            shutil.rmtree(scratch, ignore_errors=True)
