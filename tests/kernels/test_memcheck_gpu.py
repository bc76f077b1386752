"""compute-sanitizer memcheck over exact-size launches of every single-GPU family: zero access
errors (``exact_size_launches.py`` says what runs). ``comm.allreduce`` is not in it: memcheck
serialises kernels, and its ranks' spin barriers need them concurrent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.gpu


def test_memcheck_finds_no_access_error(gpu_registry_path) -> None:
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not on PATH")
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    proc = subprocess.run(
        [
            tool,
            "--tool",
            "memcheck",
            "--error-exitcode",
            "9",
            "--leak-check",
            "no",
            "--report-api-errors",
            "no",  # cuda.bindings probes driver symbols; only kernel accesses count here
            sys.executable,
            "-m",
            "tests.kernels.exact_size_launches",
            str(gpu_registry_path),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=1200,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "ERROR SUMMARY: 0 errors" in output, output[-4000:]
    assert "Invalid __global__" not in output, output[-4000:]
    assert "launches on exact-size buffers" in output
