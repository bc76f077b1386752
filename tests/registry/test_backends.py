"""The same registry code on SQLite and on a real PostgreSQL server (CI starts one)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from b12x_aot.loader import Registry, RegistryFormatError
from b12x_aot.registry import SCHEMA_VERSION, RegistryStore, SchemaMismatch, variant_rows

from ..conftest import ROOT, TOPK_SMALL, current_rows, registry_cli, run_compile, write_spec

pytestmark = pytest.mark.dsl

# 2 outputs x 2 topk x 2 CTA sizes x 2 archs = 16 variants.
SPEC = TOPK_SMALL.replace("topk: [2]", "topk: [1, 2]").replace(
    "archs: [sm_90a, sm_100a, sm_120a]", "archs: [sm_90a, sm_120a]"
)


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty registry location on each backend."""
    if request.param == "sqlite":
        yield str(tmp_path / "registry.db")
        return
    server = request.getfixturevalue("postgres_url")
    name = f"b12x_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(server).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_spec(tmp_path_factory.mktemp("backend-specs"), "spec.yaml", SPEC)


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory: pytest.TempPathFactory, spec_file: Path) -> dict[str, str]:
    """An unsharded SQLite build: key -> artifact sha256."""
    db = tmp_path_factory.mktemp("unsharded") / "r.db"
    run_compile(str(spec_file), "--registry", str(db), "-j", "2")
    return current(str(db))


def current(url: str) -> dict[str, str]:
    return {r.key: r.artifact_sha256 for r in current_rows(url)}


