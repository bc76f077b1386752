"""verify rehearses every variant's stored launch record as the loader would prepare it: a
tampered expression or a record of the wrong shape is a fault naming the variant, found
before a serving process meets it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import registry_cli


def _tamper(path: Path, launch: str) -> str:
    """Replace one current variant's launch record with ``launch``; return its key."""
    with sqlite3.connect(path) as conn:
        key, variant_id = conn.execute("SELECT key, variant_id FROM current_variants ORDER BY key").fetchone()
        conn.execute("UPDATE kernels SET launch_json = ? WHERE variant_id = ?", (launch, variant_id))
    return key


def _faults(path: Path) -> list[dict]:
    proc = registry_cli("verify", "-r", str(path), "--json", check=False)
    assert proc.returncode == (1 if json.loads(proc.stdout)["faults"] else 0), proc.stderr
    return json.loads(proc.stdout)["faults"]


def _recorded(path: Path) -> dict:
    with sqlite3.connect(path) as conn:
        (text,) = conn.execute("SELECT launch_json FROM kernels ORDER BY variant_id").fetchone()
    return json.loads(text)


def test_a_clean_registry_rehearses_without_faults(registry_copy: Path) -> None:
    assert _faults(registry_copy) == []


@pytest.mark.parametrize(
    ("grid", "reason"),
    [
        ("'a' * (1 << 30)", "string"),  # the value would be 1 GiB: refused before it is made
        ("cdiv(tokens, 0) +", "tokens"),  # does not parse
        ("__import__('os')", "only the functions"),
    ],
)
def test_a_tampered_grid_expression_is_a_fault(registry_copy: Path, grid: str, reason: str) -> None:
    launch = _recorded(registry_copy)
    launch["grid"] = [grid, "1", "1"]
    key = _tamper(registry_copy, json.dumps(launch))
    faults = [f for f in _faults(registry_copy) if f["key"] == key]
    assert len(faults) == 1, faults
    problem = faults[0]["problem"]
    assert problem.startswith("stored launch record: ") and reason in problem and "b12x-compile" in problem


def test_a_record_of_the_wrong_shape_is_a_fault(registry_copy: Path) -> None:
    key = _tamper(registry_copy, json.dumps({"grid": 5}))
    (fault,) = [f for f in _faults(registry_copy) if f["key"] == key]
    assert "stored launch record" in fault["problem"] and "rebuild" in fault["problem"]
