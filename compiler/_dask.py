"""``--executor dask://HOST:PORT``: the same jobs on a dask.distributed cluster, recorded here.

dask and distributed (the ``[dask]`` extra) are imported lazily, so a local build never loads
them. This process, the client, stays the only registry writer: each task compiles one job in
a warm compile child on a worker (``_dask_worker``) and returns its :class:`CompileOutcome`,
cubin included, which is recorded here the moment it lands. So a SQLite registry works with a
remote cluster, and workers need no database access.

Before any job is submitted, every worker reports its :class:`Fingerprint` and any difference
from the client's refuses the build, as does a worker without nvdisasm when a spec's limits
need SASS (the build decides, as for the local pool); a worker that joins later is checked by
the plugin before its first compile, and refuses too. Ends map as locally: past the timeout the worker kills its
child (``timeout``), and a child that dies fails its job. A worker lost mid-task is rescheduled
by dask; a task that keeps killing workers (``distributed.scheduler.allowed-failures``) comes
back as ``KilledWorker`` and ends as a ``failed`` variant.
"""

from __future__ import annotations

import contextlib
import traceback
import uuid
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ._driver import CompileJob, CompileOutcome
from ._executor import Executor
from ._sass import has_nvdisasm
from ._status import Status
from ._toolchain import Fingerprint, environment_fingerprint, refuse_workers
from .errors import CompilerError, ExecutorError

if TYPE_CHECKING:
    from ._plan import Plan

__all__ = ["DaskExecutor"]

_CONNECT_TIMEOUT_S = 30.0
_WORKERS_TIMEOUT_S = 60.0


def _distributed() -> ModuleType:
    try:
        import distributed
    except ImportError as exc:
        raise ExecutorError(
            f"--executor dask needs dask.distributed, which is not installed ({exc}); "
            "pip install 'b12x-aot[dask]' on the client and on every worker"
        ) from None
    return distributed


