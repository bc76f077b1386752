"""Schema migration steps, and whether a registry's version has a path to this code's.

The store asks :func:`migratable` before it advises ``b12x-registry migrate``, so a registry
older than every step here is told to be rebuilt instead of sent round in a loop.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection

from ._schema import SCHEMA_VERSION
from .errors import RegistryNotFound

__all__ = ["MIGRATIONS", "migratable", "parse_schema_version"]


def _to_2(conn: Connection) -> None:
    """Schema 2 adds no column: a kernel's args and launch JSON may now hold tensor arguments,
    the parameter words a host function derives and ``let`` bindings, which a loader reading
    only schema 1 would misread; the version says which loaders may read the file."""


# version v -> the function that upgrades a registry from v to v + 1.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {1: _to_2}


def migratable(version: int) -> bool:
    """Whether a chain of steps leads from ``version`` to :data:`SCHEMA_VERSION`."""
    return version <= SCHEMA_VERSION and all(v in MIGRATIONS for v in range(version, SCHEMA_VERSION))


def parse_schema_version(value: str | None, registry: str) -> int:
    """The integer in a ``schema_version`` meta row; a missing or garbled one is not ours."""
    if value is None:
        raise RegistryNotFound(
            f"{registry} is not a b12x-aot registry (its meta table has no schema_version); "
            "build one with b12x-compile"
        )
    try:
        return int(value)
    except ValueError:
        raise RegistryNotFound(
            f"{registry} is not a b12x-aot registry (schema_version {value!r} is not an integer); "
            "build one with b12x-compile"
        ) from None
