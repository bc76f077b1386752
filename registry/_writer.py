"""Writing builds, variants and failures: one short transaction per variant.

A variant lands atomically: its blob (a file first, when blobs live in a directory), the
provenance rows, the immutable ``variants`` and ``kernels`` rows and the ``current_variants``
pointer commit together or not at all. Rows are inserted with unique keys and upserts, so
concurrent builders and retries are idempotent: racing on one variant leaves one artifact row
and one current pointer, and a variant already current with the same inputs is not recorded
again.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Table, delete, select, update

from b12x_aot.compiler._closure import SourceClosure
from b12x_aot.compiler._cubin import KernelResources
from b12x_aot.compiler._sass import SassHistogram
from b12x_aot.compiler._spec import contract_hash
from b12x_aot.compiler._toolchain import Toolchain

from ._schema import (
    Artifact,
    Build,
    CurrentVariant,
    Failure,
    KernelRow,
    Source,
    SpecRow,
    Variant,
)
from ._schema import Toolchain as ToolchainRow
from ._store import RegistryStore, utcnow

__all__ = ["FailureRecord", "Provenance", "RegistryWriter", "VariantRecord"]


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Provenance:
    """What a variant was built from: source closure, spec contract and toolchain."""

    module: str
    source: SourceClosure
    spec_path: str
    spec_contract: Mapping[str, Any]
    toolchain: Toolchain

    @property
    def source_hash(self) -> str:
        return self.source.hash

    @property
    def spec_hash(self) -> str:
        return contract_hash(self.spec_contract)

    @property
    def toolchain_hash(self) -> str:
        return self.toolchain.hash


@dataclass(frozen=True, slots=True)
class VariantRecord:
    key: str
    family: str
    abi: int
    arch: str
    params: Mapping[str, Any]
    provenance: Provenance
    artifact: bytes
    args: tuple[Mapping[str, Any], ...]
    launch: Mapping[str, Any]
    dynamic_smem_bytes: int
    resources: KernelResources
    ptxas_version: str | None
    ptxas_flags: str | None
    sass: SassHistogram | None
    compile_seconds: float | None = None

    @property
    def artifact_sha256(self) -> str:
        return hashlib.sha256(self.artifact).hexdigest()


@dataclass(frozen=True, slots=True)
class FailureRecord:
    key: str
    family: str
    abi: int
    arch: str
    params: Mapping[str, Any]
    provenance: Provenance
    kind: str  # failed, timeout, rejected
    stage: str
    reason: str
    log: str = ""


def _insert_ignore(conn: Connection, table: Table, values: Mapping[str, Any]) -> None:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    conn.execute(insert(table).values(**values).on_conflict_do_nothing())


def _upsert_current(conn: Connection, key: str, variant_id: int) -> None:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    stmt = insert(CurrentVariant.__table__).values(key=key, variant_id=variant_id)
    conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"variant_id": variant_id}))


class RegistryWriter:
    """The write side of a registry, used by builds."""

    def __init__(self, store: RegistryStore) -> None:
        self.store = store

    def begin_build(self, toolchain: Toolchain, command: str, shard: str | None) -> int:
        with self.store.write() as conn:
            self._toolchain(conn, toolchain)
            result = conn.execute(
                Build.__table__.insert().values(
                    started_at=utcnow(),
                    status="running",
                    host=socket.gethostname(),
                    user=getpass.getuser(),
                    command=command,
                    shard=shard,
                    toolchain_hash=toolchain.hash,
                )
            )
            return int(result.inserted_primary_key[0])

    def finish_build(self, build_id: int, status: str, summary: Mapping[str, Any]) -> None:
        with self.store.write() as conn:
            conn.execute(
                update(Build)
                .where(Build.id == build_id)
                .values(finished_at=utcnow(), status=status, summary_json=_dumps(summary))
            )

    def _toolchain(self, conn: Connection, toolchain: Toolchain) -> None:
        _insert_ignore(
            conn,
            ToolchainRow.__table__,
            {
                "hash": toolchain.hash,
                "dsl_json": _dumps(toolchain.dsl),
                "options": toolchain.options,
                "created_at": utcnow(),
            },
        )

    def _provenance(self, conn: Connection, prov: Provenance) -> None:
        self._toolchain(conn, prov.toolchain)
        _insert_ignore(
            conn,
            Source.__table__,
            {"hash": prov.source_hash, "module": prov.module, "files_json": _dumps(prov.source.files)},
        )
        _insert_ignore(
            conn,
            SpecRow.__table__,
            {
                "hash": prov.spec_hash,
                "family": str(prov.spec_contract["family"]),
                "path": prov.spec_path,
                "contract_json": _dumps(prov.spec_contract),
            },
        )

    def _lock_key(self, conn: Connection, key: str) -> None:
        if conn.dialect.name == "postgresql":
            # SQLite's BEGIN IMMEDIATE already serialises writers; PostgreSQL needs a per-key lock.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext(%(k)s))", {"k": key})

    def record_variant(self, build_id: int, rec: VariantRecord) -> bool:
        """Record a compiled variant and make it current. False if it was already current."""
        sha = rec.artifact_sha256
        prov = rec.provenance
        if self.store.blobs.directory is not None:
            self.store.blobs.write_file(sha, rec.artifact)  # the blob before the row that names it
        with self.store.write() as conn:
            self._lock_key(conn, rec.key)
            existing = conn.execute(
                select(
                    Variant.source_hash, Variant.spec_hash, Variant.toolchain_hash, Variant.artifact_sha256
                )
                .join(CurrentVariant, CurrentVariant.variant_id == Variant.id)
                .where(CurrentVariant.key == rec.key)
            ).first()
            if existing is not None and tuple(existing) == (
                prov.source_hash,
                prov.spec_hash,
                prov.toolchain_hash,
                sha,
            ):
                return False
            self._provenance(conn, prov)
            _insert_ignore(
                conn,
                Artifact.__table__,
                {
                    "sha256": sha,
                    "kind": "cubin",
                    "size": len(rec.artifact),
                    "data": None if self.store.blobs.directory is not None else rec.artifact,
                    "created_at": utcnow(),
                },
            )
            variant_id = conn.execute(
                Variant.__table__.insert().values(
                    key=rec.key,
                    build_id=build_id,
                    family=rec.family,
                    abi=rec.abi,
                    arch=rec.arch,
                    params_json=_dumps(dict(rec.params)),
                    source_hash=prov.source_hash,
                    spec_hash=prov.spec_hash,
                    toolchain_hash=prov.toolchain_hash,
                    artifact_sha256=sha,
                    compile_seconds=rec.compile_seconds,
                    created_at=utcnow(),
                )
            ).inserted_primary_key[0]
            res = rec.resources
            conn.execute(
                KernelRow.__table__.insert().values(
                    variant_id=variant_id,
                    symbol=res.symbol,
                    args_json=_dumps(list(rec.args)),
                    launch_json=_dumps(dict(rec.launch)),
                    param_table_json=_dumps([[p.ordinal, p.offset, p.size, p.log_align] for p in res.params]),
                    param_bytes=res.param_bytes,
                    registers=res.registers,
                    frame_bytes=res.frame_bytes,
                    min_stack_bytes=res.min_stack_bytes,
                    max_stack_bytes=res.max_stack_bytes,
                    static_smem_bytes=res.static_smem_bytes,
                    dynamic_smem_bytes=rec.dynamic_smem_bytes,
                    max_threads=res.max_threads,
                    const_bytes=res.const_bytes,
                    text_sha256=res.text_sha256,
                    code_size=res.code_size,
                    ptxas_version=rec.ptxas_version,
                    ptxas_flags=rec.ptxas_flags,
                    spill_store_bytes=rec.sass.spill_store_bytes if rec.sass else None,
                    spill_load_bytes=rec.sass.spill_load_bytes if rec.sass else None,
                    sass_json=_dumps(rec.sass.to_json()) if rec.sass else None,
                )
            )
            _upsert_current(conn, rec.key, int(variant_id))
            return True

    def record_failure(self, build_id: int, rec: FailureRecord) -> None:
        """Record a failed or rejected variant. A rejection also stops serving the key: the
        spec now says this variant must not be used. A failure keeps serving the last good one.
        """
        prov = rec.provenance
        with self.store.write() as conn:
            self._provenance(conn, prov)
            if rec.kind == "rejected":
                conn.execute(delete(CurrentVariant).where(CurrentVariant.key == rec.key))
            _insert_ignore(
                conn,
                Failure.__table__,
                {
                    "key": rec.key,
                    "build_id": build_id,
                    "family": rec.family,
                    "abi": rec.abi,
                    "arch": rec.arch,
                    "params_json": _dumps(dict(rec.params)),
                    "kind": rec.kind,
                    "stage": rec.stage,
                    "reason": rec.reason,
                    "log": rec.log,
                    "source_hash": prov.source_hash,
                    "spec_hash": prov.spec_hash,
                    "toolchain_hash": prov.toolchain_hash,
                    "created_at": utcnow(),
                },
            )
