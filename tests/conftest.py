"""Shared fixtures. GPU tests are skipped at collection time when no CUDA device is present."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"


@functools.cache
def gpu_count() -> int:
    """CUDA devices present. A broken driver raises (see ``device_count``), so the GPU tests
    fail loudly instead of all skipping as if no GPU were there."""
    from b12x_aot.loader._cuda import device_count

    return device_count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    count = gpu_count()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present")
    skip_multi = pytest.mark.skip(reason=f"needs 2 CUDA GPUs; {count} present")
    for item in items:
        if "gpu" in item.keywords and count == 0:
            item.add_marker(skip_gpu)
        elif "multigpu" in item.keywords and count < 2:
            item.add_marker(skip_multi)


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


def _run_tool(
    module: str,
    name: str,
    args: tuple[str, ...],
    *,
    cwd: Path | None,
    check: bool,
    timeout: float,
    env: dict | None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=timeout,
        check=False,
        env=env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{name} {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def run_compile(
    *args: str, cwd: Path | None = None, check: bool = True, timeout: float = 1800, env: dict | None = None
) -> subprocess.CompletedProcess[str]:
    """Run b12x-compile in a subprocess (its workers must be real processes)."""
    return _run_tool(
        "b12x_aot.compiler", "b12x-compile", args, cwd=cwd, check=check, timeout=timeout, env=env
    )


def run_compile_after(prelude: str, *args: str, epilogue: str = "") -> subprocess.CompletedProcess[str]:
    """b12x-compile in a fresh interpreter after ``prelude`` (patches, module stubs; ``sys`` is
    imported); ``epilogue`` runs once it returns, then the process exits with its code."""
    code = (
        f"import sys\n{prelude}"
        "from b12x_aot.compiler import cli\n"
        f"try:\n    cli.main({list(args)!r})\nexcept SystemExit as exit:\n    code = exit.code\nelse:\n    code = 0\n"
        f"{epilogue}sys.exit(code)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def registry_cli(
    *args: str, check: bool = True, timeout: float = 600, env: dict | None = None
) -> subprocess.CompletedProcess[str]:
    """Run b12x-registry in a subprocess, as a user would."""
    return _run_tool(
        "b12x_aot.registry", "b12x-registry", args, cwd=None, check=check, timeout=timeout, env=env
    )


def current_rows(registry: str | Path) -> list:
    """The registry's current variants as the audits read them (``variant_rows``)."""
    from b12x_aot.registry import RegistryStore, variant_rows  # sqlalchemy: not on GPU machines

    store = RegistryStore.open(str(registry))
    try:
        with store.read() as conn:
            return variant_rows(conn)
    finally:
        store.close()


@pytest.fixture
def needs_nvdisasm() -> None:
    """Skip a test that reads SASS histograms when nvdisasm (the [sass] extra) is missing."""
    from b12x_aot.compiler import find_nvdisasm

    if find_nvdisasm() is None:
        pytest.skip("nvdisasm is not installed (the [sass] extra)")


