"""Registries written through the store API with made-up artifact bytes: no DSL, no compile.

They exercise everything the audits and maintenance commands do that does not inspect a cubin
(``verify`` does, so it is tested on the built registries in test_audit.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from b12x_aot.contract import VariantId
from b12x_aot.registry import (
    FailureRecord,
    KernelResources,
    Provenance,
    RegistryStore,
    RegistryWriter,
    SourceClosure,
    Toolchain,
    VariantRecord,
)
from b12x_aot.registry.cli import main

TOOLCHAIN = Toolchain(dsl=(("nvidia-cutlass-dsl", "0.0-test"),), options="test")
PROVENANCE = Provenance(
    module="fake.kernel",
    source=SourceClosure((("fake.kernel", "0" * 64),)),
    spec_path="specs/fake.yaml",
    spec_contract={"family": "moe.fake", "abi": 1},
    toolchain=TOOLCHAIN,
)


def variant(hidden: int, *, arch: str = "sm_90a", family: str = "moe.fake") -> VariantId:
    return VariantId.of(family=family, abi=1, arch=arch, params={"hidden": hidden, "dtype": "bf16"})


def record(v: VariantId, *, smem: int = 1024, artifact: bytes | None = None) -> VariantRecord:
    data = artifact if artifact is not None else f"cubin of {v.key}".encode()
    resources = KernelResources(
        symbol="kernel",
        params=(),
        param_bytes=0,
        registers=32,
        frame_bytes=0,
        min_stack_bytes=0,
        max_stack_bytes=0,
        static_smem_bytes=smem,
        const_bytes=0,
        max_threads=128,
        text_sha256=hashlib.sha256(data).hexdigest(),
        code_size=len(data),
    )
    return VariantRecord(
        variant=v,
        provenance=PROVENANCE,
        artifact=data,
        args=(),
        launch={},
        dynamic_smem_bytes=0,
        resources=resources,
        ptxas_version=None,
        ptxas_flags=None,
        sass=None,
    )


def failure(v: VariantId, reason: str = "ptxas died") -> FailureRecord:
    return FailureRecord(v, PROVENANCE, "failed", "compile", reason, log=f"log: {reason}")


class FakeRegistry:
    """A registry file and a writer to add builds to it."""

    def __init__(self, path: Path, blob_dir: Path | None = None) -> None:
        self.path = path
        self.store = RegistryStore.open(path, create=True, blob_dir=blob_dir)
        self.writer = RegistryWriter(self.store)

    def build(self, variants: Sequence[VariantRecord] = (), failures: Sequence[FailureRecord] = ()) -> int:
        build_id = self.writer.begin_build(TOOLCHAIN, "b12x-compile fake", None)
        for rec in variants:
            self.writer.record_variant(build_id, rec)
        for rec in failures:
            self.writer.record_failure(build_id, rec)
        self.writer.finish_build(build_id, "ok", {})
        return build_id


@pytest.fixture
def fake_registry(tmp_path: Path) -> Iterator[FakeRegistry]:
    """An empty registry: add builds with ``.build(...)``."""
    reg = FakeRegistry(tmp_path / "r.db")
    yield reg
    reg.store.close()


@pytest.fixture
def three_variants(fake_registry: FakeRegistry) -> FakeRegistry:
    """Three current variants of moe.fake (hidden 2048, 4096, 7168) from build 1."""
    fake_registry.build([record(variant(h)) for h in (2048, 4096, 7168)])
    return fake_registry


@pytest.fixture
def run_cli() -> Callable[..., Result]:
    """``b12x-registry ARGS`` in this process; exit code and output as a user sees them."""
    runner = CliRunner()

    def run(*args: Any) -> Result:
        return runner.invoke(main, [str(a) for a in args], catch_exceptions=False)

    return run
