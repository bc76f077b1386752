"""b12x-aot registry: the SQLAlchemy store of builds, variants, artifacts and resources.

SQLite (WAL) is the embedded default; the same models run on PostgreSQL. Build tools write
through :class:`RegistryWriter`; audits read through the query functions; serving processes
never import this package (they read SQLite with ``b12x_aot.loader``).
"""

from ._audit import FAIL_METRICS, Change, DiffReport, Fault, StaleVariant, compare, diff
from ._output import Column, Output
from ._queries import (
    BuildRow,
    FailureRow,
    FailureState,
    VariantRow,
    VariantState,
    artifact_shas,
    builds,
    current_states,
    failure_rows,
    find_variant,
    latest_failures,
    launch_records,
    lost_rows,
    provenance_of,
    source_closures,
    variant_rows,
)
from ._records import (
    FailureRecord,
    KernelResources,
    KParam,
    Provenance,
    SassHistogram,
    SourceClosure,
    Toolchain,
    VariantRecord,
)
from ._schema import SCHEMA_VERSION
from ._store import BlobStore, RegistryStore, registry_url
from ._writer import RegistryWriter
from ._yaml import BoundedLoader, YamlLimitError, read_yaml, yaml_fault
from .errors import (
    BlobDirError,
    BlobError,
    ManifestUnsatisfied,
    NoSuchVariant,
    RegistryDamaged,
    RegistryError,
    RegistryNotFound,
    RegistryUsageError,
    SchemaMismatch,
)

__all__ = [
    "FAIL_METRICS",
    "SCHEMA_VERSION",
    "BlobDirError",
    "BlobError",
    "BlobStore",
    "BoundedLoader",
    "BuildRow",
    "Change",
    "Column",
    "DiffReport",
    "FailureRecord",
    "FailureRow",
    "FailureState",
    "Fault",
    "KParam",
    "KernelResources",
    "ManifestUnsatisfied",
    "NoSuchVariant",
    "Output",
    "Provenance",
    "RegistryDamaged",
    "RegistryError",
    "RegistryNotFound",
    "RegistryStore",
    "RegistryUsageError",
    "RegistryWriter",
    "SassHistogram",
    "SchemaMismatch",
    "SourceClosure",
    "StaleVariant",
    "Toolchain",
    "VariantRecord",
    "VariantRow",
    "VariantState",
    "YamlLimitError",
    "artifact_shas",
    "builds",
    "compare",
    "current_states",
    "diff",
    "failure_rows",
    "find_variant",
    "latest_failures",
    "launch_records",
    "lost_rows",
    "provenance_of",
    "read_yaml",
    "registry_url",
    "source_closures",
    "variant_rows",
    "yaml_fault",
]
