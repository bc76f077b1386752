"""Fixtures of the example-kernel tests: the examples registry and the examples package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ..conftest import ROOT, _dsl_available, run_compile
from ..loader.conftest import cluster_driver, driver, encoder  # noqa: F401 (recording drivers, for packing tests)

EXAMPLES = ROOT / "examples"
EXAMPLES_REGISTRY_ENV = "B12X_TEST_EXAMPLES_REGISTRY"


def examples_env() -> dict[str, str]:
    """The environment a build of the example specs needs: their package on the path."""
    path = os.pathsep.join(p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


@pytest.fixture(scope="session", autouse=True)
def examples_on_path() -> None:
    """The example kernels import as ``dsl_examples`` (the JIT comparisons build them here)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))


@pytest.fixture(scope="session")
def examples_registry_path(tmp_path_factory: pytest.TempPathFactory, device_arch: str) -> Path:
    """A registry of the example specs: B12X_TEST_EXAMPLES_REGISTRY, else one built here for
    the device's arch (which needs the CuTe DSL)."""
    given = os.environ.get(EXAMPLES_REGISTRY_ENV)
    if given:
        return Path(given)
    if not _dsl_available():
        pytest.skip(f"set {EXAMPLES_REGISTRY_ENV} to a compiled registry (no CuTe DSL here to build one)")
    db = tmp_path_factory.mktemp("examples") / "examples.db"
    run_compile(str(EXAMPLES / "specs"), "--registry", str(db), "--arch", device_arch, env=examples_env())
    return db


@pytest.fixture(scope="session")
def examples_registry(examples_registry_path: Path):
    import torch

    from b12x_aot.loader import Registry

    torch.cuda.init()
    registry = Registry.open(examples_registry_path)
    yield registry
    torch.cuda.synchronize()
    registry.close()
