"""Real offline compiles with the CuTe DSL, for all three archs, on a machine with no GPU."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from b12x_aot.loader._index import RegistryIndex

from ..conftest import TOPK_SMALL, checked_cubin, run_compile, write_spec

pytestmark = pytest.mark.dsl


def test_builds_all_three_archs(built_registry: Path) -> None:
    index = RegistryIndex(built_registry)
    entries = list(index.entries.values())
    assert {e.arch for e in entries} == {"sm_90a", "sm_100a", "sm_120a"}
    assert len(entries) == 12  # 2 outputs x 2 CTA sizes x 3 archs
    for entry in entries:
        info = checked_cubin(index, entry)
        assert info.ptxas_version and info.ptxas_version.startswith("13.")
        kernel = info.kernel(entry.symbol)
        assert kernel.max_threads == entry.params["cta_threads"]
        assert kernel.registers and kernel.registers > 0


def _compile_in_fresh_process(spec_dir: Path, arch: str, scratch: Path) -> str:
    code = (
        "import sys, hashlib\n"
        "from b12x_aot.compiler import CompileJob, compile_job, expand, load_spec, prepare_worker\n"
        f"prepare_worker({arch!r}, {str(scratch)!r})\n"
        f"spec = load_spec({str(spec_dir / 'topk_small.yaml')!r})\n"
        f"v = expand(spec, archs=[{arch!r}]).accepted[0]\n"
        "o = compile_job(CompileJob.of(v))\n"
        "assert o.status == 'ok', o.log\n"
        "print(hashlib.sha256(o.cubin).hexdigest())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    return out.stdout.strip().splitlines()[-1]


def test_two_compiles_give_identical_bytes(
    small_spec_dir: Path, built_registry: Path, tmp_path: Path
) -> None:
    first = _compile_in_fresh_process(small_spec_dir, "sm_90a", tmp_path)
    second = _compile_in_fresh_process(small_spec_dir, "sm_90a", tmp_path)
    assert first == second
    with sqlite3.connect(built_registry) as db:
        recorded = {row[0] for row in db.execute("SELECT artifact_sha256 FROM variants")}
    assert first in recorded  # and the build recorded those very bytes


def _i64_num_tokens(tmp_path: Path) -> Path:
    # The kernel takes num_tokens as Int32; a spec claiming i64 must not reach the registry.
    text = TOPK_SMALL.replace("{name: num_tokens,  kind: i32}", "{name: num_tokens,  kind: i64}")
    text = text.replace("output: [fp32, bf16]", "output: [fp32]").replace(
        "cta_threads: [128, 256]", "cta_threads: [128]"
    )
    return write_spec(tmp_path, "wrong.yaml", text)


def test_wrong_arg_kind_is_refused_before_compiling(tmp_path: Path) -> None:
    spec = _i64_num_tokens(tmp_path)
    db = tmp_path / "r.db"
    proc = run_compile(str(spec), "--registry", str(db), "--arch", "sm_90a", check=False)
    assert proc.returncode == 2, proc.stderr
    assert (
        f"{spec}:3: kernel: argument 'num_tokens' is i64 in the spec, but parameter 'num_tokens' "
        "of the kernel is annotated Int32" in proc.stderr
    )
    assert proc.stderr.count("error:") == 1  # once for the spec, not once per variant
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM builds").fetchone()[0] == 0


def test_wrong_args_fail_the_param_table_check(tmp_path: Path) -> None:
    # Compiled past the entry check, the host function's parameters still betray the mismatch.
    spec = _i64_num_tokens(tmp_path)
    code = (
        "from b12x_aot.compiler import CompileJob, compile_job, expand, load_spec, prepare_worker\n"
        f"prepare_worker('sm_90a', {str(tmp_path)!r})\n"
        f"v = expand(load_spec({str(spec)!r}), archs=['sm_90a']).accepted[0]\n"
        "o = compile_job(CompileJob.of(v))\n"
        "print(o.status, o.stage)\n"
        "print(o.reason)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    status, reason = out.stdout.split("\n", 1)
    assert status.split()[-2:] == ["failed", "contract"], out.stdout
    assert (
        "argument 4 'num_tokens' (i64): the spec packs 8 B (num_tokens as q), the kernel takes "
        "4 B (num_tokens as i)" in reason
    )


def test_compiles_differ_across_params(built_registry: Path) -> None:
    with sqlite3.connect(built_registry) as db:
        shas = [row[0] for row in db.execute("SELECT artifact_sha256 FROM variants")]
        blobs = [bytes(row[0]) for row in db.execute("SELECT data FROM artifacts")]
    assert len(set(shas)) == len(shas) == 12
    assert all(hashlib.sha256(b).hexdigest() in shas for b in blobs)
