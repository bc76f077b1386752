"""SQLite specifics of the store: engine settings, read-only opens, and telling damage apart.

Writers use WAL with a long busy timeout and take their lock up front (``BEGIN IMMEDIATE``).
Readers open with ``mode=ro``; where SQLite cannot lock the file that way (a read-only mount,
on which it can neither create nor map the ``-shm`` beside a WAL file) they fall back to
``immutable=1``, which reads the file as it lies without locking. A database whose pages are
damaged is told apart from one that is busy or unreachable by SQLite's own error codes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import DBAPIError

from .errors import RegistryUsageError

__all__ = ["BUSY_TIMEOUT_MS", "damage_reason", "quick_check", "sqlite_engine"]

BUSY_TIMEOUT_MS = 600_000
_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT})  # NOTADB: never a registry at all


def damage_reason(exc: BaseException) -> str | None:
    """SQLite's words when ``exc`` says the file's pages are damaged (not busy, not missing)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(orig, sqlite3.Error) and getattr(orig, "sqlite_errorcode", None) in _CORRUPT_CODES:
        return str(orig)
    return None


def quick_check(conn: Connection) -> list[str]:
    """``PRAGMA quick_check``'s findings: empty when every page and b-tree is well formed."""
    rows = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA quick_check").all()]
    return [] if rows == ["ok"] else rows


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A read-only connection: ``mode=ro``, or ``immutable=1`` where the file cannot be locked."""
    uri = "file:" + quote(path)
    conn = sqlite3.connect(
        uri + "?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
    )
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if exc.sqlite_errorcode != sqlite3.SQLITE_CANTOPEN:
            raise
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        # immutable=1 ignores the log: it would read the file without its last transactions.
        raise RegistryUsageError(
            f"cannot read {path}: SQLite cannot lock it here (a read-only mount or directory), and "
            f"{wal.name} beside it holds transactions not yet in the file. Checkpoint it where it "
            f"is writable (`sqlite3 {path} 'PRAGMA wal_checkpoint(TRUNCATE)'`), or read a copy "
            "from `b12x-registry export`."
        )
    return sqlite3.connect(
        uri + "?mode=ro&immutable=1", uri=True, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
    )


def sqlite_engine(url: str, database: str, *, read_only: bool = False) -> Engine:
    """An engine on SQLite file ``database``; with ``read_only``, one that never writes it."""
    if read_only:
        # Audits never create, convert (WAL) or lock-for-write the file they read.
        engine = create_engine(url, creator=lambda: _connect_read_only(database))
    else:
        engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not read_only:
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # Writers take the lock up front: upgrading a read lock later cannot wait, it fails.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("b12x_write") else "BEGIN")

    return engine
