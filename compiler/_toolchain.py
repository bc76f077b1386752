"""The toolchain fingerprint: the nvidia-cutlass-dsl* distributions compiles use, and options.

Read from package metadata and :mod:`._cuda_build`, not by importing the DSL. Of the DSL's
per-CUDA builds (nvidia-cutlass-dsl-libs-cu12, -cu13), each with its own ptxas, only the one the
DSL loads here counts: a host whose driver is 12.x compiles with cu12, one with a 13.x driver or
none with cu13, and the two must not share a toolchain hash. The ptxas that assembled a cubin is
also recorded per kernel from the cubin itself when it says (``KernelResources``/``CubinInfo``).

A build whose compiles run on other machines than the one that records them (a dask cluster)
also compares a :class:`Fingerprint` of each worker with the client's: the DSL distributions,
the ptxas release the DSL compiles with (read by importing the DSL in a short-lived process,
never in the caller), and the source of every module the kernels import.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from b12x_aot.registry import SourceClosure, Toolchain

from ._closure import source_closure
from ._cuda_build import dsl_cuda_build
from .errors import ToolchainError

__all__ = [
    "COMPILE_OPTIONS",
    "Fingerprint",
    "current_toolchain",
    "environment_fingerprint",
    "ptxas_release",
    "refuse_workers",
]

# Options every variant is compiled with (besides --gpu-arch, which the arch fixes).
COMPILE_OPTIONS = "--keep-cubin --opt-level 3"

_LIBS = re.compile(r"nvidia-cutlass-dsl-libs-cu(\d+)")

# The DSL embeds ptxas in its compiler library and picks a CUDA build of that library (cu12,
# cu13) when it is imported; cutlass.CUDA_VERSION is the CUDA release of the build it picked,
# which is the release the cubins' ptxas reports. The probe also names that build, to hold
# _cuda_build's reading of the DSL's rule to what the DSL does.
_PTXAS_PROBE = (
    "import re, sys, cutlass\n"
    "lib = sys.modules['cutlass._mlir._mlir_libs._cutlass_ir'].__file__ or ''\n"
    "m = re.search(r'_cutlass_ir[.]cu([0-9]+)[.]', lib)\n"
    "print(f'build cu{m[1]}' if m else 'build none')\n"
    "v = cutlass.CUDA_VERSION\n"
    "print(f'release {v.major}.{v.minor}')\n"
)
_PROBE_TIMEOUT_S = 300


def current_toolchain(options: str = COMPILE_OPTIONS) -> Toolchain:
    """The toolchain of this environment. Raises :class:`ToolchainError` if the DSL is absent."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-cutlass-dsl"):
            found[name] = dist.version
    if "nvidia-cutlass-dsl" not in found:
        raise ToolchainError(
            "nvidia-cutlass-dsl is not installed; install the project (pip install -e .) "
            "to get the CuTe DSL toolchain"
        )
    build = dsl_cuda_build()
    if build is not None:
        libs = f"nvidia-cutlass-dsl-libs-cu{build}"
        if libs not in found:
            raise ToolchainError(
                f"the CuTe DSL would load its cu{build} build here, but {libs} is not installed; "
                "reinstall the project (pip install -e .)"
            )
        found = {name: v for name, v in found.items() if _cuda_build_of(name) in (None, build)}
    return Toolchain(tuple(sorted(found.items())), options)


def _cuda_build_of(distribution: str) -> int | None:
    """The CUDA major of one of the DSL's per-CUDA libs distributions; None for any other."""
    match = _LIBS.fullmatch(distribution)
    return int(match[1]) if match else None


def ptxas_release(toolchain: Toolchain) -> str:
    """The CUDA release of the ptxas the DSL of ``toolchain`` compiles with here, like
    ``release 13.4``, read without compiling: a short-lived process imports the DSL (which picks
    its CUDA flavor as a compile would) and reports ``cutlass.CUDA_VERSION``. Cached per
    process and DSL install. Raises :class:`ToolchainError` if the DSL cannot be imported, or
    loads another CUDA build than ``toolchain`` names."""
    return _ptxas_release(toolchain.dsl)


