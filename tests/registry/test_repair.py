"""The next build repairs a damaged variant: a corrupt cubin (blob file or inline bytes) or a
lost kernels row plans as stale, is compiled again, rewritten, and verify passes after."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from b12x_aot.loader import Registry

from ..conftest import ONE_VARIANT, registry_cli, run_compile, write_spec

pytestmark = pytest.mark.dsl


@pytest.fixture(scope="module")
def one_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _dsl():
        pytest.skip("building needs nvidia-cutlass-dsl (pip install -e .)")
    return write_spec(tmp_path_factory.mktemp("spec"), "one.yaml", ONE_VARIANT)


def _dsl() -> bool:
    import importlib.util

    return importlib.util.find_spec("cutlass") is not None


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, one_spec: Path) -> Callable[[Path, bool], Path]:
    """Copy of a one-variant registry (inline blobs, or with its blob directory beside it)."""
    made: dict[bool, Path] = {}

    def copy(dest: Path, blob_dir: bool) -> Path:
        if blob_dir not in made:
            root = tmp_path_factory.mktemp("blobs" if blob_dir else "inline")
            extra = ["--blob-dir", str(root / "blobs")] if blob_dir else []
            run_compile(str(one_spec), "--registry", str(root / "r.db"), "-j", "1", *extra)
            made[blob_dir] = root
        shutil.copytree(made[blob_dir], dest)
        return dest / "r.db"

    return copy


def verify(db: Path) -> tuple[int, list[dict]]:
    proc = registry_cli("verify", "-r", str(db), "--json", check=False)
    return proc.returncode, json.loads(proc.stdout)["faults"]


def plan_states(spec: Path, db: Path) -> list[tuple[str, str]]:
    plan = json.loads(run_compile(str(spec), "--registry", str(db), "--dry-run", "--json").stdout)
    return [(v["state"], v["reason"]) for v in plan["variants"]]


def rebuild(spec: Path, db: Path) -> dict:
    return json.loads(run_compile(str(spec), "--registry", str(db), "-j", "1", "--json").stdout)


def test_a_corrupt_blob_file_is_rewritten_by_the_next_build(tmp_path: Path, built, one_spec: Path) -> None:
    db = built(tmp_path / "reg", True)
    (blob,) = (db.parent / "blobs").glob("??/*")
    data = bytearray(blob.read_bytes())
    data[200] ^= 0xFF
    blob.write_bytes(bytes(data))
    code, faults = verify(db)
    assert code == 1 and "bytes hash to" in faults[0]["problem"]
    ((state, reason),) = plan_states(one_spec, db)
    assert state == "stale" and "its artifact is damaged" in reason
    assert rebuild(one_spec, db)["built"] == 1
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    assert verify(db) == (0, [])
    ((state, _),) = plan_states(one_spec, db)
    assert state == "present"


def test_corrupt_inline_bytes_are_rewritten_by_the_next_build(tmp_path: Path, built, one_spec: Path) -> None:
    db = built(tmp_path / "reg", False)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE artifacts SET data = zeroblob(length(data))")
    assert verify(db)[0] == 1
    assert rebuild(one_spec, db)["built"] == 1
    assert verify(db) == (0, [])
    with Registry.open(db) as reg:
        (entry,) = reg.entries()
        assert reg._index.read_artifact(entry)  # hashed on the read


def test_a_lost_kernels_row_is_rebuilt_not_called_present(tmp_path: Path, built, one_spec: Path) -> None:
    db = built(tmp_path / "reg", False)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM kernels")
    code, faults = verify(db)
    assert code == 1 and faults[0]["problem"] == "its kernels row is missing"
    ((state, reason),) = plan_states(one_spec, db)
    assert (state, reason) == ("stale", "its kernels row is missing")
    assert rebuild(one_spec, db)["built"] == 1
    assert verify(db) == (0, [])
    with Registry.open(db) as reg:
        assert len(reg) == 1
