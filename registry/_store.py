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
import re
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import URL, Connection, Engine, create_engine, event, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from b12x_aot.loader import blob_path

from ._migrations import migratable, parse_schema_version
from ._schema import SCHEMA_VERSION, Artifact, Base, Meta
from .errors import BlobDirError, BlobError, RegistryNotFound, RegistryUsageError, SchemaMismatch

__all__ = [
    "OWNER_FILE",
    "BlobStore",
    "RegistryStore",
    "blob_owner",
    "claim_blob_dir",
    "registry_url",
    "utcnow",
]

_BUSY_TIMEOUT_MS = 600_000


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
    if read_only:
        # mode=ro: audits never create, convert (WAL) or lock-for-write the file they read.
        uri = "file:" + quote(make_url(url).database or "") + "?mode=ro"
        engine = _create_engine(
            url,
            creator=lambda: sqlite3.connect(
                uri, uri=True, timeout=_BUSY_TIMEOUT_MS / 1000, check_same_thread=False
            ),
        )
    else:
        engine = _create_engine(url, connect_args={"timeout": _BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" event issues BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
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


def _not_a_registry(display: str, exc: BaseException) -> RegistryNotFound:
    """The error for a database that cannot be read as a registry at all."""
    reason = getattr(exc, "orig", None) or exc
    if isinstance(exc, (OperationalError, sqlite3.OperationalError)):
        return RegistryNotFound(f"cannot open registry {display}: {reason}")
    return RegistryNotFound(
        f"{display} is not a b12x-aot registry ({reason}); give a registry that b12x-compile built"
    )


# In a blob directory: which registry owns it (its registry_id, then its location, for people).
OWNER_FILE = ".b12x-registry"
_SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def blob_owner(directory: Path) -> str | None:
    """The registry_id an owner marker in ``directory`` names, or None without one."""
    try:
        return (directory / OWNER_FILE).read_text().split("\n", 1)[0].strip() or None
    except FileNotFoundError:
        return None


def claim_blob_dir(directory: Path, registry_id: str, display: str) -> None:
    """Make ``directory`` the blob directory of registry ``registry_id``, or refuse.

    gc deletes the blob files its registry does not reference, so two registries must never
    share a directory: a directory another registry claimed, or one already holding files
    with no claim, is refused.
    """
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / OWNER_FILE
    owner = blob_owner(directory)
    if owner == registry_id:
        return
    if owner is not None:
        where = marker.read_text().split("\n")[1:2] or ["?"]
        raise BlobDirError(
            f"blob directory {directory} belongs to another registry ({where[0] or '?'}); give "
            f"{display} a --blob-dir of its own"
        )
    if any(p.name != OWNER_FILE for p in directory.iterdir()):
        raise BlobDirError(
            f"blob directory {directory} already holds files and no {OWNER_FILE} marker, so it may "
            f"hold another registry's blobs; give {display} a new or empty --blob-dir"
        )
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another opener claimed it between the check and here
        if blob_owner(directory) != registry_id:
            raise BlobDirError(
                f"blob directory {directory} was just claimed by another registry; give "
                f"{display} a --blob-dir of its own"
            ) from None
        return
    with os.fdopen(fd, "w") as f:
        f.write(f"{registry_id}\n{display}\n")


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

    def blob_files(self) -> Iterator[Path]:
        """Files named as this store names blobs: ``sha[:2]/sha`` with a 64-hex sha256.
        Anything else in the directory is not ours to touch."""
        if self.directory is None or not self.directory.is_dir():
            return
        for sub in self.directory.iterdir():
            if len(sub.name) != 2 or not sub.is_dir() or sub.is_symlink():
                continue
            for path in sub.iterdir():
                if _SHA256_NAME.fullmatch(path.name) and path.name[:2] == sub.name and path.is_file():
                    yield path

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
        db_path = Path(".")
        if is_sqlite:
            db_path = Path(make_url(url).database or "")
            if not db_path.exists() and not create:
                raise RegistryNotFound(
                    f"registry {db_path} does not exist; build one with `b12x-compile specs/ --registry {db_path}`"
                )
            if create:
                try:
                    db_path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise RegistryUsageError(
                        f"cannot create registry {db_path}: {exc.strerror} ({db_path.parent}); "
                        "give a path in a writable directory"
                    ) from None
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
                stored = os.path.relpath(resolved_blobs, db_path.parent) if is_sqlite else str(resolved_blobs)
            try:
                meta = store._initialise_waiting(stored, resolved_blobs)
            except BaseException:
                engine.dispose()
                raise
        try:
            return store._checked(meta, check_schema, resolved_blobs, db_path.parent if is_sqlite else None)
        except BaseException:
            store.close()
            raise

    def _checked(
        self,
        meta: dict[str, str],
        check_schema: bool,
        blob_dir: Path | None,
        sqlite_dir: Path | None,
    ) -> RegistryStore:
        """This store with its blob directory, once its meta says it is one this code serves."""
        version = parse_schema_version(meta.get("schema_version"), self.display)
        if check_schema and version != SCHEMA_VERSION:
            raise SchemaMismatch(self.display, version, SCHEMA_VERSION, migratable=migratable(version))
        stored_dir = meta.get("blob_dir")
        directory = None
        if stored_dir:
            directory = ((sqlite_dir or Path("/")) / stored_dir).resolve()
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
        return type(self)(self.engine, self.url, BlobStore(directory), registry_id=meta.get("registry_id"))

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
        except (DBAPIError, sqlite3.Error) as exc:
            self.engine.dispose()
            raise _not_a_registry(self.display, exc) from None

    def _initialise_waiting(self, blob_dir: str | None, blob_path: Path | None) -> dict[str, str]:
        """:meth:`_initialise`, retried while SQLite reports the file locked: builders that
        open one new file at once race to create it and switch it to WAL, and SQLite answers
        some of those steps with "database is locked" without waiting on the busy timeout."""
        deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
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
        """A short write transaction (``BEGIN IMMEDIATE`` on SQLite), committed on exit."""
        with self.engine.connect().execution_options(b12x_write=True) as conn, conn.begin():
            yield conn

    @contextlib.contextmanager
    def read(self) -> Iterator[Connection]:
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def close(self) -> None:
        self.engine.dispose()
