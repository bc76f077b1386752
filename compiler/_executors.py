"""The one parser of ``--executor``: the executor each of its forms names.

Apart from the :class:`~._executor.Executor` interface, so that the base imports none of the
executors that subclass it.
"""

from __future__ import annotations

import os

from ._dask import DaskExecutor
from ._executor import Executor
from ._pool import LocalExecutor
from .errors import ExecutorError

__all__ = ["EXECUTOR_FORMS", "executor_from"]

EXECUTOR_FORMS = "local, dask://HOST:PORT (or tcp://, tls://) or dask+file://PATH to a scheduler file"


def executor_from(text: str, *, jobs: int | None = None) -> Executor:
    """The executor ``--executor TEXT`` names. ``jobs`` sizes the local pool (default: the CPU
    count); a cluster's size is its workers'. Raises :class:`ExecutorError` for any other form."""
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
