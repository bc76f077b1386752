"""Audits and dry runs on a read-only mount: a read-only bind mount (made in a private user and
mount namespace, so it needs no privilege and holds under root, where chmod does not stop a
write) of a WAL registry, on which SQLite can neither create nor lock its ``-shm`` file."""

from __future__ import annotations

import functools
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import ONE_VARIANT, ROOT, write_spec
from .conftest import FakeRegistry, record, variant


@functools.cache
def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


def on_read_only_mount(directory: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with ``directory`` bind-mounted read-only over itself."""
    if not _can_mount():
        pytest.skip("needs unshare with user and mount namespaces to make a read-only mount")
    script = 'mount --bind -o ro "$0" "$0" && touch "$0/probe" 2>/dev/null && exit 99; exec "$@"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, str(directory), *command],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode != 99, "the bind mount was writable"
    return proc


def registry_cli(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return on_read_only_mount(directory, sys.executable, "-m", "b12x_aot.registry", *args)


@pytest.fixture
def mounted(tmp_path: Path) -> Path:
    """A WAL registry (with a blob directory, a failure and two builds) in its own directory."""
    directory = tmp_path / "ro"
    reg = FakeRegistry(directory / "r.db", blob_dir=directory / "blobs")
    reg.build([record(variant(h)) for h in (2048, 4096)])
    reg.build([record(variant(7168))])
    reg.store.close()
    with sqlite3.connect(reg.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    return directory


@pytest.mark.parametrize(
    "args",
    [
        ("ls",),
        ("builds",),
        ("failures",),
        ("stale",),
        ("gc", "--dry-run", "--prune-history"),
        ("migrate", "--dry-run"),
    ],
)
def test_audits_read_a_registry_on_a_read_only_mount(mounted: Path, args: tuple[str, ...]) -> None:
    db = mounted / "r.db"
    before = db.read_bytes()
    proc = registry_cli(mounted, *args, "-r", str(db))
    assert proc.returncode == 0, proc.stderr
    assert "unable to open database file" not in proc.stderr
    assert db.read_bytes() == before


def test_verify_and_diff_read_a_read_only_mount(mounted: Path) -> None:
    db = str(mounted / "r.db")
    proc = registry_cli(mounted, "verify", "-r", db, "--json")
    assert proc.returncode == 1 and "readable cubin" in proc.stdout  # made-up cubins: faults found
    assert registry_cli(mounted, "diff", "1", "2", "-r", db).returncode == 0


def test_the_build_dry_run_plans_from_a_read_only_mount(mounted: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "one.yaml", ONE_VARIANT)
    proc = on_read_only_mount(
        mounted,
        sys.executable,
        "-m",
        "b12x_aot.compiler",
        str(spec),
        "--registry",
        str(mounted / "r.db"),
        "--dry-run",
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 to compile" in proc.stdout + proc.stderr


def test_a_log_a_read_only_mount_cannot_replay_is_refused_with_the_fix(mounted: Path, tmp_path: Path) -> None:
    db = mounted / "r.db"
    writer = sqlite3.connect(db)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("UPDATE builds SET command = 'edited'")
        writer.commit()
        shutil.copy(db, tmp_path / "copy.db")
        shutil.copy(f"{db}-wal", tmp_path / "copy.db-wal")
    finally:
        writer.close()
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    for name in ("copy.db", "copy.db-wal"):
        (tmp_path / name).rename(frozen / name)
    proc = registry_cli(frozen, "builds", "-r", str(frozen / "copy.db"))
    assert proc.returncode == 2
    assert "copy.db-wal beside it holds transactions not yet in the file" in proc.stderr
    assert "wal_checkpoint" in proc.stderr and "Traceback" not in proc.stderr
