"""Compiling one variant with the CuTe DSL, inside a worker process bound to one arch.

The DSL reads ``CUTE_DSL_ARCH`` when ``cutlass`` is imported and decides which instructions
are legal from it, so each worker sets it (and a private dump directory) before importing the
DSL once, then compiles many variants of that arch. A job never raises: any DSL, ptxas or
contract failure comes back as a :class:`CompileOutcome` with its reason and full log.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

from b12x_aot.contract import Arg, Geometry, StaticGeometry, VariantId
from b12x_aot.registry import KernelResources, SassHistogram

from ._contract import check_contract, check_limits, undecided_limits
from ._cubin import inspect_cubin
from ._entry import prepare_entry
from ._host_launch import read_host_launch
from ._launch_record import RecordedLaunch, record_launch
from ._sass import sass_histograms
from ._spec import EntryValue, Limits
from ._status import Status
from ._toolchain import COMPILE_OPTIONS
from ._variants import Variant
from .errors import ContractError, EntryError

__all__ = ["CompileJob", "CompileOutcome", "compile_job", "prepare_worker"]


@dataclass(frozen=True, slots=True)
class CompileJob:
    """Everything a worker needs to compile one variant; picklable, parsed once at planning."""

    variant: VariantId
    kernel: str  # "package.module:name"
    args: tuple[Arg, ...]
    geometry: Geometry
    static: StaticGeometry
    limits: Limits
    options: str
    init: tuple[tuple[str, EntryValue], ...] | None = None
    constexpr: tuple[tuple[str, EntryValue], ...] = ()

    @property
    def arch(self) -> str:
        return self.variant.arch

    @classmethod
    def of(cls, variant: Variant, options: str = COMPILE_OPTIONS) -> CompileJob:
        """The job that compiles a variant the planner accepted."""
        if variant.static is None:
            raise ValueError(f"{variant.label} was rejected by the planner; it has no job")
        spec = variant.spec
        return cls(
            variant.id,
            spec.kernel,
            variant.args,
            spec.geometry,
            variant.static,
            spec.limits,
            options,
            spec.init,
            spec.constexpr,
        )


@dataclass(frozen=True, slots=True)
class CompileOutcome:
    """How one job ended. ``ok`` carries the cubin and what the registry records of it."""

    variant: VariantId
    status: Status
    stage: str  # compile, contract, limits, worker
    reason: str
    log: str
    seconds: float
    cubin: bytes | None = None
    symbol: str | None = None
    launch: RecordedLaunch | None = None
    resources: KernelResources | None = None
    ptxas_version: str | None = None
    ptxas_flags: str | None = None
    sass: SassHistogram | None = None

    @classmethod
    def worker_failure(
        cls, job: CompileJob, status: Status, reason: str, seconds: float = 0.0, log: str = ""
    ) -> CompileOutcome:
        """A job that ended without a compile result: its process died (``failed``), ran past
        its timeout (``timeout``) or never started (``transient``); stage ``worker``."""
        return cls(job.variant, status, "worker", reason, log or reason, seconds)


def prepare_worker(arch: str, scratch: str) -> None:
    """Bind this process to ``arch`` and import the DSL once. Call before anything else.

    Everything the worker writes (DSL dumps, nvdisasm inputs) goes into a fresh directory under
    ``scratch``, which the caller owns and removes, also after killing the worker.
    """
    os.environ["CUTE_DSL_ARCH"] = arch
    workdir = tempfile.mkdtemp(prefix=f"{arch}-", dir=scratch)
    # --keep-cubin also writes a file named without the compile-time constants; keep those
    # private to this worker so variants of one kernel never read each other's dumps.
    os.environ["CUTE_DSL_DUMP_DIR"] = workdir
    os.environ["TMPDIR"] = workdir  # the DSL makes a cache directory under it at import
    tempfile.tempdir = workdir
    os.chdir(workdir)
    import cutlass  # noqa: F401  (imported once per worker, after the arch is set)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def _reason(exc: BaseException) -> str:
    """The first line of what went wrong, without the DSL's terminal colours; the whole text
    goes to the log (``b12x-registry failures --log``)."""
    text = _ANSI.sub("", str(exc)).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    more = f" (and {len(lines) - 1} more lines in the log)" if len(lines) > 1 else ""
    return f"{type(exc).__name__}: {lines[0] if lines else ''}{more}"


def _compile(job: CompileJob) -> tuple[bytes, str, RecordedLaunch]:
    import cutlass.cute as cute

    params = dict(job.variant.params)
    entry = prepare_entry(job.kernel, job.init, job.constexpr, job.args, job.geometry, job.static, params)
    compiled = cute.compile(
        entry.callable, *entry.args, **entry.kwargs, options=f"--gpu-arch {job.arch} {job.options}"
    )
    symbols = list(compiled.kernel_info)
    if len(symbols) != 1:
        raise ContractError(f"a registry variant must launch exactly one kernel; this one has {symbols}")
    with compiled.ir_module.context:
        host = read_host_launch(compiled.ir_module, entry.inputs)
    if host.global_name != f"kernels_{symbols[0]}":
        raise ContractError(f"the host function launches {host.global_name}, not the kernel {symbols[0]}")
    recorded = record_launch(host, job.geometry, job.args, params, strict=entry.strict)
    return bytes(compiled.artifacts.CUBIN), symbols[0], recorded


def compile_job(job: CompileJob) -> CompileOutcome:
    """Compile, inspect and check one variant. Never raises."""
    start = time.perf_counter()
    captured = io.StringIO()

    def done(status: Status, stage: str, reason: str, log: str = "", **extra: Any) -> CompileOutcome:
        output = captured.getvalue()
        full_log = _ANSI.sub(
            "", "\n".join(part for part in (log, output and f"--- output ---\n{output}") if part)
        )
        return CompileOutcome(
            job.variant, status, stage, reason, full_log, time.perf_counter() - start, **extra
        )

    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            cubin, symbol, launch = _compile(job)
    except ContractError as exc:
        return done(Status.FAILED, "contract", str(exc), traceback.format_exc())
    except EntryError as exc:
        return done(Status.FAILED, "entry", str(exc), traceback.format_exc())
    except Exception as exc:
        return done(Status.FAILED, "compile", _reason(exc), _ANSI.sub("", traceback.format_exc()))

    try:
        info = inspect_cubin(cubin)
        resources = check_contract(info, symbol, job.arch, launch.params, launch.static, job.args)
    except ContractError as exc:
        return done(Status.FAILED, "contract", str(exc), traceback.format_exc(), cubin=cubin, symbol=symbol)

    histograms = sass_histograms(cubin)
    sass = histograms.get(symbol) if histograms else None
    note = "" if histograms is not None else "SASS histogram unknown: nvdisasm unavailable ([sass] extra)"
    extra = {
        "cubin": cubin,
        "symbol": symbol,
        "launch": launch,
        "resources": resources,
        "ptxas_version": info.ptxas_version,
        "ptxas_flags": info.ptxas_flags,
        "sass": sass,
    }
    over = check_limits(job.limits, resources, sass)
    if over is not None:
        return done(Status.REJECTED, "limits", over, note, **extra)
    undecided = undecided_limits(job.limits, resources, sass)
    if undecided is not None:
        reason = (
            f"limits {undecided} need the SASS histogram, and nvdisasm is unavailable or failed on "
            "this cubin: install nvidia-cuda-nvdisasm (the [sass] extra); the next build retries it"
        )
        return done(Status.TRANSIENT, "limits", reason, note, **extra)
    return done(Status.OK, "compile", "", note, **extra)
