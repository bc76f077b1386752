"""Opening a registry: URL, engine settings, schema version, transactions and blobs.

``--registry`` takes a path (SQLite, WAL mode) or a SQLAlchemy URL (``postgresql+psycopg://``).
Write transactions are short and, on SQLite, ``BEGIN IMMEDIATE`` with a long busy timeout,
so concurrent builders queue instead of failing with "database is locked". Blobs live in the
``artifacts`` table or, when the registry was created with a blob directory, in files named by
their sha256; either way every read checks the hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from b12x_aot.loader import blob_path

from ._schema import SCHEMA_VERSION, Artifact, Base, Meta
from .errors import BlobError, RegistryNotFound, SchemaMismatch

__all__ = ["BlobStore", "RegistryStore", "registry_url", "utcnow"]

_BUSY_TIMEOUT_MS = 600_000


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def registry_url(target: str | os.PathLike[str]) -> str:
    """A SQLAlchemy URL for ``target``: URLs pass through, paths become SQLite URLs."""
    text = os.fspath(target)
    if "://" in text:
        try:
            make_url(text)
        except ArgumentError as exc:
            raise RegistryNotFound(f"--registry {text!r} is not a valid database URL: {exc}") from None
        return text
    return f"sqlite:///{Path(text).expanduser().resolve()}"


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(url, connect_args={"timeout": _BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # Writers take the lock up front: upgrading a read lock later cannot wait, it fails.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("b12x_write") else "BEGIN")

    return engine


@dataclass(frozen=True, slots=True)
class BlobStore:
    """Where artifact bytes live: ``directory`` of sha256-named files, or the database."""

    directory: Path | None

    def path(self, sha256: str) -> Path:
        assert self.directory is not None
        return blob_path(self.directory, sha256)

    def write_file(self, sha256: str, data: bytes) -> None:
        """Write a blob file atomically (temp file, fsync, rename). Idempotent."""
        target = self.path(sha256)
        if target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def read(self, conn: Connection, sha256: str) -> bytes:
        """The verified bytes of blob ``sha256``. Raises :class:`BlobError`."""
        row = conn.execute(select(Artifact.data).where(Artifact.sha256 == sha256)).first()
        if row is None:
            raise BlobError(sha256, "no artifact row")
        data = row[0]
        if data is None:
            if self.directory is None:
                raise BlobError(sha256, "the row has no bytes and the registry has no blob directory")
            try:
                data = self.path(sha256).read_bytes()
            except OSError as exc:
                raise BlobError(sha256, f"blob file unreadable: {exc.strerror}") from None
        data = bytes(data)
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise BlobError(sha256, f"bytes hash to {actual}")
        return data


class RegistryStore:
    """An open registry: engine, dialect and blob store. Build with :meth:`open`."""

    def __init__(self, engine: Engine, url: str, blobs: BlobStore) -> None:
        self.engine = engine
        self.url = url
        self.blobs = blobs

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def display(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    @classmethod
    def open(
        cls,
        target: str | os.PathLike[str],
        *,
        create: bool = False,
        blob_dir: str | os.PathLike[str] | None = None,
        check_schema: bool = True,
    ) -> RegistryStore:
        """Open (and with ``create``, initialise) a registry.

        Raises :class:`RegistryNotFound` when it does not exist and ``create`` is false, and
        :class:`SchemaMismatch` when its schema is not this code's (unless ``check_schema`` is
        false, which only ``migrate`` uses).
        """
        url = registry_url(target)
        is_sqlite = url.startswith("sqlite")
        db_path = Path(".")
        if is_sqlite:
            db_path = Path(make_url(url).database or "")
            if not db_path.exists() and not create:
                raise RegistryNotFound(
                    f"registry {db_path} does not exist; build one with `b12x-compile specs/ --registry {db_path}`"
                )
            db_path.parent.mkdir(parents=True, exist_ok=True)
            engine = _sqlite_engine(url)
        else:
            engine = create_engine(url, pool_pre_ping=True)
        store = cls(engine, url, BlobStore(None))
        stored: str | None = None
        if blob_dir is not None:
            resolved = Path(blob_dir).expanduser().resolve()
            # SQLite keeps the directory relative to the file, so the pair can move together.
            stored = os.path.relpath(resolved, db_path.parent) if is_sqlite else str(resolved)
        meta = store._initialise_waiting(create, stored)
        version = int(meta.get("schema_version", "0"))
        if check_schema and version != SCHEMA_VERSION:
            engine.dispose()
            raise SchemaMismatch(store.display, version, SCHEMA_VERSION)
        stored_dir = meta.get("blob_dir")
        if blob_dir is not None and stored_dir is None:
            engine.dispose()
            raise BlobError(
                "-",
                f"registry {store.display} keeps blobs in the database; --blob-dir applies at creation only",
            )
        if stored_dir:
            base = db_path.parent if is_sqlite else Path("/")
            store = cls(engine, url, BlobStore((base / stored_dir).resolve()))
        return store

    def _initialise_waiting(self, create: bool, blob_dir: str | None) -> dict[str, str]:
        """:meth:`_initialise`, retried while SQLite reports the file locked: builders that
        open one new file at once race to create it and switch it to WAL, and SQLite answers
        some of those steps with "database is locked" without waiting on the busy timeout."""
        deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
        pause = 0.01
        while True:
            try:
                return self._initialise(create, blob_dir)
            except OperationalError as exc:
                self.engine.dispose()  # drop the connection that saw the lock
                if not (
                    self.dialect == "sqlite" and "locked" in str(exc.orig) and time.monotonic() < deadline
                ):
                    raise RegistryNotFound(f"cannot open registry {self.display}: {exc.orig}") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)

    def _initialise(self, create: bool, blob_dir: str | None) -> dict[str, str]:
        with self.write() as conn:
            if self.dialect == "postgresql":
                # Serialise concurrent first opens; released at commit.
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(812001)")
            if not inspect(conn).has_table(Meta.__tablename__):
                if not create:
                    raise RegistryNotFound(f"{self.display} is not a b12x-aot registry (no meta table)")
                Base.metadata.create_all(conn)
                rows = [Meta(key="schema_version", value=str(SCHEMA_VERSION))]
                if blob_dir is not None:
                    rows.append(Meta(key="blob_dir", value=blob_dir))
                for row in rows:
                    conn.execute(Meta.__table__.insert().values(key=row.key, value=row.value))
            return dict(conn.execute(select(Meta.key, Meta.value)).all())

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A short write transaction (``BEGIN IMMEDIATE`` on SQLite), committed on exit."""
        with self.engine.connect().execution_options(b12x_write=True) as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def close(self) -> None:
        self.engine.dispose()
