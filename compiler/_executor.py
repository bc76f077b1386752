"""Where compile jobs run: the executor interface.

An executor compiles jobs and hands each outcome back to the process that records it; it never
writes the registry. ``local`` (the default, :mod:`._pool`) is a process pool on this machine;
a dask address or scheduler file (:mod:`._dask`) fans the same jobs out over a dask.distributed
cluster; :func:`~._executors.executor_from` picks one by its ``--executor`` text. Planning,
keys, staleness, timeouts, progress and exit codes are the same on every executor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from ._driver import CompileJob, CompileOutcome
from ._plan import Plan

__all__ = ["Executor"]


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
