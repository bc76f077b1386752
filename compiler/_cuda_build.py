"""The CUDA build (cu12, cu13) of the CuTe DSL's compiler library that importing the DSL here loads.

nvidia-cutlass-dsl ships its compiler library, ptxas included, once per CUDA major release: the
nvidia-cutlass-dsl-libs-cu<N> distributions, each a ``_cutlass_ir.cu<N>.*.so`` beside
``cutlass/_mlir/_mlir_libs/__init__.py``. That module picks one when the DSL is imported
(``_select_and_load_cutlass_ir_toolkit``): the newest installed build whose major the driver's
``cuDriverGetVersion`` major reaches, or the newest installed one when no driver answers. The
builds' ptxas releases differ (12.9 and 13.x), and so do their cubins. :func:`dsl_cuda_build`
applies the same rule without importing the DSL, so planning stays free of it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
from collections.abc import Collection
from pathlib import Path

from .errors import ToolchainError

__all__ = ["choose_cuda_build", "driver_cuda_major", "dsl_cuda_build", "installed_cuda_builds"]

_BUILD_FILE = re.compile(r"^_cutlass_ir\.cu(\d+)\..*\.so$")  # the DSL's own pattern, Linux only


def installed_cuda_builds() -> frozenset[int]:
    """The CUDA majors of the DSL's installed compiler-library builds, found where the DSL looks.
    Raises :class:`ToolchainError` if the ``cutlass`` package cannot be found."""
    spec = importlib.util.find_spec("cutlass")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError(
            "the CuTe DSL's cutlass package is not importable; reinstall the project (pip install -e .)"
        )
    builds: set[int] = set()
    for location in spec.submodule_search_locations:
        libs = Path(location) / "_mlir" / "_mlir_libs"
        if libs.is_dir():
            builds.update(int(m[1]) for entry in libs.iterdir() if (m := _BUILD_FILE.match(entry.name)))
    return frozenset(builds)


def driver_cuda_major() -> int | None:
    """The CUDA major the driver supports (``cuDriverGetVersion`` // 1000), or None when no driver
    answers. Loads libcuda without initializing it, as the DSL's import does."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return version.value // 1000


def choose_cuda_build(installed: Collection[int], driver_major: int | None) -> int | None:
    """The build the DSL loads: the newest the driver supports, or the newest when there is no
    driver. None for a DSL installed without per-CUDA builds. Raises :class:`ToolchainError`
    when the driver supports none of them (importing the DSL fails the same way)."""
    if not installed:
        return None
    if driver_major is None:
        return max(installed)
    usable = [build for build in installed if build <= driver_major]
    if not usable:
        names = ", ".join(f"cu{b}" for b in sorted(installed))
        raise ToolchainError(
            f"the CUDA driver supports CUDA {driver_major}.x, older than every installed build of the "
            f"CuTe DSL ({names}): update the driver, or install the DSL's build for CUDA {driver_major}"
        )
    return max(usable)


def dsl_cuda_build() -> int | None:
    """The CUDA major of the build the DSL loads in this environment (see the module docstring)."""
    return choose_cuda_build(installed_cuda_builds(), driver_cuda_major())
