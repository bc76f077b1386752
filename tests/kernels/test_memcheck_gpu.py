"""compute-sanitizer memcheck over exact-size launches of every single-GPU family: zero access
errors (``exact_size_launches.py`` says what runs); racecheck over the copy-warp GEMMs: zero
hazards. ``comm.allreduce`` is not in it: memcheck serialises kernels, and its ranks' spin
barriers need them concurrent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.gpu


def _sanitized(registry, *tool_args: str, launch_args: tuple[str, ...] = ()) -> str:
    """compute-sanitizer ``tool_args`` over ``exact_size_launches`` on ``registry``: its output,
    after checking that it exited 0 and launched something."""
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not on PATH")
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    proc = subprocess.run(
        [
            tool,
            *tool_args,
            "--error-exitcode",
            "9",
            "--report-api-errors",
            "no",  # cuda.bindings probes driver symbols; only kernel accesses count here
            sys.executable,
            "-m",
            "tests.kernels.exact_size_launches",
            str(registry),
            *launch_args,
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
    assert "launches on exact-size buffers" in output, output[-4000:]
    return output


def test_memcheck_finds_no_access_error(gpu_registry_path) -> None:
    output = _sanitized(gpu_registry_path, "--tool", "memcheck", "--leak-check", "no")
    assert "ERROR SUMMARY: 0 errors" in output, output[-4000:]
    assert "Invalid __global__" not in output, output[-4000:]


def test_racecheck_finds_no_hazard_in_the_copy_warp_ring(gpu_registry_path) -> None:
    # A copy warpgroup fills the ring while the compute warpgroups read it, with no CTA barrier
    # between them: only the slots' mbarriers order a slot's reads before its next fill.
    # racecheck sees the threads' own shared-memory accesses (the copies, the weight and scale
    # loads, the epilogue), not the wgmmas' reads of the activations through the async proxy.
    output = _sanitized(gpu_registry_path, "--tool", "racecheck", launch_args=("--copy-warps",))
    if "0 launches on exact-size buffers: no moe.w4a16 variant" in output:
        pytest.skip("no moe.w4a16 variant with copy warps in this registry")
    assert "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" in output, output[-4000:]
