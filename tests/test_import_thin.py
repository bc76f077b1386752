"""Importing a serving-side package pulls in neither the build side nor torch, and touches no
driver: the loader and the comm runtime start cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("sqlalchemy", "cutlass", "torch", "yaml", "pydantic", "rich", "click", "elftools")
BUILD_SIDE = ("b12x_aot.compiler", "b12x_aot.registry", "b12x_aot.kernels")


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.parametrize("modules", ["b12x_aot.loader", "b12x_aot.comm, b12x_aot.comm.launch"])
def test_import_is_thin(modules: str) -> None:
    watched = (*HEAVY, *BUILD_SIDE)
    assert _run(f"import sys, {modules}; print(' '.join(m for m in {watched!r} if m in sys.modules))") == ""


@pytest.mark.parametrize("package", ["b12x_aot.loader", "b12x_aot.comm"])
def test_import_does_no_driver_work(package: str) -> None:
    assert _run(f"import b12x_aot.loader._cuda as c, {package}; print(c._initialized)") == "False"
