"""Schema migration steps, and whether a registry's version has a path to this code's.

The store asks :func:`migratable` before it advises ``b12x-registry migrate``, so a registry
older than every step here is told to be rebuilt instead of sent round in a loop.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection

from b12x_aot.loader import RegistryFormatError, schema_version_of

from ._schema import SCHEMA_VERSION
from .errors import RegistryNotFound

__all__ = ["MIGRATIONS", "migratable", "parse_schema_version"]


def _to_2(conn: Connection) -> None:
    """Schema 2 adds no column: a kernel's args and launch JSON may now hold tensor arguments,
    the parameter words a host function derives and ``let`` bindings, which a loader reading
    only schema 1 would misread; the version says which loaders may read the file."""


def _to_3(conn: Connection) -> None:
    """Schema 3 records the building process's pid, so a build whose process died is shown as
    interrupted rather than running."""
    conn.exec_driver_sql("ALTER TABLE builds ADD COLUMN pid INTEGER")


# version v -> the function that upgrades a registry from v to v + 1.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _to_2, 2: _to_3}


def migratable(version: int) -> bool:
    """Whether a chain of steps leads from ``version`` to :data:`SCHEMA_VERSION`."""
    return version <= SCHEMA_VERSION and all(v in MIGRATIONS for v in range(version, SCHEMA_VERSION))


def parse_schema_version(value: str | None, registry: str) -> int:
    """The integer in a ``schema_version`` meta row; a missing or garbled one is not ours. The
    loader's check, so both say the same thing and the same fix."""
    try:
        return schema_version_of(value, registry)
    except RegistryFormatError as exc:
        raise RegistryNotFound(exc.format_message()) from None
