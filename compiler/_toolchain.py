"""The toolchain fingerprint: every installed nvidia-cutlass-dsl* distribution, and options.

Read from package metadata, not by importing the DSL. The ptxas that assembled a cubin is
recorded per kernel from the cubin itself (``KernelResources``/``CubinInfo``).

A build whose compiles run on other machines than the one that records them (a dask cluster)
also compares a :class:`Fingerprint` of each worker with the client's: the DSL distributions,
the ptxas release the DSL compiles with (read by importing the DSL in a short-lived process,
never in the caller), and the source of every module the kernels import.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from b12x_aot.registry import SourceClosure, Toolchain

from ._closure import source_closure
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

# The DSL embeds ptxas in its compiler library and picks a CUDA flavor of that library (cu12,
# cu13) when it is imported, from the installed flavors and the driver; cutlass.CUDA_VERSION is
# the CUDA release of the library it picked, which is the release the cubins' ptxas reports.
_PTXAS_PROBE = "import cutlass\nv = cutlass.CUDA_VERSION\nprint(f'release {v.major}.{v.minor}')\n"
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
    return Toolchain(tuple(sorted(found.items())), options)


def ptxas_release(toolchain: Toolchain) -> str:
    """The CUDA release of the ptxas the DSL of ``toolchain`` compiles with here, like
    ``release 13.4``, read without compiling: a short-lived process imports the DSL (which picks
    its CUDA flavor as a compile would) and reports ``cutlass.CUDA_VERSION``. Cached per
    process and DSL install. Raises :class:`ToolchainError` if the DSL cannot be imported."""
    return _ptxas_release(toolchain.dsl)


@functools.cache
def _ptxas_release(dsl: tuple[tuple[str, str], ...]) -> str:
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
    if proc.returncode != 0 or not lines or not lines[-1].startswith("release "):
        detail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ToolchainError(
            f"cannot read the CuTe DSL's ptxas release: importing cutlass failed ({detail}); "
            "reinstall the project (pip install -e .)"
        )
    return lines[-1]


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What every process that compiles a plan's jobs must share with the client recording them.

    ``items`` are ``(what, value)`` pairs, sorted: each installed nvidia-cutlass-dsl*
    distribution, the ptxas release, and the sha256 of every module in the source closures of
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
