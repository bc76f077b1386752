"""Damage to a registry is found and named: by verify (quick_check and rows), the loader and
every audit; never a raw SQLite error, a traceback or a silently smaller registry."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from b12x_aot.loader import IntegrityError, Registry, RegistryFormatError

from .conftest import FakeRegistry, record, variant

PAGE = 4096


def forty_variants(tmp_path: Path) -> Path:
    """A registry of 40 variants, blobs inline, in rollback-journal mode (one file to damage)."""
    reg = FakeRegistry(tmp_path / "r.db")
    reg.build([record(variant(h)) for h in range(1000, 1040)])
    reg.store.close()
    with sqlite3.connect(reg.path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE
    return reg.path


def scribble(path: Path, page: int, seed: int = 1) -> None:
    """Random bytes over one page (page 1 keeps its 100-byte file header)."""
    start = 100 if page == 1 else 0
    rnd = random.Random(seed + page)
    with path.open("r+b") as f:
        f.seek((page - 1) * PAGE + start)
        f.write(bytes(rnd.randrange(256) for _ in range(PAGE - start)))


def loader_outcome(path: Path) -> str:
    """How the loader takes the file: a named error, or every variant with its bytes."""
    try:
        with Registry.open(path) as reg:
            assert len(reg) == 40, f"the loader silently served {len(reg)} of 40 variants"
            reg._index.read_artifacts(reg.entries())
    except (RegistryFormatError, IntegrityError) as exc:
        assert "verify" in str(exc) or "b12x-compile" in str(exc), str(exc)
        return "refused"
    return "served"


def test_every_damaged_page_is_found_and_named(tmp_path: Path, run_cli) -> None:
    clean = forty_variants(tmp_path)
    pages = clean.stat().st_size // PAGE
    damaged = tmp_path / "damaged.db"
    for page in range(1, pages + 1):
        damaged.write_bytes(clean.read_bytes())
        scribble(damaged, page)
        # The audits: exit 2 with the fix for what they cannot read; never a traceback, never 1.
        ls = run_cli("ls", "-r", damaged, "--json")
        assert ls.exit_code in (0, 2), (page, ls.output)
        if ls.exit_code == 2:
            assert "damaged" in ls.stderr and "b12x-registry verify" in ls.stderr, (page, ls.stderr)
        # verify names the damage: a quick_check or row fault (the made-up cubins add their own).
        check = run_cli("verify", "-r", damaged, "--json")
        if check.exit_code == 2:
            assert "is damaged" in check.stderr and "restore" in check.stderr, (page, check.stderr)
        else:
            assert check.exit_code == 1, (page, check.output)
            problems = [f["problem"] for f in json.loads(check.stdout)["faults"]]
            assert any("readable cubin" not in p for p in problems), (page, problems)
        assert loader_outcome(damaged) == "refused", page


def test_verify_runs_quick_check(tmp_path: Path, run_cli) -> None:
    path = forty_variants(tmp_path)
    with sqlite3.connect(path) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'ix_failures_key'").fetchone()
    scribble(path, root)  # an index no query of verify reads: only quick_check sees it
    faults = json.loads(run_cli("verify", "-r", path, "--json").stdout)["faults"]
    assert any(f["problem"].startswith("quick_check: ") and f"Page {root}" in f["problem"] for f in faults)


def test_a_lost_kernels_row_is_a_fault_and_a_loader_error(three_variants: FakeRegistry, run_cli) -> None:
    three_variants.store.close()
    path = three_variants.path
    victim = variant(4096)
    with sqlite3.connect(path) as conn:  # foreign keys are off in a bare sqlite3 connection
        conn.execute(
            "DELETE FROM kernels WHERE variant_id = (SELECT variant_id FROM current_variants WHERE key = ?)",
            (victim.key,),
        )
    faults = json.loads(run_cli("verify", "-r", path, "--json").stdout)["faults"]
    assert {"what": victim.key[:16], "key": victim.key, "problem": "its kernels row is missing"} in faults
    with pytest.raises(
        RegistryFormatError, match=r"1 current variant\(s\) lost their variants or kernels row"
    ):
        Registry.open(path)


def test_the_audits_report_a_database_error_without_a_traceback(
    three_variants: FakeRegistry, run_cli
) -> None:
    three_variants.store.close()
    with sqlite3.connect(three_variants.path) as conn:
        conn.execute("DROP TABLE failures")
    result = run_cli("failures", "-r", three_variants.path)
    assert result.exit_code == 2
    assert "lacks the tables failures" in result.stderr and "rebuild" in result.stderr
