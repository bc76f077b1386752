"""What Registry.open says about files it cannot read (no GPU, no compiler)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from b12x_aot.loader import Registry, RegistryFormatError, _index


def test_open_rejects_non_registries(tmp_path: Path) -> None:
    with pytest.raises(RegistryFormatError, match="does not exist"):
        Registry.open(tmp_path / "absent.db")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(RegistryFormatError, match="is not a b12x-aot registry"):
        Registry.open(junk)


def _database(path: Path, journal: str) -> Path:
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA journal_mode={journal}")
    db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
    db.commit()
    db.close()
    return path


@pytest.mark.parametrize(
    ("journal", "says"), [("wal", "write-ahead-log"), ("delete", "not a b12x-aot registry")]
)
def test_a_refused_read_only_open_names_the_write_ahead_log_only_when_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, journal: str, says: str
) -> None:
    """SQLite refuses a WAL file in a directory it may not write (it needs the -shm file): the
    error says so and how to serve such a file; any other refusal keeps the generic message."""
    path = _database(tmp_path / f"{journal}.db", journal)

    def refuse(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(_index.sqlite3, "connect", refuse)
    with pytest.raises(RegistryFormatError, match=says) as err:
        Registry.open(path)
    if journal == "wal":
        assert "b12x-registry export" in str(err.value) and "immutable=True" in str(err.value)
