"""b12x-registry audits over registries of real cubins: diff, verify, stale, gc, export."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from b12x_aot.loader import Registry

from ..conftest import ROOT, TOPK_SMALL, registry_cli, run_compile, write_spec

pytestmark = pytest.mark.dsl

COPY_SPEC = (
    TOPK_SMALL.replace("family: moe.topk_sum", "family: test.topk_copy")
    .replace("b12x_aot.kernels.topk_sum:TopKSum", "testkernels.topk_sum:TopKSum")
    .replace("archs: [sm_90a, sm_100a, sm_120a]", "archs: [sm_90a]")
)


def rows(db: Path) -> list[dict]:
    return json.loads(registry_cli("ls", "-r", str(db), "--json").stdout)


@pytest.fixture
def kernel_copy(tmp_path: Path) -> tuple[Path, dict]:
    """A temp copy of the topk_sum kernel as its own package, and an env that imports it."""
    pkg = tmp_path / "pkgs" / "testkernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    source = (ROOT / "kernels" / "topk_sum.py").read_text().replace("from ._", "from b12x_aot.kernels._")
    (pkg / "topk_sum.py").write_text(source)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "pkgs"), os.environ.get("PYTHONPATH", "")]),
    }
    return pkg / "topk_sum.py", env


def edit_kernel(source: Path) -> None:
    """Change the copy's arithmetic (double every weight), so its code really changes."""
    text = source.read_text()
    assert "weights_tk[i] * x[None, i].load()" in text, "the kernel changed: update this edit"
    source.write_text(
        text.replace("weights_tk[i] * x[None, i].load()", "(weights_tk[i] * 2.0) * x[None, i].load()")
    )


def two_families(tmp_path: Path, env: dict, small_spec_dir: Path) -> tuple[Path, Path]:
    """Build moe.topk_sum and the kernel copy's test.topk_copy (sm_90a) into one registry."""
    specs = tmp_path / "specs"
    specs.mkdir()
    shutil.copy(small_spec_dir / "topk_small.yaml", specs / "topk_small.yaml")
    write_spec(specs, "copy.yaml", COPY_SPEC)
    db = tmp_path / "r.db"
    run_compile(str(specs), "--registry", str(db), "--arch", "sm_90a", "-j", "2", env=env)
    return specs, db


def test_every_audit_prints_its_rows_without_json(built_registry: Path) -> None:
    db = str(built_registry)
    key = rows(built_registry)[0]["key"]
    expected = {
        ("ls",): "12 variant(s)",
        ("show", key[:10]): "param table",
        ("builds",): "builds",
        ("failures",): "0 failure(s)",
        ("verify",): "checked 12 blob(s) and 12 variant(s): 0 fault(s)",
        ("diff", db, db): "12 identical",
    }
    for args, text in expected.items():
        proc = registry_cli(*args, *(() if args[0] == "diff" else ("-r", db)))
        out = proc.stdout + proc.stderr  # piped: rows on stdout, titles and counts on stderr
        assert text in out, f"{args}: {out}"
        if args == ("builds",):  # the title alone prints even without rows: want a build's status
            assert proc.stdout.splitlines()[0].split("\t")[2] == "ok", out


def test_diff_two_variants_shows_the_cta_threads_change(built_registry: Path) -> None:
    variants = rows(built_registry)
    pick = {
        (r["params"]["cta_threads"]): r
        for r in variants
        if r["arch"] == "sm_90a" and r["params"]["output"] == "fp32"
    }
    a, b = pick[128], pick[256]
    out = json.loads(
        registry_cli("diff", a["key"][:12], b["key"][:12], "-r", str(built_registry), "--json").stdout
    )
    (change,) = out["changed"]
    assert not change["artifact_equal"] and not change["text_equal"]
    # The SASS moved: instruction or register counts, or at least the opcode mix.
    deltas = change["deltas"]
    assert change["opcode_deltas"] or change["class_deltas"] or {"instructions", "registers"} & set(deltas)