def count(url: str, table: str) -> int:
    store = RegistryStore.open(url)
    try:
        with store.read() as conn:
            return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
    finally:
        store.close()


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "b12x_aot.compiler", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_three_shards_concurrently_equal_an_unsharded_build(
    registry_url: str, spec_file: Path, unsharded
) -> None:
    # Create the schema first so the three builders race on variants, not on table creation.
    RegistryStore.open(registry_url, create=True).close()
    procs = [
        spawn(str(spec_file), "--registry", registry_url, "--shard", f"{i}/3", "-j", "1") for i in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err
        assert "locked" not in err.lower()
    assert current(registry_url) == unsharded
    assert count(registry_url, "artifacts") == len(unsharded)
    assert count(registry_url, "variants") == len(unsharded)
    assert count(registry_url, "builds") == 3


def test_two_builders_racing_on_the_same_variants_leave_one_artifact_each(
    registry_url: str, spec_file: Path, unsharded
) -> None:
    procs = [spawn(str(spec_file), "--registry", registry_url, "-j", "1") for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err
    assert current(registry_url) == unsharded
    assert count(registry_url, "artifacts") == len(unsharded)
    assert count(registry_url, "current_variants") == len(unsharded)
    assert count(registry_url, "variants") == len(unsharded)  # the loser recorded nothing twice


def test_audit_commands_and_export_to_a_loader_file(
    registry_url: str, spec_file: Path, tmp_path: Path
) -> None:
    run_compile(str(spec_file), "--registry", registry_url, "--arch", "sm_90a", "-j", "2")

    listed = json.loads(registry_cli("ls", "-r", registry_url, "--json").stdout)
    assert len(listed) == 8
    shown = json.loads(registry_cli("show", "-r", registry_url, listed[0]["key"][:10], "--json").stdout)
    assert shown["variant"]["key"] == listed[0]["key"] and shown["source"]["files"]
    assert json.loads(registry_cli("verify", "-r", registry_url, "--json").stdout)["faults"] == []
    manifest = tmp_path / "m.yaml"
    manifest.write_text("variants:\n  - {family: moe.topk_sum, abi: 1, params: {output: bf16, topk: 2}}\n")
    out = tmp_path / "serving.db"
    registry_cli("export", "-r", registry_url, "--manifest", str(manifest), str(out))
    with Registry.open(out, immutable=True) as reg:
        assert len(reg) == 2
        for entry in reg.entries():
            assert entry.params["output"] == "bf16" and reg._index.read_artifact(entry)


def test_blob_directory_store(registry_url: str, spec_file: Path, tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    run_compile(
        str(spec_file), "--registry", registry_url, "--arch", "sm_120a", "--blob-dir", str(blobs), "-j", "2"
    )
    files = sorted(p for p in blobs.glob("??/*"))
    assert len(files) == 8
    store = RegistryStore.open(registry_url)
    with store.read() as conn:
        assert conn.execute(text("SELECT count(*) FROM artifacts WHERE data IS NULL")).scalar_one() == 8
        rows = variant_rows(conn)
    store.close()
    verify = ("verify", "-r", registry_url, "--json")
    assert registry_cli(*verify, check=False).returncode == 0
    victim = files[0]
    data = bytearray(victim.read_bytes())
    data[100] ^= 1
    victim.write_bytes(bytes(data))
    proc = registry_cli(*verify, check=False)
    assert proc.returncode == 1
    (fault,) = json.loads(proc.stdout)["faults"]
    assert fault["key"] in {r.key for r in rows if r.artifact_sha256 == victim.name}


def test_a_newer_schema_is_refused_clearly(registry_url: str, spec_file: Path) -> None:
    RegistryStore.open(registry_url, create=True).close()
    store = RegistryStore.open(registry_url)
    with store.write() as conn:
        conn.execute(text("UPDATE meta SET value = '99' WHERE key = 'schema_version'"))
    store.close()
    with pytest.raises(
        SchemaMismatch, match=rf"newer than this b12x-aot's {SCHEMA_VERSION}\. Upgrade b12x-aot"
    ):
        RegistryStore.open(registry_url)
    proc = run_compile(str(spec_file), "--registry", registry_url, "--dry-run", check=False)
    assert proc.returncode == 2 and "schema version 99, newer than" in proc.stderr
    migrate = registry_cli("migrate", "-r", registry_url, check=False)
    assert migrate.returncode == 2 and "newer than" in migrate.stderr
    if "://" not in registry_url:
        with pytest.raises(
            RegistryFormatError, match=r"registry schema 99; this loader reads 1, 2, 3\. Upgrade b12x-aot"
        ):
            Registry.open(registry_url)


def test_migrate_is_explicit(registry_url: str) -> None:
    RegistryStore.open(registry_url, create=True).close()
    out = registry_cli("migrate", "-r", registry_url, check=False)
    assert out.returncode == 0 and f"already at schema {SCHEMA_VERSION}" in out.stdout


def test_a_builder_killed_mid_build_leaves_nothing_half_written(
    registry_url: str, spec_file: Path, unsharded
) -> None:
    import os
    import signal
    import time

    RegistryStore.open(registry_url, create=True).close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "b12x_aot.compiler", str(spec_file), "--registry", registry_url, "-j", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None and count(registry_url, "current_variants") < 3:
        time.sleep(0.2)
    assert proc.poll() is None, "the build finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = current(registry_url)
    assert 3 <= len(partial) < len(unsharded)
    assert all(unsharded[k] == sha for k, sha in partial.items())
    # Nothing half-written: every variant row has its kernel row and its artifact bytes.
    store = RegistryStore.open(registry_url)
    with store.read() as conn:
        orphans = conn.execute(
            text(
                "SELECT count(*) FROM variants v LEFT JOIN kernels k ON k.variant_id = v.id "
                "LEFT JOIN artifacts a ON a.sha256 = v.artifact_sha256 WHERE k.variant_id IS NULL OR a.data IS NULL"
            )
        ).scalar_one()
    store.close()
    assert orphans == 0
    run_compile(str(spec_file), "--registry", registry_url, "-j", "2")
    assert current(registry_url) == unsharded


def test_opening_a_sqlite_file_waits_out_a_lock_it_cannot_queue_on(tmp_path: Path, monkeypatch) -> None:
    # Builders that create one file at once can get "database is locked" from SQLite without
    # its busy timeout applying; open() retries those, and still fails on anything else.
    from sqlalchemy.exc import OperationalError

    from b12x_aot.registry import RegistryNotFound
    from b12x_aot.registry._store import RegistryStore as Store

    real, calls = Store._initialise, []

    def locked_twice(self, blob_dir, blob_path):
        calls.append(1)
        if len(calls) <= 2:
            raise OperationalError("BEGIN IMMEDIATE", {}, Exception("database is locked"))
        return real(self, blob_dir, blob_path)

    monkeypatch.setattr(Store, "_initialise", locked_twice)
    store = Store.open(tmp_path / "r.db", create=True)
    assert len(calls) == 3 and store.dialect == "sqlite"
    store.close()

    def broken(self, blob_dir, blob_path):
        raise OperationalError("SELECT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(Store, "_initialise", broken)
    with pytest.raises(RegistryNotFound, match="disk I/O error"):
        Store.open(tmp_path / "r.db", create=True)
