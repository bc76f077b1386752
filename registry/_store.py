"""Opening a registry: URL, engine settings, schema version, transactions and blobs.

``--registry`` takes a path (SQLite, WAL mode) or a SQLAlchemy URL (``postgresql+psycopg://``).
Write transactions are short and, on SQLite, ``BEGIN IMMEDIATE`` with a long busy timeout,
so concurrent builders queue instead of failing with "database is locked". Blobs live in the
``artifacts`` table or, when the registry was created with a blob directory, in files named by
their sha256; either way every read checks the hash.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, delete, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from ._blobs import BlobStore, claim_blob_dir, register, registrations
from ._migrations import migratable, parse_schema_version
from ._schema import SCHEMA_VERSION, Base, Meta
from ._sqlite import BUSY_TIMEOUT_MS, damage_reason, quick_check, sqlite_engine
from .errors import (
    BlobDirError,
    RegistryDamaged,
    RegistryError,
    RegistryNotFound,
    RegistryUsageError,
    SchemaMismatch,
)

__all__ = ["RegistryStore", "file_missing", "registry_url", "utcnow"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _in_memory(url: URL) -> bool:
    database = url.database or ""
    return (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or url.query.get("mode") == "memory"
    )


def registry_url(target: str | os.PathLike[str]) -> str:
    """A SQLAlchemy URL for ``target``: URLs pass through, paths become SQLite URLs.

    An in-memory SQLite URL is refused: a build into it would vanish when the command exits.
    """
    text = os.fspath(target)
    if "://" in text:
        try:
            url = make_url(text)
        except ArgumentError as exc:
            raise RegistryNotFound(f"--registry {text!r} is not a valid database URL: {exc}") from None
        if url.get_backend_name() == "sqlite" and _in_memory(url):
            raise RegistryUsageError(
                f"--registry {text!r} is an in-memory SQLite database, which is gone when the command "
                "exits; give a file path (build/kernels.db) or a server URL"
            )
        return text
    return f"sqlite:///{Path(text).expanduser().resolve()}"


def _display(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _create_engine(url: str, **kwargs: Any) -> Engine:
    """``create_engine``, with a missing dialect or driver reported as a bad --registry."""
    try:
        return create_engine(url, **kwargs)
    except (ArgumentError, ImportError) as exc:  # NoSuchModuleError is an ArgumentError
        raise RegistryNotFound(
            f"cannot open registry {_display(url)}: SQLAlchemy cannot load the "
            f"{make_url(url).drivername!r} dialect ({exc}). Give a SQLite path or a "
            "postgresql+psycopg:// URL, with that driver installed."
        ) from None


def _sqlite_engine(url: str, *, read_only: bool = False) -> Engine:
    return sqlite_engine(url, make_url(url).database or "", read_only=read_only)


def _check_file(db_path: Path, create: bool) -> None:
    """Refuse a registry path that is not a file, saying what it is and what to give."""
    if db_path.is_dir():
        inside = sorted(p.name for p in db_path.glob("*.db"))[:3]
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise RegistryUsageError(
            f"registry {db_path} is a directory, not a registry file{hint}; give the path of a "
            f"registry file, such as {db_path / (inside[0] if inside else 'kernels.db')}"
        )
    if not db_path.exists() and not create:
        raise RegistryNotFound(
            f"registry {db_path} does not exist; give an existing registry file, or build one with "
            f"`b12x-compile specs/ --registry {db_path}`"
        )
    if create:
        try:
            db_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RegistryUsageError(
                f"cannot create registry {db_path}: {exc.strerror} ({db_path.parent}); "
                "give a path in a writable directory"
            ) from None


def file_missing(location: str) -> bool:
    """Whether ``location`` names a SQLite file that is not there."""
    url = make_url(registry_url(location))
    return url.get_backend_name() == "sqlite" and not Path(url.database or "").exists()


def _still_there(location: str, registry_id: str, directory: Path) -> bool:
    """Whether the registry registered as ``registry_id`` at ``location`` still is that registry
    and keeps its blobs in ``directory``. One that cannot be read is taken to be there."""
    if file_missing(location):
        return False
    try:
        other = RegistryStore.open(location, read_only=True, check_schema=False)
    except RegistryError:
        return True
    other.close()
    return other.registry_id == registry_id and other.blobs.directory == directory


def _not_a_registry(display: str, exc: BaseException) -> RegistryNotFound:
    """The error for a database that cannot be read as a registry at all."""
    reason = getattr(exc, "orig", None) or exc
    if isinstance(exc, (OperationalError, sqlite3.OperationalError)):
        return RegistryNotFound(f"cannot open registry {display}: {reason}")
    return RegistryNotFound(
        f"{display} is not a b12x-aot registry ({reason}); give a registry that b12x-compile built"
    )


class RegistryStore:
    """An open registry: engine, dialect and blob store. Build with :meth:`open`."""

    def __init__(self, engine: Engine, url: str, blobs: BlobStore, *, registry_id: str | None = None) -> None:
        self.engine = engine
        self.url = url
        self.blobs = blobs
        self.registry_id = registry_id  # set when it keeps blobs in a directory it claimed

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def display(self) -> str:
        return _display(self.url)

    @classmethod
    def open(
        cls,
        target: str | os.PathLike[str],
        *,
        create: bool = False,
        blob_dir: str | os.PathLike[str] | None = None,
        check_schema: bool = True,
        read_only: bool = False,
    ) -> RegistryStore:
        """Open (and with ``create``, initialise) a registry.

        With ``read_only`` (the audits) nothing is written: a SQLite file is opened with
        ``mode=ro``, so read-only files and mounts work and a file that is not a registry is
        left as it was. Raises :class:`RegistryNotFound` when it does not exist (and
        ``create`` is false) or is not a registry, :class:`SchemaMismatch` when its schema is
        not this code's (unless ``check_schema`` is false, which only ``migrate`` uses), and
        :class:`BlobDirError` for a ``blob_dir`` that is not the registry's.
        """
        assert not (create and read_only), "a read-only open cannot create"
        url = registry_url(target)
        is_sqlite = make_url(url).get_backend_name() == "sqlite"
        db_path = Path(make_url(url).database or "") if is_sqlite else None
        if db_path is not None:
            _check_file(db_path, create)
        resolved_blobs = Path(blob_dir).expanduser().resolve() if blob_dir is not None else None
        if not create:
            # Check it is a registry before anything writes to it (a WAL switch rewrites a file).
            probe = (
                _sqlite_engine(url, read_only=True) if is_sqlite else _create_engine(url, pool_pre_ping=True)
            )
            store = cls(probe, url, BlobStore(None))
            meta = store._read_meta()
            if not read_only and is_sqlite:
                probe.dispose()
                store = cls(_sqlite_engine(url), url, BlobStore(None))
        else:
            engine = _sqlite_engine(url) if is_sqlite else _create_engine(url, pool_pre_ping=True)
            store = cls(engine, url, BlobStore(None))
            stored: str | None = None
            if resolved_blobs is not None:
                # SQLite keeps the directory relative to the file, so the pair can move together.
                stored = (
                    os.path.relpath(resolved_blobs, db_path.parent)
                    if db_path is not None
                    else str(resolved_blobs)
                )
            try:
                meta = store._initialise_waiting(stored, resolved_blobs)
            except BaseException:
                engine.dispose()
                raise
        try:
            store = store._checked(meta, check_schema, resolved_blobs, db_path)
            return store if read_only or store.blobs.directory is None else store._settled()
        except BaseException:
            store.close()
            raise

    def _checked(
        self,
        meta: dict[str, str],
        check_schema: bool,
        blob_dir: Path | None,
        db_path: Path | None,
    ) -> RegistryStore:
        """This store with its blob directory, once its meta says it is one this code serves."""
        version = parse_schema_version(meta.get("schema_version"), self.display)
        if check_schema and version != SCHEMA_VERSION:
            raise SchemaMismatch(self.display, version, SCHEMA_VERSION, migratable=migratable(version))
        if version == SCHEMA_VERSION:
            self._check_tables()
        stored_dir = meta.get("blob_dir")
        directory = None
        if stored_dir:
            directory = ((db_path.parent if db_path is not None else Path("/")) / stored_dir).resolve()
        if blob_dir is not None and directory != blob_dir:
            if directory is None:
                raise BlobDirError(
                    f"registry {self.display} keeps its blobs in the database; --blob-dir applies only "
                    "when a registry is created. Drop --blob-dir, or give a new registry path."
                )
            raise BlobDirError(
                f"registry {self.display} keeps its blobs in {directory}, not in --blob-dir {blob_dir}. "
                "Drop --blob-dir (the registry records its own) or pass that directory."
            )
        if directory is None:
            return self
        # Blob files get the database file's permission bits: whoever reads one reads the other.
        mode = db_path.stat().st_mode & 0o666 if db_path is not None else 0o644
        blobs = BlobStore(directory, mode)
        return type(self)(self.engine, self.url, blobs, registry_id=meta.get("registry_id"))

    def _check_tables(self) -> None:
        """Refuse a database that has this schema's version but not all of its tables."""
        with self.read() as conn:
            missing = sorted(set(Base.metadata.tables) - set(inspect(conn).get_table_names()))
        if missing:
            raise RegistryNotFound(
                f"{self.display} is not a whole b12x-aot registry: it lacks the tables "
                f"{', '.join(missing)}. Give a registry that b12x-compile built, or rebuild this one "
                "with `b12x-compile specs/ --registry NEW`."
            )

    def _settled(self) -> RegistryStore:
        """This store, registered in its blob directory. A copy of another registry's file (its
        id registered at another location where that registry still is) gets an id of its own,
        so that gc of either keeps the blobs of both."""
        directory = self.blobs.directory
        assert directory is not None
        with self.write() as conn:
            rid = conn.execute(select(Meta.value).where(Meta.key == "registry_id")).scalar_one_or_none()
            elsewhere = registrations(directory).get(rid) if rid else None
            if rid is None or (
                elsewhere not in (None, self.display) and _still_there(elsewhere, rid, directory)
            ):
                fresh = uuid.uuid4().hex
                conn.execute(delete(Meta).where(Meta.key == "registry_id"))
                conn.execute(Meta.__table__.insert().values(key="registry_id", value=fresh))
                rid = fresh
            try:
                register(directory, rid, self.display)
            except OSError as exc:
                raise BlobDirError(
                    f"cannot register {self.display} in its blob directory {directory}: {exc.strerror}; "
                    "whoever writes the registry must be able to write its blob directory"
                ) from None
        return type(self)(self.engine, self.url, self.blobs, registry_id=rid)

    def _read_meta(self) -> dict[str, str]:
        """The meta rows, read without writing. Raises :class:`RegistryNotFound`."""
        try:
            with self.read() as conn:
                if not inspect(conn).has_table(Meta.__tablename__):
                    raise RegistryNotFound(
                        f"{self.display} is not a b12x-aot registry (no meta table); give a registry "
                        "that b12x-compile built"
                    )
                return dict(conn.execute(select(Meta.key, Meta.value)).all())
        except RegistryDamaged:
            self.engine.dispose()
            raise
        except (DBAPIError, sqlite3.Error) as exc:
            self.engine.dispose()
            raise _not_a_registry(self.display, exc) from None

    def _initialise_waiting(self, blob_dir: str | None, blob_path: Path | None) -> dict[str, str]:
        """:meth:`_initialise`, retried while SQLite reports the file locked: builders that
        open one new file at once race to create it and switch it to WAL, and SQLite answers
        some of those steps with "database is locked" without waiting on the busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        pause = 0.01
        while True:
            try:
                return self._initialise(blob_dir, blob_path)
            except OperationalError as exc:
                self.engine.dispose()  # drop the connection that saw the lock
                if not (
                    self.dialect == "sqlite" and "locked" in str(exc.orig) and time.monotonic() < deadline
                ):
                    raise RegistryNotFound(f"cannot open registry {self.display}: {exc.orig}") from None
                time.sleep(pause)
                pause = min(pause * 2, 0.5)
            except (DBAPIError, sqlite3.Error) as exc:
                self.engine.dispose()
                raise _not_a_registry(self.display, exc) from None

    def _initialise(self, blob_dir: str | None, blob_path: Path | None) -> dict[str, str]:
        """Create the tables and meta rows unless they exist; the meta rows."""
        with self.write() as conn:
            if self.dialect == "postgresql":
                # Serialise concurrent first opens; released at commit.
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(812001)")
            if not inspect(conn).has_table(Meta.__tablename__):
                Base.metadata.create_all(conn)
                rows = {"schema_version": str(SCHEMA_VERSION)}
                if blob_dir is not None and blob_path is not None:
                    rows["registry_id"] = uuid.uuid4().hex
                    rows["blob_dir"] = blob_dir
                    claim_blob_dir(blob_path, rows["registry_id"], self.display)
                for key, value in rows.items():
                    conn.execute(Meta.__table__.insert().values(key=key, value=value))
            return dict(conn.execute(select(Meta.key, Meta.value)).all())

    @contextlib.contextmanager
    def write(self) -> Iterator[Connection]:
        """A short write transaction (``BEGIN IMMEDIATE`` on SQLite), committed on exit.
        Raises :class:`RegistryDamaged` when SQLite finds the file's pages damaged."""
        try:
            with self.engine.connect().execution_options(b12x_write=True) as conn, conn.begin():
                yield conn
        except (DBAPIError, sqlite3.Error) as exc:
            damaged = self._damaged(exc)
            if damaged is None:
                raise
            raise damaged from None

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction. Raises :class:`RegistryDamaged` as :meth:`write` does."""
        try:
            with self.engine.connect() as conn, conn.begin():
                yield conn
        except (DBAPIError, sqlite3.Error) as exc:
            damaged = self._damaged(exc)
            if damaged is None:
                raise
            raise damaged from None

    def _damaged(self, exc: BaseException) -> RegistryDamaged | None:
        reason = damage_reason(exc)
        if reason is None:
            return None
        return RegistryDamaged(
            f"registry {self.display} is damaged ({reason}). See what is lost with `b12x-registry "
            f"verify -r {self.display}`, then restore the file from a copy or rebuild it with "
            "`b12x-compile specs/ --registry NEW`."
        )

    def integrity_faults(self) -> list[str]:
        """What SQLite's ``PRAGMA quick_check`` finds wrong with the file's pages (SQLite only;
        a server keeps its own pages)."""
        if self.dialect != "sqlite":
            return []
        with self.read() as conn:
            return quick_check(conn)

    def close(self) -> None:
        self.engine.dispose()
