"""Opening registries: read-only audits, files that are not registries, bad URLs, blob dirs."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from b12x_aot.registry import BlobDirError, RegistryNotFound, RegistryStore, RegistryUsageError

from .conftest import FakeRegistry, record, variant

AUDITS = (("ls",), ("builds",), ("failures",))


def digest(path: Path) -> tuple[str, float]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


@pytest.mark.parametrize("content", [b"", b"hello\n"], ids=["empty", "garbage"])
def test_a_file_that_is_not_a_registry_is_reported_and_left_alone(tmp_path: Path, run_cli, content) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(content)
    before = digest(path)
    for args in (*AUDITS, ("show", "abcd"), ("gc", "--dry-run"), ("migrate",)):
        result = run_cli(*args, "-r", path)
        assert result.exit_code == 2, (args, result.output)
        assert "is not a b12x-aot registry" in result.stderr, (args, result.output)
    assert run_cli("diff", path, path).exit_code == 2
    assert digest(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["x.db"]


def test_building_into_a_corrupt_file_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    path.write_text("hello\n")
    with pytest.raises(RegistryNotFound, match="is not a b12x-aot registry") as exc:
        RegistryStore.open(path, create=True)  # what b12x-compile --registry x.db opens
    assert exc.value.exit_code == 2 and path.read_text() == "hello\n"


def test_audits_do_not_write_to_the_registry(tmp_path: Path, run_cli) -> None:
    path = tmp_path / "r.db"
    reg = FakeRegistry(path)
    reg.build([record(variant(2048))])
    reg.store.close()
    with sqlite3.connect(path) as conn:  # as a copied or read-only-mounted file may be
        conn.execute("PRAGMA journal_mode = DELETE")
    before = digest(path)
    key = variant(2048).key
    for args in (*AUDITS, ("show", key[:8])):
        result = run_cli(*args, "-r", path)
        assert result.exit_code == 0, (args, result.output)
    assert run_cli("diff", path, path).exit_code == 0
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.db"]  # no -wal or -shm created
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


@pytest.mark.parametrize("url", ["foo://bar", "mysql+nosuchdriver://u@h/db"])
def test_an_unknown_or_missing_dialect_is_bad_input(run_cli, url: str) -> None:
    result = run_cli("ls", "-r", url)
    assert result.exit_code == 2 and "cannot load the" in result.stderr, result.output


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?uri=true"])
def test_an_in_memory_sqlite_registry_is_refused(url: str) -> None:
    with pytest.raises(RegistryUsageError, match="in-memory SQLite database"):
        RegistryStore.open(url, create=True)


def test_blob_dir_for_an_existing_registry_must_be_its_own(tmp_path: Path, run_cli) -> None:
    inline = FakeRegistry(tmp_path / "inline.db")
    inline.store.close()
    with pytest.raises(BlobDirError, match="keeps its blobs in the database") as exc:
        RegistryStore.open(inline.path, create=True, blob_dir=tmp_path / "blobs")
    assert exc.value.exit_code == 2
    owned = FakeRegistry(tmp_path / "owned.db", blob_dir=tmp_path / "blobs")
    owned.store.close()
    with pytest.raises(BlobDirError, match="not in --blob-dir"):
        RegistryStore.open(owned.path, create=True, blob_dir=tmp_path / "other")
    store = RegistryStore.open(owned.path, create=True, blob_dir=tmp_path / "blobs")
    assert store.blobs.directory == (tmp_path / "blobs").resolve()
    store.close()
