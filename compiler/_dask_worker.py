"""The worker side of ``--executor dask``: warm compile children in a worker plugin, and the task.

Imported by dask on the workers, and by the client only when it registers the plugin, so it may
import distributed at the top. The children are :class:`CompileChild` processes, the ones the
local pool uses; they are started with subprocess, which the nanny's daemonic worker processes
are allowed to do, so ``dask worker`` needs no special setting.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any

from distributed import WorkerPlugin, get_worker

from ._child import CompileChild
from ._driver import CompileJob, CompileOutcome
from ._sass import has_nvdisasm, sass_refusal
from ._toolchain import Fingerprint, environment_fingerprint, refuse_workers
from .errors import CompilerError, ExecutorError

__all__ = ["CompilePlugin", "compile_on_worker"]

_IDLE_S = 300.0  # an idle child is stopped after this long (a killed client leaves idle ones)
_REAP_EVERY_S = 30.0


class CompilePlugin(WorkerPlugin):
    """One worker's compile children, per arch, started on first use and reused by later tasks.

    Each build registers its own plugin and unregisters it when it ends, which stops the
    children, so no child outlives the sources it imported. ``expected`` is the client's
    fingerprint: before its first compile the worker compares its own with it (this covers a
    worker that joined after the client's check) and refuses every task on a difference, or when
    it has no nvdisasm and the specs ``needs_sass`` names have limits only SASS decides.
    """

    def __init__(self, expected: Fingerprint, needs_sass: tuple[str, ...] = ()) -> None:
        self.expected = expected
        self.needs_sass = needs_sass

    def setup(self, worker: Any) -> None:
        self._address: str = worker.address
        self._scratch = tempfile.mkdtemp(prefix="b12x-compile-")
        self._lock = threading.Lock()
        self._idle: dict[str, list[tuple[CompileChild, float]]] = defaultdict(list)
        self._busy: set[CompileChild] = set()
        self._verify_lock = threading.Lock()
        self._refusal: CompilerError | None = None
        self._verified = False
        self._closing = threading.Event()
        threading.Thread(target=self._reap, name="b12x-reap-children", daemon=True).start()

    def teardown(self, worker: Any) -> None:
        self._closing.set()
        with self._lock:
            idle = [child for children in self._idle.values() for child, _ in children]
            self._idle.clear()
            busy = list(self._busy)
        for child in busy:
            child.interrupt()  # its task sees the death and returns a failed outcome nobody waits for
        for child in idle:
            child.kill()
        shutil.rmtree(self._scratch, ignore_errors=True)

    def compile(self, job: CompileJob, timeout: float | None) -> CompileOutcome:
        """Compile ``job`` in an idle child for its arch (started if there is none)."""
        self._verify()
        child = self._checkout(job.arch)
        try:
            return child.run(job, timeout)
        finally:
            self._checkin(child)

    def _verify(self) -> None:
        with self._verify_lock:
            if not self._verified:
                self._refusal = self._check()
                self._verified = True
        if self._refusal is not None:
            raise self._refusal

    def _check(self) -> CompilerError | None:
        """Why this worker must not compile the build's jobs, or None; the client's own checks."""
        try:
            got = environment_fingerprint(self.expected.modules)
        except CompilerError as exc:
            return refuse_workers([f"worker {self._address}: cannot report its toolchain: {exc}"])
        problems = self.expected.mismatches(got, self._address)
        if problems:
            return refuse_workers(problems)
        if self.needs_sass and not has_nvdisasm():
            return sass_refusal(self.needs_sass, [f"worker {self._address}"])
        return None

    def _checkout(self, arch: str) -> CompileChild:
        with self._lock:
            if self._closing.is_set():
                raise ExecutorError(f"worker {self._address}: this build's compile plugin was removed")
            idle = self._idle[arch]
            child = idle.pop()[0] if idle else CompileChild(arch, self._scratch)
            self._busy.add(child)
        return child

    def _checkin(self, child: CompileChild) -> None:
        with self._lock:
            self._busy.discard(child)
            keep = not child.gone and not self._closing.is_set()
            if keep:
                self._idle[child.arch].append((child, time.monotonic()))
        if not keep:
            child.kill()

    def _reap(self) -> None:
        """Stop children idle for long (the plugin of a build whose client was killed stays)."""
        while not self._closing.wait(_REAP_EVERY_S):
            now = time.monotonic()
            with self._lock:
                stale = [c for children in self._idle.values() for c, t in children if now - t > _IDLE_S]
                for children in self._idle.values():
                    children[:] = [(c, t) for c, t in children if now - t <= _IDLE_S]
            for child in stale:
                child.stop()


def compile_on_worker(job: CompileJob, timeout: float | None, plugin: str) -> CompileOutcome:
    """The dask task: compile ``job`` in this worker's child for ``job.arch``, through the
    build's :class:`CompilePlugin` named ``plugin``. Past ``timeout`` the child is killed and the
    outcome is ``timeout``; a child that dies gives ``failed``. Raises :class:`ToolchainError`
    when this worker's toolchain differs from the client's."""
    worker = get_worker()
    found = worker.plugins.get(plugin)
    if not isinstance(found, CompilePlugin):
        raise ExecutorError(f"worker {worker.address} has no compile plugin {plugin!r}")
    return found.compile(job, timeout)