def write_spec(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


TOPK_SMALL = """
family: moe.topk_sum
abi: 1
kernel: b12x_aot.kernels.topk_sum:TopKSum
archs: [sm_90a, sm_100a, sm_120a]
params:
  element: [bf16]
  output: [fp32, bf16]
  topk: [2]
  hidden: [2048]
  cta_threads: [128, 256]
constraints: ["hidden % (cta_threads * 8) == 0"]
args:
  - {name: out,         kind: ptr, dtype: "{output}",  align: 16, intent: out, shape: [num_tokens, hidden]}
  - {name: routed,      kind: ptr, dtype: "{element}", align: 16, shape: [num_tokens, topk, hidden]}
  - {name: weights,     kind: ptr, dtype: fp32,        align: 4,  shape: [num_tokens, topk]}
  - {name: route_ids,   kind: ptr, dtype: i32,         align: 4,  shape: [num_tokens, topk]}
  - {name: num_tokens,  kind: i32}
  - {name: num_experts, kind: i32}
launch:
  grid:  ["num_tokens", "cdiv(hidden, cta_threads * 8)", 1]
  block: ["cta_threads", 1, 1]
  smem: 0
  requires: ["num_tokens >= 0", "num_tokens * topk * hidden < 2147483648"]  # 32-bit element offsets
limits:
  max_spill_bytes: 0
"""


# TOPK_SMALL for sm_90a only, and narrowed further to a single variant.
ONE_ARCH = TOPK_SMALL.replace("archs: [sm_90a, sm_100a, sm_120a]", "archs: [sm_90a]")
ONE_VARIANT = ONE_ARCH.replace("output: [fp32, bf16]", "output: [fp32]").replace(
    "cta_threads: [128, 256]", "cta_threads: [128]"
)


@pytest.fixture(scope="session")
def small_spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("specs")
    write_spec(directory, "topk_small.yaml", TOPK_SMALL)
    return directory


@pytest.fixture(scope="session")
def built_registry(tmp_path_factory: pytest.TempPathFactory, small_spec_dir: Path) -> Path:
    """A registry with 4 real topk_sum variants for each of sm_90a, sm_100a and sm_120a.
    Skips where the CuTe DSL is not installed (a GPU machine that only serves from a registry
    built elsewhere): the tests on it then say why instead of failing at setup."""
    if not _dsl_available():
        pytest.skip("building the test registry needs nvidia-cutlass-dsl (pip install -e .)")
    db = tmp_path_factory.mktemp("registry") / "kernels.db"
    run_compile(str(small_spec_dir), "--registry", str(db), "-j", "2")
    return db


@pytest.fixture
def registry_copy(tmp_path: Path, built_registry: Path) -> Path:
    """A private copy of the session registry that a test may change."""
    target = tmp_path / "kernels.db"
    shutil.copy(built_registry, target)
    return target


@pytest.fixture
def env_without(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    def remove(*names: str) -> None:
        for name in names:
            monkeypatch.delenv(name, raising=False)

    return remove


@pytest.fixture
def postgres_url() -> Iterator[str]:
    url = os.environ.get("B12X_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("B12X_TEST_POSTGRES_URL is not set (CI starts a server and sets it)")
    yield url


# --- GPU fixtures ------------------------------------------------------------------------
# B12X_TEST_REGISTRY: a registry compiled elsewhere (the GPU machine has no compiler); else
# one is built here for the device's arch, which needs the CuTe DSL installed.
TEST_REGISTRY_ENV = "B12X_TEST_REGISTRY"


def _dsl_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("cutlass") is not None


@pytest.fixture(scope="session")
def device_arch() -> str:
    from b12x_aot.loader._cuda import device_arch as arch_of_device

    return arch_of_device(0)


@pytest.fixture(scope="session")
def gpu_registry_path(tmp_path_factory: pytest.TempPathFactory, device_arch: str) -> Path:
    given = os.environ.get(TEST_REGISTRY_ENV)
    if given:
        return Path(given)
    if not _dsl_available():
        pytest.skip(f"set {TEST_REGISTRY_ENV} to a compiled registry (no CuTe DSL here to build one)")
    db = tmp_path_factory.mktemp("gpu-registry") / "kernels.db"
    run_compile(str(SPECS), "--registry", str(db), "--arch", device_arch)
    return db


@pytest.fixture(scope="session")
def gpu_registry(gpu_registry_path: Path):
    import torch  # GPU tests compare against torch references

    from b12x_aot.loader import Registry

    torch.cuda.init()
    registry = Registry.open(gpu_registry_path)
    yield registry
    torch.cuda.synchronize()
    registry.close()


def family_variants(registry, family: str, arch: str) -> list:
    """Every variant of ``family`` for ``arch`` in the registry, sorted by params."""
    entries = [e for e in registry.entries() if e.family == family and e.arch == arch]
    if not entries:
        pytest.skip(f"the registry has no {family} variants for {arch}")
    return sorted(entries, key=lambda e: sorted(e.params.items()))


def checked_cubin(index: Any, entry: Any) -> Any:
    """``entry``'s stored cubin, inspected (``CubinInfo``), after the build's own launch-contract
    check runs again on it (SM, parameter table, alignment, threads, shared memory)."""
    from b12x_aot.compiler import check_contract, inspect_cubin

    info = inspect_cubin(index.read_artifact(entry))
    check_contract(info, entry.symbol, entry.arch, entry.kernel_params, entry.static, entry.args)
    return info


def build_spec_subset(
    tmp_path_factory: Any, spec_file: str, params: dict, constraints: tuple[str, ...] = (), **fields: Any
) -> tuple[Path, dict]:
    """Build ``specs/spec_file`` with ``params`` instead of its own, ``constraints`` added and
    other top-level ``fields`` replaced, into a fresh registry; its path and the build's summary."""
    import json

    import yaml

    spec = yaml.safe_load((SPECS / spec_file).read_text())
    spec.update(params=params, constraints=[*spec.get("constraints", []), *constraints], **fields)
    directory = tmp_path_factory.mktemp(Path(spec_file).stem)
    (directory / spec_file).write_text(yaml.safe_dump(spec, sort_keys=False))
    db = directory / "kernels.db"
    proc = run_compile(str(directory), "--registry", str(db), "-j", "2", "--json")
    return db, json.loads(proc.stdout)
