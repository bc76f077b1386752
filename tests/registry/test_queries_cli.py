"""What the audit commands list and accept: failures, diff operands, ls filters and table."""

from __future__ import annotations

import json
import sqlite3

import pytest

from .conftest import FakeRegistry, failure, record, variant


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
