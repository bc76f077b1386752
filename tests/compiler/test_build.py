"""Builds at scale: plan vs build, kill -9 and resume, failures, concurrent builders, shards."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import ONE_ARCH, ROOT, TOPK_SMALL, registry_cli, run_compile, write_spec

pytestmark = pytest.mark.dsl

# 2 outputs x 2 topk x 3 hiddens x 2 CTA sizes, one arch: 24 combinations, 8 of them pruned.
MEDIUM = (
    TOPK_SMALL.replace("topk: [2]", "topk: [1, 2]")
    .replace("hidden: [2048]", "hidden: [1024, 2048, 3072]")
    .replace("archs: [sm_90a, sm_100a, sm_120a]", "archs: [sm_90a]")
)


def current(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT c.key, v.artifact_sha256 FROM current_variants c JOIN variants v ON v.id = c.variant_id"
        ).fetchall()
    return dict(rows)


def consistent(db: Path) -> None:
    """No half-written rows: every current variant has its kernel and its artifact bytes."""
    with sqlite3.connect(db) as conn:
        dangling = conn.execute(
            "SELECT count(*) FROM current_variants c JOIN variants v ON v.id = c.variant_id "
            "LEFT JOIN kernels k ON k.variant_id = v.id LEFT JOIN artifacts a ON a.sha256 = v.artifact_sha256 "
            "WHERE k.variant_id IS NULL OR a.data IS NULL"
        ).fetchone()[0]
        assert dangling == 0
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def plan(spec: Path, db: Path, *extra: str) -> dict:
    return json.loads(run_compile(str(spec), "--registry", str(db), "--dry-run", "--json", *extra).stdout)


def test_dry_run_plan_matches_the_build(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "medium.yaml", MEDIUM)
    db = tmp_path / "r.db"
    before = plan(spec, db)
    assert not db.exists()  # a dry run creates nothing
    new = {v["key"] for v in before["variants"] if v["state"] == "new"}
    pruned = sum(p["count"] for p in before["pruned"])  # 1024 and 3072 wide at 256 threads
    assert all("hidden % (cta_threads * 8)" in p["reason"] for p in before["pruned"])
    assert (
        new
        and pruned == 2 * 2 * 2  # x output x topk
        and before["counts"]["new"] == len(new)
        and before["counts"]["pruned"] == pruned
    )
    assert not any(v["state"] == "rejected" for v in before["variants"])
    summary = json.loads(run_compile(str(spec), "--registry", str(db), "-j", "2", "--json").stdout)
    assert summary["built"] == len(new) and not summary["failed"]
    assert set(current(db)) == new
    assert not summary["rejected"] and summary["planned"]["pruned"] == pruned
    after = plan(spec, db)
    assert after["counts"] == {
        "present": len(new),
        "new": 0,
        "stale": 0,
        "failed": 0,
        "rejected": 0,
        "pruned": pruned,
    }


def test_kill_9_midway_then_resume_equals_an_uninterrupted_build(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "medium.yaml", MEDIUM)
    reference = tmp_path / "reference.db"
    run_compile(str(spec), "--registry", str(reference), "-j", "2")
    want = current(reference)

    db = tmp_path / "killed.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "b12x_aot.compiler", str(spec), "--registry", str(db), "-j", "2"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    done = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            try:
                done = len(current(db))
            except sqlite3.OperationalError:
                done = 0
            if done >= 4:
                break
        time.sleep(0.2)
    assert proc.poll() is None, "the build finished before it could be killed; grow the spec"
    os.killpg(proc.pid, signal.SIGKILL)  # the builder and its workers, mid-flight
    proc.wait()
    partial = current(db)
    assert 4 <= len(partial) < len(want)
    consistent(db)
    assert all(want[k] == sha for k, sha in partial.items())

    resumed = plan(spec, db)
    assert resumed["counts"]["present"] == len(partial)
    assert resumed["counts"]["new"] == len(want) - len(partial)
    run_compile(str(spec), "--registry", str(db), "-j", "2")
    assert current(db) == want
    consistent(db)
    with sqlite3.connect(db) as conn:
        statuses = [r[0] for r in conn.execute("SELECT status FROM builds ORDER BY id")]
    assert statuses == ["interrupted", "ok"]  # the killed build never finished; the resume did


def test_a_broken_variant_fails_alone(tmp_path: Path) -> None:
    # hidden=2052 passes this spec's (deliberately weak) constraint but not the kernel's own
    # check that rows are whole 16-byte vectors.
    text = (
        TOPK_SMALL.replace("hidden: [2048]", "hidden: [2048, 2052]")
        .replace('constraints: ["hidden % (cta_threads * 8) == 0"]', 'constraints: ["hidden % 4 == 0"]')
        .replace("archs: [sm_90a, sm_100a, sm_120a]", "archs: [sm_90a]")
    )
    spec = write_spec(tmp_path, "broken.yaml", text)
    db = tmp_path / "r.db"
    proc = run_compile(str(spec), "--registry", str(db), "-j", "2", "--json", check=False)
    assert proc.returncode == 1
    summary = json.loads(proc.stdout)
    assert summary["built"] == 4
    assert len(summary["failed"]) == 4
    for failure in summary["failed"]:
        assert "hidden=2052" in failure["variant"]
        assert failure["stage"] == "compile"
        assert "hidden must be a multiple of 8 (got 2052)" in failure["reason"]
    assert len(current(db)) == 4
    again = plan(spec, db)
    assert again["counts"]["failed"] == 4 and again["counts"]["new"] == 0  # not retried silently
    assert plan(spec, db, "--retry-failed")["counts"]["new"] == 4


def test_four_concurrent_builders_share_one_sqlite_file(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        "s.yaml",
        TOPK_SMALL.replace("archs: [sm_90a, sm_100a, sm_120a]", "archs: [sm_90a, sm_120a]"),
    )
    db = tmp_path / "shared.db"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "b12x_aot.compiler",
                str(spec),
                "--registry",
                str(db),
                "-j",
                "1",
                "--json",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert "locked" not in err.lower()
    built = current(db)
    assert len(built) == 8
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM current_variants").fetchone()[0] == 8
        assert conn.execute("SELECT count(*) FROM artifacts").fetchone()[0] == 8
        per_key = conn.execute("SELECT key, count(*) FROM variants GROUP BY key").fetchall()
    # Racing builders may each compile a variant, but an identical one is recorded once.
    assert all(n == 1 for _, n in per_key)
    consistent(db)


def test_shards_partition_the_plan(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "medium.yaml", MEDIUM)
    db = tmp_path / "none.db"
    whole = {v["key"]: v["state"] for v in plan(spec, db)["variants"]}
    parts = [
        {v["key"]: v["state"] for v in plan(spec, db, "--shard", f"{i}/3")["variants"]} for i in range(3)
    ]
    assert sum(len(p) for p in parts) == len(whole)
    merged: dict[str, str] = {}
    for part in parts:
        assert not merged.keys() & part.keys()
        merged.update(part)
    assert merged == whole
    assert all(parts), "each shard got some variants"
    # The same shard is the same everywhere: a second plan agrees.
    assert {v["key"] for v in plan(spec, db, "--shard", "1/3")["variants"]} == set(parts[1])


def test_bad_shard_is_a_usage_error(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "medium.yaml", MEDIUM)
    proc = run_compile(
        str(spec), "--registry", str(tmp_path / "r.db"), "--shard", "3/3", "--dry-run", check=False
    )
    assert proc.returncode == 2
    assert "0 <= i < N" in proc.stderr


def test_progress_summary_failures_and_ls_count_alike(tmp_path: Path) -> None:
    # topk=8 asks for more shared memory than sm_90a has (rejected at planning); hidden=2052
    # passes the spec's weak constraint but not the kernel's check (fails to compile).
    text = (
        ONE_ARCH.replace("output: [fp32, bf16]", "output: [fp32]")
        .replace("topk: [2]", "topk: [2, 8]")
        .replace("hidden: [2048]", "hidden: [2048, 2052]")
        .replace('constraints: ["hidden % (cta_threads * 8) == 0"]', 'constraints: ["hidden % 4 == 0"]')
        .replace("smem: 0", 'smem: "0 if topk == 2 else 300000"')
    )
    spec = write_spec(tmp_path, "mixed.yaml", text)
    db = tmp_path / "r.db"
    proc = run_compile(str(spec), "--registry", str(db), "-j", "2", check=False)  # piped, as in CI
    assert proc.returncode == 1, proc.stderr
    counts = "2 built, 0 unchanged, 0 already present, 4 rejected, 2 failed"
    lines = proc.stdout.splitlines()
    progress = next(line for line in lines if line.startswith("compiled 4/4"))
    summary = next(line for line in lines if line.startswith("build 1:"))
    assert re.fullmatch(rf"compiled 4/4: {counts} in [0-9.]+s", progress), lines
    assert re.fullmatch(rf"build 1: {counts} in [0-9.]+s", summary), lines
    assert sum("hidden=2052" in line for line in lines) == 2  # the failed variants, a line each
    failures = json.loads(registry_cli("failures", "-r", str(db), "--json").stdout)
    kinds = sorted((f["kind"], f["stage"]) for f in failures)
    assert kinds == [("failed", "compile")] * 2 + [("rejected", "smem")] * 4
    listed = registry_cli("ls", "-r", str(db), "topk=2").stdout.splitlines()
    assert sorted(line.split("\t")[0] for line in listed) == sorted(current(db))  # 2 whole keys
    assert len(listed) == 2
    builds = json.loads(registry_cli("builds", "-r", str(db), "--json").stdout)
    assert builds[0]["summary"]["counts"] == {
        "present": 0,
        "built": 2,
        "unchanged": 0,
        "rejected": 4,
        "failed": 2,
        "compiled": 4,
        "to_compile": 4,
    }
    # The next build finds the same verdicts, and records no rejection twice.
    again = json.loads(run_compile(str(spec), "--registry", str(db), "--json", check=False).stdout)
    assert again["counts"] | {"compiled": 0} == {
        "present": 2,
        "built": 0,
        "unchanged": 0,
        "rejected": 4,
        "failed": 2,
        "compiled": 0,
        "to_compile": 0,
    }
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM failures").fetchone()[0] == 6
