"""gc, export and migrate on registries written with made-up artifact bytes (no DSL needed)."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from b12x_aot.loader import Registry
from b12x_aot.registry import SCHEMA_VERSION, BlobDirError, RegistryStore

from .conftest import FakeRegistry, record, variant

OLD = time.time() - 3600  # past gc's grace period for young orphan blob files


def keys(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {k for (k,) in conn.execute("SELECT key FROM current_variants")}


def test_gc_refuses_a_keep_manifest_entry_that_matches_nothing(
    three_variants: FakeRegistry, run_cli, tmp_path
):
    before = keys(three_variants.path)
    typo = tmp_path / "keep.yaml"
    typo.write_text("variants:\n  - {family: moe.fake, abi: 1, params: {hiden: 7168}}\n")
    for extra in (["--dry-run"], []):
        result = run_cli("gc", "-r", three_variants.path, "--keep", typo, *extra)
        assert result.exit_code == 1, result.output
        assert "1 manifest requirement(s) matched nothing; nothing was deleted" in result.stderr
        assert "hiden" in result.stderr
    assert keys(three_variants.path) == before
    # export refuses the same manifest with the same check
    out = tmp_path / "out.db"
    result = run_cli("export", "-r", three_variants.path, "--manifest", typo, out)
    assert result.exit_code == 1 and "matched nothing; nothing was written" in result.stderr
    # a keep manifest that does match still drops the rest
    keep = tmp_path / "keep2.yaml"
    keep.write_text("variants:\n  - {family: moe.fake, abi: 1, params: {hidden: 7168}}\n")
    report = json.loads(run_cli("gc", "-r", three_variants.path, "--keep", keep, "--json").stdout)
    assert len(report["uncurrent"]) == 2
    assert keys(three_variants.path) == {variant(7168).key}


def blob_registry(tmp_path: Path, name: str, blobs: Path, hidden: tuple[int, ...]) -> FakeRegistry:
    reg = FakeRegistry(tmp_path / name, blob_dir=blobs)
    reg.build([record(variant(h)) for h in hidden])
    return reg


def age(path: Path) -> None:
    os.utime(path, (OLD, OLD))


def test_gc_prunes_only_sha256_named_orphans_of_its_own_blob_dir(tmp_path: Path, run_cli) -> None:
    blobs = tmp_path / "proj"
    reg = blob_registry(tmp_path, "r.db", blobs, (2048,))
    notes = blobs / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    misplaced = blobs / "ab" / ("cd" + "0" * 62)  # a sha256 name in the wrong directory
    misplaced.parent.mkdir()
    misplaced.write_text("not ours")
    orphan_sha = "ef" + "1" * 62
    orphan = blobs / "ef" / orphan_sha
    orphan.parent.mkdir()
    orphan.write_text("an orphan")
    for path in (notes / "todo.txt", misplaced, orphan):
        age(path)
    report = json.loads(run_cli("gc", "-r", reg.path, "--json").stdout)
    assert report["blob_files"] == 1 and report["blob_files_kept"] is None
    assert not orphan.exists()
    assert (notes / "todo.txt").read_text() == "keep me" and misplaced.exists()
    with sqlite3.connect(reg.path) as conn:
        (sha,) = conn.execute("SELECT artifact_sha256 FROM variants").fetchone()
    assert (blobs / sha[:2] / sha).exists()


def test_a_second_registry_cannot_take_a_blob_dir_another_owns(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    first = blob_registry(tmp_path, "a.db", blobs, (2048,))
    with pytest.raises(BlobDirError, match="belongs to another registry"):
        RegistryStore.open(tmp_path / "b.db", create=True, blob_dir=blobs)
    # reopening the owner with its own directory is fine
    RegistryStore.open(first.path, create=True, blob_dir=blobs).close()
    # a directory that already holds files but no marker may be anyone's
    legacy = tmp_path / "legacy"
    (legacy / "ab").mkdir(parents=True)
    with pytest.raises(BlobDirError, match=r"no \.b12x-registry marker"):
        RegistryStore.open(tmp_path / "c.db", create=True, blob_dir=legacy)


def test_gc_leaves_a_blob_dir_it_does_not_own_alone(tmp_path: Path, run_cli) -> None:
    blobs = tmp_path / "blobs"
    reg = blob_registry(tmp_path, "a.db", blobs, (2048,))
    (blobs / ".b12x-registry").write_text("someone-else\n/elsewhere.db\n")
    orphan = blobs / "ef" / ("ef" + "1" * 62)
    orphan.parent.mkdir()
    orphan.write_text("another registry's blob")
    age(orphan)
    result = run_cli("gc", "-r", reg.path)
    assert result.exit_code == 0, result.output
    assert "orphan blob files were not pruned" in result.stderr
    assert orphan.exists()


def test_export_is_a_standalone_rollback_journal_file(
    three_variants: FakeRegistry, run_cli, tmp_path
) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text("variants:\n  - {family: moe.fake, abi: 1, params: {hidden: [2048, 4096]}}\n")
    out = tmp_path / "serving" / "out.db"
    result = run_cli("export", "-r", three_variants.path, "--manifest", manifest, out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.db"]  # no temp, -wal or -shm left
    with sqlite3.connect(out) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    with Registry.open(out) as reg:  # the loader's mode=ro
        assert len(reg) == 2


def test_a_failed_export_leaves_nothing_behind(three_variants: FakeRegistry, run_cli, tmp_path) -> None:
    with sqlite3.connect(three_variants.path) as conn:
        conn.execute("UPDATE artifacts SET data = x'00' WHERE sha256 = (SELECT min(sha256) FROM artifacts)")
    manifest = tmp_path / "m.yaml"
    manifest.write_text("variants:\n  - {family: moe.fake, abi: 1}\n")
    out = tmp_path / "out" / "x.db"
    result = run_cli("export", "-r", three_variants.path, "--manifest", manifest, out)
    assert result.exit_code == 1 and "bytes hash to" in result.stderr
    assert list(out.parent.iterdir()) == []


def test_export_to_a_path_that_cannot_be_created_is_bad_input(three_variants, run_cli, tmp_path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text("variants:\n  - {family: moe.fake, abi: 1}\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("export", "-r", three_variants.path, "--manifest", manifest, blocker / "sub" / "x.db")
    assert result.exit_code == 2 and "cannot create" in result.stderr


def set_schema(path: Path, value: str | None) -> None:
    store = RegistryStore.open(path, check_schema=False)
    with store.write() as conn:
        if value is None:
            conn.execute(text("DELETE FROM meta WHERE key = 'schema_version'"))
        else:
            conn.execute(text("UPDATE meta SET value = :v WHERE key = 'schema_version'"), {"v": value})
    store.close()


def test_a_registry_older_than_every_migration_is_told_to_rebuild(
    fake_registry: FakeRegistry, run_cli
) -> None:
    set_schema(fake_registry.path, "0")
    ls = run_cli("ls", "-r", fake_registry.path)
    assert ls.exit_code == 2 and "b12x-registry migrate" not in ls.stderr and "Rebuild it" in ls.stderr
    migrate = run_cli("migrate", "-r", fake_registry.path)
    assert migrate.exit_code == 2
    assert "has no migration from 0" in migrate.stderr and "b12x-registry migrate" not in migrate.stderr


@pytest.mark.parametrize(("value", "problem"), [(None, "no schema_version"), ("one", "is not an integer")])
def test_a_garbled_schema_version_is_not_a_registry(fake_registry, run_cli, value, problem) -> None:
    set_schema(fake_registry.path, value)
    for command in ("migrate", "ls"):
        result = run_cli(command, "-r", fake_registry.path)
        assert result.exit_code == 2 and problem in result.stderr, result.output


def test_migrate_speaks_json(fake_registry: FakeRegistry, run_cli) -> None:
    result = run_cli("migrate", "-r", fake_registry.path, "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "registry": f"sqlite:///{fake_registry.path}",
        "from": SCHEMA_VERSION,
        "to": SCHEMA_VERSION,
        "migrated": False,
    }


def test_gc_dry_run_opens_the_registry_read_only(three_variants: FakeRegistry, run_cli) -> None:
    # A report writes nothing: the file keeps its bytes and its rollback journal (a writing open
    # would switch it to WAL), so a dry run works on read-only files and mounts too.
    three_variants.store.close()
    path = three_variants.path
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    before = path.read_bytes()
    result = run_cli("gc", "-r", path, "--dry-run", "--prune-history", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["dry_run"] is True
    assert path.read_bytes() == before and not Path(f"{path}-wal").exists()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_gc_dry_run_counts_the_blob_files_of_the_artifacts_it_would_delete(tmp_path: Path, run_cli) -> None:
    # History's artifact goes with --prune-history, and its blob file with it: the dry run
    # counts that file as the real run then deletes it (it counted it as kept).
    blobs = tmp_path / "blobs"
    reg = blob_registry(tmp_path, "r.db", blobs, (2048,))
    reg.build([record(variant(2048), artifact=b"rebuilt")])
    for path in blobs.glob("??/*"):
        age(path)

    def gc(*extra: str) -> dict:
        return json.loads(run_cli("gc", "-r", reg.path, "--prune-history", "--json", *extra).stdout)

    dry = gc("--dry-run")
    assert (dry["variants"], dry["artifacts"], dry["blob_files"]) == (1, 1, 1)
    assert len(list(blobs.glob("??/*"))) == 2
    done = gc()
    assert (done["variants"], done["artifacts"], done["blob_files"]) == (1, 1, 1)
    assert len(list(blobs.glob("??/*"))) == 1


def test_migrate_dry_run_says_what_would_change_and_writes_nothing(
    fake_registry: FakeRegistry, run_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A registry one schema behind, with a step to the current one: the dry run names the step
    # and leaves the file as it was, even read-only; the real run then takes it.
    NEXT = SCHEMA_VERSION + 1
    from b12x_aot.registry import _maintain, _migrations

    steps: list[int] = []
    monkeypatch.setattr(_maintain, "SCHEMA_VERSION", NEXT)
    monkeypatch.setattr(_migrations, "SCHEMA_VERSION", NEXT)
    monkeypatch.setitem(_migrations.MIGRATIONS, SCHEMA_VERSION, lambda conn: steps.append(SCHEMA_VERSION))
    fake_registry.store.close()
    path = fake_registry.path
    before = path.read_bytes()
    path.chmod(0o444)
    try:
        dry = run_cli("migrate", "-r", path, "--dry-run")
        assert dry.exit_code == 0, dry.output
        assert f"schema {SCHEMA_VERSION} -> {NEXT} (dry run: nothing written)" in dry.stdout
        as_json = run_cli("migrate", "-r", path, "--dry-run", "--json")
        assert json.loads(as_json.stdout) == {
            "registry": f"sqlite:///{path}",
            "from": SCHEMA_VERSION,
            "to": NEXT,
            "migrated": False,
            "dry_run": True,
            "would_migrate": True,
        }
        assert path.read_bytes() == before and not steps
    finally:
        path.chmod(0o644)
    real = run_cli("migrate", "-r", path)
    assert (
        real.exit_code == 0
        and f"schema {SCHEMA_VERSION} -> {NEXT}" in real.stdout
        and steps == [SCHEMA_VERSION]
    )
    again = run_cli("migrate", "-r", path, "--dry-run")
    assert again.exit_code == 0 and f"already at schema {NEXT}" in again.stdout


def test_migrate_dry_run_refuses_what_migrate_refuses(fake_registry: FakeRegistry, run_cli) -> None:
    set_schema(fake_registry.path, "0")
    dry = run_cli("migrate", "-r", fake_registry.path, "--dry-run")
    assert dry.exit_code == 2 and "has no migration from 0" in dry.stderr
