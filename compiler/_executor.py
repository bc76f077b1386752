"""Where compile jobs run: the executor interface, and the one parser of ``--executor``.

An executor compiles jobs and hands each outcome back to the process that records it; it never
writes the registry. ``local`` (the default) is a process pool on this machine; a dask address
or scheduler file fans the same jobs out over a dask.distributed cluster. Planning, keys,
staleness, timeouts, progress and exit codes are the same on every executor.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from ._driver import CompileJob, CompileOutcome
from ._plan import Plan
from .errors import ExecutorError

__all__ = ["EXECUTOR_FORMS", "Executor", "executor_from"]

EXECUTOR_FORMS = "local, dask://HOST:PORT (or tcp://, tls://) or dask+file://PATH to a scheduler file"


class Executor(ABC):
    """Compiles jobs somewhere and reports every outcome to the caller's thread. A context
    manager: leaving it closes the executor."""

    @abstractmethod
    def describe(self) -> str:
        """Where the jobs run, for messages."""

    @abstractmethod
    def check(self, plan: Plan) -> None:
        """Raise :class:`ToolchainError` unless every process that may compile ``plan``'s jobs
        has the toolchain and sources the plan was made with. Call before :meth:`run_jobs`."""

    @abstractmethod
    def without_nvdisasm(self) -> list[str]:
        """The processes that may compile jobs here and have no nvdisasm, named for messages
        ("this machine", "worker tcp://..."); empty when every one has it. Call after
        :meth:`check`. The build, not the executor, decides what a missing one means."""

    @abstractmethod
    def run_jobs(
        self,
        jobs: Sequence[CompileJob],
        on_outcome: Callable[[CompileOutcome], None],
        *,
        timeout: float | None,
    ) -> None:
        """Compile ``jobs`` and call ``on_outcome`` exactly once per job, in the caller's thread,
        as each one lands. ``timeout`` bounds one compile; past it the job ends as ``timeout``."""

    @abstractmethod
    def close(self) -> None:
        """Release what the executor holds (a cluster connection); idempotent."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def executor_from(text: str, *, jobs: int | None = None) -> Executor:
    """The executor ``--executor TEXT`` names. ``jobs`` sizes the local pool (default: the CPU
    count); a cluster's size is its workers'. Raises :class:`ExecutorError` for any other form."""
    from ._dask import DaskExecutor  # both subclass Executor: imported here, not at the top
    from ._pool import LocalExecutor

    if text == "local":
        return LocalExecutor(jobs or os.cpu_count() or 1)
    if text.startswith("dask://"):
        return DaskExecutor("tcp://" + _host_port(text, text.removeprefix("dask://")))
    if text.startswith(("tcp://", "tls://")):
        _host_port(text, text.partition("://")[2])
        return DaskExecutor(text)
    if text.startswith("dask+file://"):
        path = text.removeprefix("dask+file://")
        if not path:
            raise ExecutorError(f"--executor dask+file:// needs a path (got {text!r})")
        return DaskExecutor(scheduler_file=path)
    raise ExecutorError(f"--executor takes {EXECUTOR_FORMS} (got {text!r})")


def _host_port(text: str, rest: str) -> str:
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ExecutorError(
            f"--executor needs a scheduler address HOST:PORT, like dask://sched:8786 (got {text!r})"
        )
    return f"{host}:{port}"
