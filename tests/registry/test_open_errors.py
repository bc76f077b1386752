"""Registry paths and schemas the commands refuse: exit 2, saying what the path is and what to
give, with the registry commands and the loader agreeing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from b12x_aot.loader import Registry, RegistryFormatError

from ..conftest import ONE_VARIANT, run_compile, write_spec
from .conftest import FakeRegistry, variant


def set_meta(path: Path, value: str | None) -> None:
    with sqlite3.connect(path) as conn:
        if value is None:
            conn.execute("DELETE FROM meta WHERE key = 'schema_version'")
        else:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (value,))


@pytest.mark.parametrize(
    ("value", "problem"),
    [("abc", "its schema_version 'abc' is not an integer"), (None, "its meta table has no schema_version")],
)
def test_the_loader_and_the_commands_say_the_same_of_a_bad_schema_version(
    fake_registry: FakeRegistry, run_cli, value: str | None, problem: str
) -> None:
    fake_registry.store.close()
    set_meta(fake_registry.path, value)
    with pytest.raises(RegistryFormatError) as loader:
        Registry.open(fake_registry.path)
    assert problem in str(loader.value) and "b12x-compile specs/ --registry NEW" in str(loader.value)
    assert "migrate" not in str(loader.value)  # migrate refuses it too: never send the user there
    for command in ("ls", "migrate"):
        result = run_cli(command, "-r", fake_registry.path)
        assert result.exit_code == 2 and problem in result.stderr
        assert "b12x-compile specs/ --registry NEW" in result.stderr


def test_a_database_with_only_the_meta_table_is_not_a_whole_registry(tmp_path: Path, run_cli) -> None:
    path = tmp_path / "meta.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '3')")
    for command in ("ls", "verify", "builds"):
        result = run_cli(command, "-r", path)
        assert (
            result.exit_code == 2 and "is not a whole b12x-aot registry: it lacks the tables" in result.stderr
        )
    with pytest.raises(RegistryFormatError, match="is not a whole b12x-aot registry"):
        Registry.open(path)


def test_a_registry_path_that_is_a_directory_says_so(three_variants: FakeRegistry, run_cli) -> None:
    directory = three_variants.path.parent
    result = run_cli("ls", "-r", directory)
    assert result.exit_code == 2
    assert f"registry {directory} is a directory, not a registry file (it holds r.db)" in result.stderr
    assert f"such as {directory / 'r.db'}" in result.stderr and "disk I/O" not in result.stderr
    with pytest.raises(RegistryFormatError, match="is a directory, not a registry file"):
        Registry.open(directory)


def test_diff_of_a_missing_file_says_it_does_not_exist(
    three_variants: FakeRegistry, run_cli, tmp_path
) -> None:
    missing = tmp_path / "gone.db"
    result = run_cli("diff", missing, three_variants.path)
    assert result.exit_code == 2
    assert f"registry {missing} does not exist; give an existing registry file" in result.stderr


def test_a_blob_dir_that_is_a_file_is_bad_input(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "one.yaml", ONE_VARIANT)
    not_a_dir = tmp_path / "blobs"
    not_a_dir.write_text("a file")
    proc = run_compile(
        str(spec), "--registry", str(tmp_path / "r.db"), "--blob-dir", str(not_a_dir), check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert f"--blob-dir {not_a_dir} is a file, not a directory" in proc.stderr
    assert "rerun" not in proc.stderr


def test_migrate_adds_the_build_pid_to_a_schema_2_registry(three_variants: FakeRegistry, run_cli) -> None:
    three_variants.store.close()
    with sqlite3.connect(three_variants.path) as conn:
        conn.execute("ALTER TABLE builds DROP COLUMN pid")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    refused = run_cli("ls", "-r", three_variants.path)
    assert refused.exit_code == 2 and "b12x-registry migrate" in refused.stderr
    assert run_cli("migrate", "-r", three_variants.path).exit_code == 0
    assert run_cli("builds", "-r", three_variants.path).exit_code == 0
    with Registry.open(three_variants.path) as reg:
        assert len(reg) == 3 and variant(2048).key in {e.key for e in reg.entries()}
