"""A blob directory knows every registry that uses it: a copied registry file gets its own id,
and gc keeps every blob any registered registry references."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import time
from pathlib import Path

from b12x_aot.registry import RegistryStore

from .conftest import FakeRegistry, record, variant

OLD = time.time() - 3600  # past gc's grace period for young orphan blob files


def registry_id(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT value FROM meta WHERE key = 'registry_id'").fetchone()[0]


def blob_names(blobs: Path) -> set[str]:
    return {p.name for p in blobs.glob("??/*")}


def age_all(blobs: Path) -> None:
    for path in blobs.glob("??/*"):
        os.utime(path, (OLD, OLD))


def test_gc_of_a_copy_keeps_the_blobs_the_original_gained(tmp_path: Path, run_cli) -> None:
    blobs = tmp_path / "blobs"
    a = FakeRegistry(tmp_path / "A.db", blob_dir=blobs)
    a.build([record(variant(2048))])
    a.store.close()
    shutil.copy(a.path, tmp_path / "B.db")  # same blob dir, same registry id
    a = FakeRegistry(a.path)  # opening A for writing: A is still where its id was registered
    a.build([record(variant(4096))])
    a.store.close()
    age_all(blobs)
    gc = run_cli("gc", "-r", tmp_path / "B.db", "--json")
    assert gc.exit_code == 0, gc.output
    assert json.loads(gc.stdout)["blob_files"] == 0
    assert len(blob_names(blobs)) == 2
    assert run_cli("gc", "-r", a.path, "--json").exit_code == 0
    store = RegistryStore.open(a.path, read_only=True)
    try:
        with store.read() as conn:
            assert all(store.blobs.read(conn, sha) for sha in blob_names(blobs))
    finally:
        store.close()


def test_a_copy_gets_an_identity_of_its_own_and_both_are_registered(tmp_path: Path, run_cli) -> None:
    blobs = tmp_path / "blobs"
    a = FakeRegistry(tmp_path / "A.db", blob_dir=blobs)
    a.build([record(variant(2048))])
    a.store.close()
    b_path = tmp_path / "B.db"
    shutil.copy(a.path, b_path)
    b = FakeRegistry(b_path)  # the copy's first writing open
    b.build([record(variant(7168))])  # a blob only B references
    b.store.close()
    assert registry_id(b_path) != registry_id(a.path)
    registered = {p.name: p.read_text().strip() for p in (blobs / ".b12x-registries").iterdir()}
    assert registered == {
        registry_id(a.path): f"sqlite:///{a.path}",
        registry_id(b_path): f"sqlite:///{b_path}",
    }
    age_all(blobs)
    report = json.loads(run_cli("gc", "-r", a.path, "--prune-history", "--json").stdout)
    assert report["blob_files"] == 0 and len(blob_names(blobs)) == 2  # B's blob stays


def test_a_moved_registry_keeps_its_identity(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    a = FakeRegistry(tmp_path / "A.db", blob_dir=blobs)
    a.build([record(variant(2048))])
    a.store.close()
    before = registry_id(a.path)
    moved = tmp_path / "moved.db"
    a.path.rename(moved)
    RegistryStore.open(moved, blob_dir=None, create=True).close()
    assert registry_id(moved) == before
    assert (blobs / ".b12x-registries" / before).read_text().strip() == f"sqlite:///{moved}"


def test_gc_prunes_nothing_while_a_registered_registry_is_gone(tmp_path: Path, run_cli) -> None:
    blobs = tmp_path / "blobs"
    a = FakeRegistry(tmp_path / "A.db", blob_dir=blobs)
    a.build([record(variant(2048))])
    a.store.close()
    b_path = tmp_path / "B.db"
    shutil.copy(a.path, b_path)
    b = FakeRegistry(b_path)
    b.build([record(variant(7168))])
    b.store.close()
    b_path.rename(tmp_path / "B-moved.db")  # moved without being opened since: unknown to the dir
    age_all(blobs)
    result = run_cli("gc", "-r", a.path)
    assert result.exit_code == 0
    entry = blobs / ".b12x-registries" / registry_id(tmp_path / "B-moved.db")
    assert f"is not there. If it was deleted, delete {entry}" in result.stderr
    assert "b12x-registry migrate -r NEW_PATH" in result.stderr
    assert len(blob_names(blobs)) == 2


def test_blob_files_take_the_database_files_permissions(tmp_path: Path) -> None:
    old = os.umask(0o077)  # a umask that would make every new file private
    try:
        blobs = tmp_path / "blobs"
        reg = FakeRegistry(tmp_path / "r.db", blob_dir=blobs)
        reg.store.close()
        reg.path.chmod(0o644)
        reg = FakeRegistry(reg.path)
        reg.build([record(variant(2048))])
        reg.store.close()
    finally:
        os.umask(old)
    (blob,) = blobs.glob("??/*")
    assert stat.S_IMODE(blob.stat().st_mode) == 0o644