class DaskExecutor(Executor):
    """Compile on the workers of the dask scheduler at ``address`` (``tcp://HOST:PORT``), or the
    one a ``scheduler_file`` names. Connects on first use; :meth:`close` disconnects."""

    def __init__(self, address: str | None = None, *, scheduler_file: str | None = None) -> None:
        if (address is None) == (scheduler_file is None):
            raise ExecutorError("a dask executor takes a scheduler address or a scheduler file, not both")
        self.address, self.scheduler_file = address, scheduler_file
        self._client: Any = None
        self._checked: Fingerprint | None = None
        self._without_nvdisasm: list[str] = []
        self._needs_sass: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"dask scheduler {self.address or self.scheduler_file}"

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close()

    def _connect(self) -> Any:
        if self._client is None:
            distributed = _distributed()
            try:
                if self.address is not None:
                    client = distributed.Client(
                        self.address, timeout=_CONNECT_TIMEOUT_S, set_as_default=False
                    )
                else:
                    client = distributed.Client(
                        scheduler_file=self.scheduler_file, timeout=_CONNECT_TIMEOUT_S, set_as_default=False
                    )
            except (OSError, ValueError) as exc:  # TimeoutError is an OSError
                raise ExecutorError(
                    f"cannot reach the {self.describe()}: {exc}; start it with `dask scheduler` "
                    "and its workers with `dask worker`"
                ) from None
            self._client = client
        return self._client

    def check(self, plan: Plan) -> None:
        """Ask every worker for its fingerprint of the plan's kernels; refuse on any difference
        (:class:`ToolchainError`, naming the worker, the item and both values). Waits up to a
        minute for a first worker. Checking the same fingerprint again returns at once. Each
        worker also says whether it has nvdisasm (:meth:`without_nvdisasm`)."""
        expected = plan.fingerprint()
        # A worker that joins later refuses the plan's SASS-decided limits itself (the plugin).
        self._needs_sass = tuple(plan.needs_sass())
        if expected == self._checked:
            return
        client = self._connect()
        try:
            client.wait_for_workers(1, timeout=_WORKERS_TIMEOUT_S)
        except TimeoutError:
            raise ExecutorError(
                f"the {self.describe()} has no workers after {_WORKERS_TIMEOUT_S:.0f} s; "
                "start some with `dask worker`"
            ) from None
        try:
            reports = client.run(environment_fingerprint, expected.modules, on_error="return")
            tools = client.run(has_nvdisasm, on_error="return")
        except OSError as exc:
            raise ExecutorError(f"lost the {self.describe()} while checking its workers: {exc}") from None
        problems: list[str] = []
        for worker, got in sorted(reports.items()):
            if isinstance(got, Fingerprint):
                problems += expected.mismatches(got, worker)
            else:
                problems.append(f"worker {worker}: cannot report its toolchain: {got}")
        if problems:
            raise refuse_workers(problems)
        self._without_nvdisasm = [f"worker {w}" for w, found in sorted(tools.items()) if found is not True]
        self._checked = expected

    def without_nvdisasm(self) -> list[str]:
        """The workers that had no nvdisasm when :meth:`check` asked them."""
        return list(self._without_nvdisasm)

    def run_jobs(
        self,
        jobs: Sequence[CompileJob],
        on_outcome: Callable[[CompileOutcome], None],
        *,
        timeout: float | None,
    ) -> None:
        """Submit every job, then record outcomes in completion order, in this thread."""
        if not jobs:
            return
        if self._checked is None:
            raise ExecutorError("check the plan against the workers (DaskExecutor.check) before compiling")
        distributed = _distributed()
        from ._dask_worker import CompilePlugin, compile_on_worker

        client = self._connect()
        build = uuid.uuid4().hex[:12]
        plugin = f"b12x-compile-{build}"  # one per build: unregistering it stops its children
        client.register_plugin(CompilePlugin(self._checked, self._needs_sass), name=plugin)
        futures: dict[Any, CompileJob] = {}
        try:
            # Submitted in arch order, which dask keeps, so a worker's children rarely switch arch.
            for job in sorted(jobs, key=lambda j: j.arch):
                future = client.submit(
                    compile_on_worker,
                    job,
                    timeout,
                    plugin,
                    key=f"b12x-compile-{job.variant.key}-{build}",
                    pure=False,
                    retries=0,
                )
                futures[future] = job
            for future in distributed.as_completed(list(futures), loop=client.loop):
                job = futures.pop(future)
                on_outcome(_outcome(distributed, future, job))
                future.release()
        finally:
            if futures:
                client.cancel(list(futures))
            # If the connection or the workers are gone, their children went with them.
            with contextlib.suppress(OSError, KeyError):
                client.unregister_worker_plugin(plugin)


def _outcome(distributed: ModuleType, future: Any, job: CompileJob) -> CompileOutcome:
    """The outcome a finished task stands for; a worker's refusal or a lost scheduler raises."""
    if future.status == "finished":
        return future.result()
    if future.status != "error":
        raise ExecutorError(
            f"the dask scheduler dropped {job.variant.label} ({future.status}); everything recorded so "
            "far stays, and rerunning the same command builds the rest"
        )
    exc = future.exception()
    if isinstance(exc, distributed.KilledWorker):
        return CompileOutcome.worker_failure(
            job,
            Status.FAILED,
            f"dask workers died {exc.allowed_failures + 1} times while running it (the last was "
            f"{exc.last_worker.address}); it may be what kills them: see the workers' logs",
        )
    if isinstance(exc, CompilerError):
        raise exc  # a late worker's toolchain refusal ends the build, as the first check would
    log = "".join(traceback.format_exception(type(exc), exc, future.traceback()))
    return CompileOutcome.worker_failure(
        job, Status.FAILED, f"dask task failed: {type(exc).__name__}: {exc}", log=log
    )
