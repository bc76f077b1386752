"""What the audit commands list and accept: failures, diff operands, ls filters and table."""

from __future__ import annotations

import json
import sqlite3

import pytest

from b12x_aot.contract import VariantId

from .conftest import TOOLCHAIN, FakeRegistry, failure, record, variant


def test_failures_lists_only_keys_whose_latest_attempt_failed(fake_registry: FakeRegistry, run_cli) -> None:
    fixed, broken = variant(2048), variant(4096)
    fake_registry.build([record(variant(7168))])
    fake_registry.build(failures=[failure(fixed), failure(broken)])  # build 2: both fail
    fake_registry.build([record(fixed)])  # build 3: one builds
    listed = json.loads(run_cli("failures", "-r", fake_registry.path, "--json").stdout)
    assert [f["key"] for f in listed] == [broken.key]
    assert "0 failure(s)" not in run_cli("failures", "-r", fake_registry.path).stdout
    # a failure after a success is the latest attempt again
    fake_registry.build(failures=[failure(fixed, "regressed")])
    listed = json.loads(run_cli("failures", "-r", fake_registry.path, "--json").stdout)
    assert sorted(f["key"] for f in listed) == sorted([broken.key, fixed.key])


def test_failures_log_honours_json(fake_registry: FakeRegistry, run_cli) -> None:
    broken = variant(4096)
    fake_registry.build(failures=[failure(broken, "ptxas died")])
    result = run_cli("failures", "-r", fake_registry.path, "--log", broken.key[:10], "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["key"] == broken.key and data["log"] == "log: ptxas died" and data["reason"] == "ptxas died"


def digit_key_variant() -> tuple[int, str]:
    """A variant's hidden size whose key starts with 6 decimal digits, and that prefix."""
    for hidden in range(1, 5000):
        key = variant(hidden).key
        if key[:6].isdigit():
            return hidden, key[:6]
    raise AssertionError("no key starts with 6 digits")


def test_diff_takes_an_all_digit_key_prefix_that_is_no_build(fake_registry: FakeRegistry, run_cli) -> None:
    hidden, prefix = digit_key_variant()
    fake_registry.build([record(variant(hidden)), record(variant(2048), smem=4096)])
    other = variant(2048).key[:8]
    result = run_cli("diff", prefix, other, "-r", fake_registry.path, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["changed"][0]["deltas"]["smem"] == [1024, 4096]
    # a number that is a build id and a key prefix at once is refused, naming both readings
    with sqlite3.connect(fake_registry.path) as conn:
        conn.execute(
            "INSERT INTO builds (id, started_at, status, host, user, command) "
            "VALUES (?, '2026-01-01', 'ok', 'h', 'u', 'c')",
            (int(prefix),),
        )
    ambiguous = run_cli("diff", prefix, other, "-r", fake_registry.path)
    assert ambiguous.exit_code == 2 and f"build:{int(prefix)}" in ambiguous.output
    assert run_cli("diff", "build:1", f"build:{int(prefix)}", "-r", fake_registry.path).exit_code == 0
    missing = run_cli("diff", "98765432", other, "-r", fake_registry.path)
    assert missing.exit_code == 2 and "neither a build" in missing.output


def test_ls_table_never_clips_keys_or_numbers(fake_registry: FakeRegistry, run_cli) -> None:
    wide = variant(7168, family="moe.a_rather_long_family_name")
    fake_registry.build([record(wide, smem=142336)])
    out = run_cli("ls", "-r", fake_registry.path).stdout  # not a terminal: 80 columns by default
    assert wide.key[:12] in out and "142336" in out and "…" not in out


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (("nosuchparam=1",), "nosuchparam"),
        (("--family", "no.such"), "moe.fake"),
        (("--arch", "sm_75"), "sm_90a"),
    ],
)
def test_ls_rejects_names_the_registry_does_not_have(three_variants, run_cli, args, names) -> None:
    result = run_cli("ls", "-r", three_variants.path, *args)
    assert result.exit_code == 2 and names in result.output, result.output
    assert run_cli("ls", "-r", three_variants.path, "hidden=2048", "--family", "moe.fake").exit_code == 0


def test_piped_ls_is_one_greppable_line_per_row_with_its_full_key(
    fake_registry: FakeRegistry, run_cli
) -> None:
    family = "moe.a_rather_long_family_name_that_would_wrap"
    wanted = [
        VariantId.of(family=family, abi=1, arch="sm_90a", params={"topk": topk, "hidden": h, "n": 7168})
        for topk in (2, 8)
        for h in range(1024, 1024 + 54 * 64, 64)
    ]
    fake_registry.build([record(v) for v in wanted])
    result = run_cli("ls", "-r", fake_registry.path, "topk=8")
    lines = result.stdout.splitlines()
    eights = sorted(v.key for v in wanted if v.params["topk"] == 8)
    assert len(lines) == len(eights) == sum("topk=8" in line for line in lines) == 54  # grep -c
    assert sorted(line.split("\t")[0] for line in lines) == eights  # whole keys, one per line
    assert all(line.split("\t")[1:4] == [family, "1", "sm_90a"] for line in lines)
    assert "54 variant(s) in" in result.stderr  # the title is no row


def _json_strings(value: object, path: str = "$") -> list[str]:
    """Where ``value`` holds a string that is itself a JSON object or array."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _json_strings(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _json_strings(v, f"{path}[{i}]")]
    if isinstance(value, str) and value[:1] in "{[":
        try:
            json.loads(value)
        except ValueError:
            return []
        return [path]
    return []


def test_every_json_output_is_plain_nested_json(fake_registry: FakeRegistry, run_cli, tmp_path) -> None:
    kept, broken = variant(2048), variant(4096)
    fake_registry.build([record(kept)], failures=[failure(broken)])
    build = fake_registry.writer.begin_build(TOOLCHAIN, "b12x-compile fake", None)
    summary = {"built": 0, "failed": [], "rejected": 0, "planned": {"present": 1}, "counts": {"built": 0}}
    fake_registry.writer.finish_build(build, "ok", summary)
    manifest = tmp_path / "m.yaml"
    manifest.write_text("variants:\n  - {family: moe.fake, abi: 1}\n")
    db = fake_registry.path
    commands = [
        ("ls", "-r", db),
        ("show", "-r", db, kept.key[:12]),
        ("diff", db, db),
        ("diff", "1", "2", "-r", db),
        ("verify", "-r", db),
        ("stale", "-r", db),
        ("gc", "-r", db, "--dry-run"),
        ("export", "-r", db, "--manifest", manifest, tmp_path / "out.db"),
        ("migrate", "-r", db, "--dry-run"),
        ("builds", "-r", db),
        ("failures", "-r", db),
        ("failures", "-r", db, "--log", broken.key[:12]),
    ]
    for args in commands:
        result = run_cli(*args, "--json")
        data = json.loads(result.stdout)
        assert _json_strings(data) == [], (args, result.stdout)
    builds = json.loads(run_cli("builds", "-r", db, "--json").stdout)
    assert builds[1]["summary"] == summary and builds[1]["started_at"][:2] == "20"
