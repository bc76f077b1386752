"""The toolchain names the CUDA build of the CuTe DSL that compiles, as the DSL itself picks it."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from b12x_aot.compiler import Fingerprint, ToolchainError, _toolchain, current_toolchain, ptxas_release
from b12x_aot.compiler._cuda_build import choose_cuda_build, installed_cuda_builds


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


BOTH_BUILDS = pytest.mark.skipif(
    not (_installed("nvidia-cutlass-dsl-libs-cu12") and _installed("nvidia-cutlass-dsl-libs-cu13")),
    reason="needs both CUDA builds of the CuTe DSL (pip install -e . installs cu12 and cu13)",
)


@pytest.mark.parametrize(
    ("installed", "driver", "chosen"),
    [
        ({12, 13}, None, 13),  # no driver: the newest
        ({12, 13}, 12, 12),
        ({12, 13}, 13, 13),
        ({12, 13}, 14, 13),
        ({13}, 13, 13),
        (set(), 12, None),  # a DSL without per-CUDA builds
    ],
)
def test_the_build_is_the_newest_the_driver_supports(
    installed: set[int], driver: int | None, chosen: int | None
) -> None:
    assert choose_cuda_build(installed, driver) == chosen


def test_a_driver_older_than_every_build_is_refused() -> None:
    with pytest.raises(
        ToolchainError, match=r"supports CUDA 12\.x, older than every installed build .*\(cu13\)"
    ):
        choose_cuda_build({13}, 12)


@BOTH_BUILDS
def test_installed_builds_are_found_where_the_dsl_looks() -> None:
    assert installed_cuda_builds() == {12, 13}


@BOTH_BUILDS
def test_toolchain_hash_follows_the_cuda_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def built_with(build: int):
        monkeypatch.setattr(_toolchain, "dsl_cuda_build", lambda: build)
        return current_toolchain()

    cu12, cu13 = built_with(12), built_with(13)
    assert cu12.hash != cu13.hash
    assert built_with(12).hash == cu12.hash and built_with(13).hash == cu13.hash
    names12, names13 = dict(cu12.dsl), dict(cu13.dsl)
    assert "nvidia-cutlass-dsl-libs-cu12" in names12 and "nvidia-cutlass-dsl-libs-cu13" not in names12
    assert "nvidia-cutlass-dsl-libs-cu13" in names13 and "nvidia-cutlass-dsl-libs-cu12" not in names13
    assert names12.keys() - {"nvidia-cutlass-dsl-libs-cu12"} == names13.keys() - {
        "nvidia-cutlass-dsl-libs-cu13"
    }
    # A dask worker that loads the other build is refused by name.
    ours, theirs = Fingerprint.of(cu13, "release 13.4", {}), Fingerprint.of(cu12, "release 12.9", {})
    problems = ours.mismatches(theirs, "w1")
    assert "worker w1: package nvidia-cutlass-dsl-libs-cu12: client has (absent), worker has " in "\n".join(
        problems
    )
    assert "worker w1: ptxas: client has release 13.4, worker has release 12.9" in problems


def _fake_driver(directory: Path, version: int) -> Path:
    """A libcuda.so.1 whose cuDriverGetVersion reports ``version`` and that does nothing else."""
    source = directory / "fake_cuda.c"
    source.write_text(f"int cuDriverGetVersion(int *v) {{ *v = {version}; return 0; }}\n")
    library = directory / "libcuda.so.1"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(library), str(source)], check=True
    )
    return directory


_REPORT = (
    "from b12x_aot.compiler import current_toolchain, ptxas_release\n"
    "t = current_toolchain()\n"
    "print(ptxas_release(t))\n"
    "print(','.join(n for n, _ in t.dsl))\n"
)


@pytest.mark.dsl
@BOTH_BUILDS
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a stand-in driver")
@pytest.mark.parametrize(
    ("driver", "build", "release"), [(12090, "cu12", "release 12."), (13000, "cu13", "release 13.")]
)
def test_the_dsl_loads_the_build_the_toolchain_names(
    tmp_path: Path, driver: int, build: str, release: str
) -> None:
    # ptxas_release imports the DSL and refuses a build other than the toolchain's.
    env = {**os.environ, "LD_LIBRARY_PATH": str(_fake_driver(tmp_path, driver))}
    proc = subprocess.run(
        [sys.executable, "-c", _REPORT], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr
    got_release, names = proc.stdout.strip().splitlines()[-2:]
    assert got_release.startswith(release)
    libs = {n for n in names.split(",") if n.startswith("nvidia-cutlass-dsl-libs-cu")}
    assert libs == {f"nvidia-cutlass-dsl-libs-{build}"}


@pytest.mark.dsl
def test_the_dsl_loads_the_build_the_toolchain_names_here() -> None:
    toolchain = current_toolchain()
    assert ptxas_release(toolchain).startswith("release ")