def test_diff_two_builds_after_editing_one_kernel_file(
    tmp_path: Path, kernel_copy, small_spec_dir: Path
) -> None:
    source, env = kernel_copy
    specs, db = two_families(tmp_path, env, small_spec_dir)
    edit_kernel(source)
    run_compile(str(specs), "--registry", str(db), "--arch", "sm_90a", "-j", "2", env=env)
    out = json.loads(registry_cli("diff", "1", "2", "-r", str(db), "--json", env=env).stdout)
    assert not out["added"] and not out["removed"]
    changed = {c["variant"].split("[")[0] for c in out["changed"]}
    assert changed == {"test.topk_copy"}  # only the edited family
    assert len(out["changed"]) == 4 and out["identical"] == 4
    assert all(not c["artifact_equal"] and not c["text_equal"] for c in out["changed"])


def test_fail_on_flags_a_worse_shared_variant(
    tmp_path: Path, registry_copy: Path, built_registry: Path
) -> None:
    with sqlite3.connect(registry_copy) as conn:
        conn.execute(
            "UPDATE kernels SET registers = registers + 8 WHERE variant_id = (SELECT min(id) FROM variants)"
        )
    clean = registry_cli("diff", str(built_registry), str(registry_copy), "--fail-on", "spills,smem")
    assert clean.returncode == 0
    worse = registry_cli(
        "diff", str(built_registry), str(registry_copy), "--fail-on", "registers,spills", check=False
    )
    assert worse.returncode == 1
    assert "worse:" in worse.stdout and "registers" in worse.stdout
    bad = registry_cli("diff", str(built_registry), str(registry_copy), "--fail-on", "colour", check=False)
    assert bad.returncode == 2


