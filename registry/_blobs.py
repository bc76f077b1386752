"""Blob files, and the registries that share a blob directory.

A registry created with ``--blob-dir`` keeps each artifact's bytes in ``sha[:2]/sha256``,
written atomically (temp file, fsync, rename) with the read permissions of the registry's
database file, so whoever may read the registry may read its blobs. A file that exists but
does not hash to its name is damaged: writing that blob again replaces it, then re-reads it.

The directory knows its registries: the one that created it is named in :data:`OWNER_FILE`,
and every registry that uses it (copies of the file included) is registered as one file in
:data:`REGISTRIES_DIR`, named by registry id and holding the registry's location. ``gc``
keeps every blob file that any registered registry references.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, select

from b12x_aot.loader import blob_path

from ._schema import Artifact
from .errors import BlobDirError, BlobError

__all__ = [
    "OWNER_FILE",
    "REGISTRIES_DIR",
    "BlobStore",
    "blob_owner",
    "claim_blob_dir",
    "register",
    "registration_file",
    "registrations",
]

# In a blob directory: which registry created it (its registry_id, then its location).
OWNER_FILE = ".b12x-registry"
# In a blob directory: one file per registry that uses it, named by its id, holding its location.
REGISTRIES_DIR = ".b12x-registries"
_SHA256_NAME = re.compile(r"[0-9a-f]{64}")
_ID_NAME = re.compile(r"[0-9a-f]{32}")


def blob_owner(directory: Path) -> str | None:
    """The registry_id an owner marker in ``directory`` names, or None without one."""
    try:
        return (directory / OWNER_FILE).read_text().split("\n", 1)[0].strip() or None
    except FileNotFoundError:
        return None


def registration_file(directory: Path, registry_id: str) -> Path:
    return directory / REGISTRIES_DIR / registry_id


def registrations(directory: Path) -> dict[str, str]:
    """registry_id -> location of every registry registered in ``directory`` (its creator too,
    from the owner marker, for directories written before registrations existed)."""
    found: dict[str, str] = {}
    with contextlib.suppress(FileNotFoundError):
        lines = (directory / OWNER_FILE).read_text().split("\n")
        if lines[0].strip():
            found[lines[0].strip()] = lines[1].strip() if len(lines) > 1 else ""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in (directory / REGISTRIES_DIR).iterdir():
            if _ID_NAME.fullmatch(entry.name):
                found[entry.name] = entry.read_text().strip()
    return found


def register(directory: Path, registry_id: str, location: str) -> None:
    """Record that registry ``registry_id`` at ``location`` keeps its blobs in ``directory``."""
    target = registration_file(directory, registry_id)
    with contextlib.suppress(OSError):
        if target.read_text().strip() == location:
            return
    target.parent.mkdir(exist_ok=True)
    _atomic_write(target, f"{location}\n".encode(), 0o644)


def _usable_dir(directory: Path, display: str) -> None:
    """Create ``directory``, or refuse a path that cannot be one, saying what it is."""
    if directory.exists() and not directory.is_dir():
        raise BlobDirError(
            f"--blob-dir {directory} is a file, not a directory; give {display} a directory for its "
            "blobs (a new or empty one)"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BlobDirError(
            f"cannot create --blob-dir {directory}: {exc.strerror}; give {display} a directory "
            "it may create and write"
        ) from None


def claim_blob_dir(directory: Path, registry_id: str, display: str) -> None:
    """Make ``directory`` the blob directory of the new registry ``registry_id``, or refuse.

    Only a registry's own copies share its directory: one another registry created, or one
    already holding files with no owner marker, is refused.
    """
    _usable_dir(directory, display)
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
    register(directory, registry_id, display)


def _atomic_write(target: Path, data: bytes, mode: int) -> None:
    """Write ``target`` whole or not at all: temp file beside it, fsync, rename."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # mkstemp makes 0600; readers need the registry's bits
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _holds(path: Path, sha256: str) -> bool:
    """Whether ``path`` exists and its bytes hash to ``sha256``."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class BlobStore:
    """Where artifact bytes live: ``directory`` of sha256-named files, or the database.

    ``mode`` is the permission bits of new blob files: the database file's read and write
    bits, so every user who may read the registry may read its blobs.
    """

    directory: Path | None
    mode: int = 0o644

    def path(self, sha256: str) -> Path:
        if self.directory is None:
            raise BlobError(sha256, "the registry keeps its blobs in the database, not in files")
        return blob_path(self.directory, sha256)

    def write_file(self, sha256: str, data: bytes) -> bool:
        """Make the blob file of ``sha256`` hold ``data``: written when missing, rewritten when
        damaged, and read back. Returns whether it wrote. Raises :class:`BlobError` when the
        file still does not hash to its name after writing."""
        target = self.path(sha256)
        if _holds(target, sha256):
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(target, data, self.mode)
        if not _holds(target, sha256):
            raise BlobError(sha256, f"blob file {target} does not hold its bytes after rewriting it")
        return True

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
