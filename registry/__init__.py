"""b12x-aot registry: the SQLAlchemy store of builds, variants, artifacts and resources.

SQLite (WAL) is the embedded default; the same models run on PostgreSQL. Build tools write
through :class:`RegistryWriter`; audits read through the query functions; serving processes
never import this package (they read SQLite with ``b12x_aot.loader``).
"""

from ._queries import (
    FailureState,
    VariantRow,
    VariantState,
    builds,
    current_states,
    find_variant,
    latest_failures,
    provenance_of,
    variant_rows,
)
from ._schema import SCHEMA_VERSION
from ._store import BlobStore, RegistryStore, registry_url
from ._writer import FailureRecord, Provenance, RegistryWriter, VariantRecord
from .errors import (
    BlobError,
    ManifestUnsatisfied,
    NoSuchVariant,
    RegistryError,
    RegistryNotFound,
    SchemaMismatch,
)

__all__ = [
    "SCHEMA_VERSION",
    "BlobError",
    "BlobStore",
    "FailureRecord",
    "FailureState",
    "ManifestUnsatisfied",
    "NoSuchVariant",
    "Provenance",
    "RegistryError",
    "RegistryNotFound",
    "RegistryStore",
    "RegistryWriter",
    "SchemaMismatch",
    "VariantRecord",
    "VariantRow",
    "VariantState",
    "builds",
    "current_states",
    "find_variant",
    "latest_failures",
    "provenance_of",
    "registry_url",
    "variant_rows",
]