def test_verify_names_the_variant_with_a_flipped_byte(registry_copy: Path) -> None:
    assert registry_cli("verify", "-r", str(registry_copy)).returncode == 0
    with sqlite3.connect(registry_copy) as conn:
        sha, key = conn.execute(
            "SELECT v.artifact_sha256, v.key FROM variants v ORDER BY v.id LIMIT 1"
        ).fetchone()
        data = bytearray(conn.execute("SELECT data FROM artifacts WHERE sha256 = ?", (sha,)).fetchone()[0])
        data[len(data) // 2] ^= 0x40
        conn.execute("UPDATE artifacts SET data = ? WHERE sha256 = ?", (bytes(data), sha))
    proc = registry_cli("verify", "-r", str(registry_copy), "--json", check=False)
    assert proc.returncode == 1
    faults = json.loads(proc.stdout)["faults"]
    assert len(faults) == 1
    assert faults[0]["key"] == key and "moe.topk_sum[" in faults[0]["what"]
    assert "bytes hash to" in faults[0]["problem"]


def test_verify_catches_a_wrong_recorded_arch(registry_copy: Path) -> None:
    with sqlite3.connect(registry_copy) as conn:
        conn.execute(
            "UPDATE variants SET arch = 'sm_100a' WHERE id = (SELECT min(id) FROM variants WHERE arch = 'sm_90a')"
        )
    proc = registry_cli("verify", "-r", str(registry_copy), "--json", check=False)
    assert proc.returncode == 1
    (fault,) = json.loads(proc.stdout)["faults"]
    assert "cubin ELF is SM 90; recorded arch is sm_100a" in fault["problem"]


def test_editing_a_kernel_copy_makes_exactly_that_family_stale(
    tmp_path: Path, kernel_copy, small_spec_dir: Path
) -> None:
    source, env = kernel_copy
    specs, db = two_families(tmp_path, env, small_spec_dir)
    fresh = json.loads(registry_cli("stale", "-r", str(db), "--specs", str(specs), "--json", env=env).stdout)
    assert fresh["stale"] == [] and fresh["variants"] == 8
    source.write_text(source.read_text() + "\n# an edit\n")
    out = json.loads(registry_cli("stale", "-r", str(db), "--specs", str(specs), "--json", env=env).stdout)
    assert len(out["stale"]) == 4
    for item in out["stale"]:
        assert item["variant"].startswith("test.topk_copy[")
        assert item["reasons"] == ["source changed: testkernels.topk_sum"]
    # and the build plan agrees
    plan = run_compile(str(specs), "--registry", str(db), "--arch", "sm_90a", "--dry-run", "--json", env=env)
    states = {
        (v["family"], v["state"]) for v in json.loads(plan.stdout)["variants"] if v["state"] != "rejected"
    }
    assert states == {("moe.topk_sum", "present"), ("test.topk_copy", "stale")}


def test_export_holds_exactly_the_manifest_and_the_loader_opens_it(
    tmp_path: Path, built_registry: Path
) -> None:
    manifest = tmp_path / "serving.yaml"
    manifest.write_text(
        "variants:\n"
        "  - family: moe.topk_sum\n    abi: 1\n    archs: [sm_90a, sm_120a]\n"
        "    params: {output: fp32, cta_threads: {min: 100, max: 200}}\n"
    )
    out = tmp_path / "serving.db"
    registry_cli("export", "-r", str(built_registry), "--manifest", str(manifest), str(out))
    exported = rows(out)
    assert {(r["arch"], r["params"]["output"], r["params"]["cta_threads"]) for r in exported} == {
        ("sm_90a", "fp32", 128),
        ("sm_120a", "fp32", 128),
    }
    assert registry_cli("verify", "-r", str(out)).returncode == 0
    with Registry.open(out, immutable=True) as reg:
        assert len(reg) == 2
        entry = reg.resolve(
            "moe.topk_sum",
            1,
            arch="sm_120a",
            element="bf16",
            output="fp32",
            topk=2,
            hidden=2048,
            cta_threads=128,
        )
        assert reg._index.read_artifact(entry)  # bytes inline and verified


def test_export_lists_every_unsatisfied_entry(tmp_path: Path, built_registry: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "variants:\n"
        "  - {family: moe.topk_sum, abi: 1, params: {output: [fp32, fp16], topk: 2}}\n"
        "  - {family: quant.mxfp8, abi: 1}\n"
        "  - {family: moe.topk_sum, abi: 1, params: {hidden: {min: 4096}}}\n"
    )
    out = tmp_path / "x.db"
    proc = registry_cli(
        "export", "-r", str(built_registry), "--manifest", str(manifest), str(out), check=False
    )
    assert proc.returncode == 1
    # fp16 is missing on each of the three archs built; the other two entries match nothing.
    assert "5 manifest requirement(s) matched nothing" in proc.stderr
    for arch in ("sm_90a", "sm_100a", "sm_120a"):
        assert f"moe.topk_sum abi=1 [{arch}] output=fp16 topk=2" in proc.stderr
    assert "quant.mxfp8 abi=1 [any arch]" in proc.stderr and "hidden=4096.." in proc.stderr
    assert not out.exists()


def test_gc_removes_only_what_nothing_references(tmp_path: Path, kernel_copy, small_spec_dir: Path) -> None:
    source, env = kernel_copy
    specs = tmp_path / "specs"
    specs.mkdir()
    write_spec(specs, "copy.yaml", COPY_SPEC)
    db = tmp_path / "r.db"
    run_compile(str(specs), "--registry", str(db), "-j", "2", env=env)
    edit_kernel(source)
    # 4 new current variants; 4 rows of history
    run_compile(str(specs), "--registry", str(db), "-j", "2", env=env)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO artifacts (sha256, kind, size, data, created_at) VALUES (?, 'cubin', 3, x'010203', '2026-01-01')",
            ("f" * 64,),
        )
    current_before = {r["key"]: r["artifact_sha256"] for r in rows(db)}

    def gc(*args: str) -> dict:
        return json.loads(registry_cli("gc", "-r", str(db), "--json", *args, env=env).stdout)

    dry = gc("--dry-run")
    assert dry["artifacts"] == 1 and dry["variants"] == 0  # only the orphan; history is referenced
    assert gc()["artifacts"] == 1
    assert gc("--dry-run")["artifacts"] == 0
    pruned = gc("--prune-history")
    assert pruned["variants"] == 4 and pruned["artifacts"] == 4
    assert {r["key"]: r["artifact_sha256"] for r in rows(db)} == current_before
    assert registry_cli("verify", "-r", str(db)).returncode == 0
    keep = tmp_path / "keep.yaml"
    keep.write_text("variants:\n  - {family: test.topk_copy, abi: 1, params: {output: bf16}}\n")
    kept = gc("--keep", str(keep))
    assert len(kept["uncurrent"]) == 2 and kept["variants"] == 2
    assert {r["params"]["output"] for r in rows(db)} == {"bf16"}