@functools.cache
def _ptxas_release(dsl: tuple[tuple[str, str], ...]) -> str:
    builds = [f"cu{b}" for name, _ in dsl if (b := _cuda_build_of(name)) is not None]
    expected = builds[0] if builds else "none"
    with tempfile.TemporaryDirectory(prefix="b12x-ptxas-") as scratch:
        # The DSL makes cache directories under TMPDIR at import: keep them in the scratch.
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PTXAS_PROBE],
                capture_output=True,
                text=True,
                cwd=scratch,
                env={**os.environ, "TMPDIR": scratch},
                timeout=_PROBE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ToolchainError(
                f"cannot read the CuTe DSL's ptxas release: importing cutlass took over {_PROBE_TIMEOUT_S} s"
            ) from None
    lines = proc.stdout.strip().splitlines()
    if (
        proc.returncode != 0
        or len(lines) < 2
        or not lines[-2].startswith("build ")
        or not lines[-1].startswith("release ")
    ):
        detail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ToolchainError(
            f"cannot read the CuTe DSL's ptxas release: importing cutlass failed ({detail}); "
            "reinstall the project (pip install -e .)"
        )
    loaded = lines[-2].removeprefix("build ")
    if loaded != expected:
        raise ToolchainError(
            f"the CuTe DSL loaded build {loaded}, but b12x-aot expected {expected} from the "
            "installed builds and the driver; the DSL chooses differently from "
            "b12x_aot.compiler._cuda_build: make that module follow the DSL's "
            "cutlass/_mlir/_mlir_libs/__init__.py"
        )
    return lines[-1]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What every process that compiles a plan's jobs must share with the client recording them.

    ``items`` are ``(what, value)`` pairs, sorted: each nvidia-cutlass-dsl* distribution of the
    toolchain (so the DSL's CUDA build too), the ptxas release, and the sha256 of every module in the source closures of
    ``modules`` (the kernel modules of the jobs). Compile options are not in it: each job
    carries its own.
    """

    modules: tuple[str, ...]
    items: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, toolchain: Toolchain, ptxas: str, closures: Mapping[str, SourceClosure]) -> Fingerprint:
        items = {f"package {name}": version for name, version in toolchain.dsl}
        items["ptxas"] = ptxas
        for closure in closures.values():
            items.update((f"source of {module}", digest) for module, digest in closure.files)
        return cls(tuple(sorted(closures)), tuple(sorted(items.items())))

    def mismatches(self, other: Fingerprint, worker: str) -> list[str]:
        """One line per item where ``other`` (a worker's) differs from this one (the client's)."""
        ours, theirs = dict(self.items), dict(other.items)
        return [
            f"worker {worker}: {what}: client has {ours.get(what, '(absent)')}, "
            f"worker has {theirs.get(what, '(absent)')}"
            for what in sorted(ours.keys() | theirs.keys())
            if ours.get(what) != theirs.get(what)
        ]


def environment_fingerprint(modules: Sequence[str]) -> Fingerprint:
    """This process's fingerprint for the kernel ``modules``: what a worker reports.
    Raises :class:`ToolchainError` or :class:`ClosureError` when part of it cannot be read."""
    toolchain = current_toolchain()
    return Fingerprint.of(toolchain, ptxas_release(toolchain), {m: source_closure(m) for m in modules})


def refuse_workers(problems: Sequence[str]) -> ToolchainError:
    """The error that refuses workers whose toolchain differs (``problems``: one line each)."""
    return ToolchainError(
        "refusing to compile: these workers do not have this client's toolchain and sources, so "
        "their cubins would be recorded under the wrong provenance\n"
        + "\n".join(f"  {p}" for p in problems)
        + "\ninstall the client's environment (the same packages and project checkout) on every "
        "worker, then rerun"
    )
