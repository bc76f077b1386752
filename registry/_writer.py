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
import os
import socket
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Table, delete, select, update

from b12x_aot.contract import canonical_json

from ._liveness import INTERRUPTED, seen_status
from ._records import FailureRecord, Provenance, Toolchain, VariantRecord
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

__all__ = ["RegistryWriter"]


def _insert(conn: Connection, table: Table, values: Mapping[str, Any]) -> Any:
    """The dialect's INSERT (both SQLite and PostgreSQL have ON CONFLICT)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table).values(**values)


def _insert_ignore(conn: Connection, table: Table, values: Mapping[str, Any]) -> None:
    conn.execute(_insert(conn, table, values).on_conflict_do_nothing())


def _hashes_to(data: bytes | None, sha: str) -> bool:
    return data is not None and hashlib.sha256(data).hexdigest() == sha


def _upsert_current(conn: Connection, key: str, variant_id: int) -> None:
    stmt = _insert(conn, CurrentVariant.__table__, {"key": key, "variant_id": variant_id})
    conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"variant_id": variant_id}))


class RegistryWriter:
    """The write side of a registry, used by builds."""

    def __init__(self, store: RegistryStore) -> None:
        self.store = store

    def begin_build(self, toolchain: Toolchain, command: str, shard: str | None) -> int:
        """Record a running build of this process. Running builds of this host whose process
        died are recorded as interrupted first."""
        host = socket.gethostname()
        with self.store.write() as conn:
            running = conn.execute(
                select(Build.id, Build.pid, Build.started_at).where(
                    Build.status == "running", Build.host == host
                )
            ).all()
            dead = [i for i, pid, since in running if seen_status("running", host, pid, since) == INTERRUPTED]
            if dead:
                conn.execute(update(Build).where(Build.id.in_(dead)).values(status=INTERRUPTED))
            self._toolchain(conn, toolchain)
            result = conn.execute(
                Build.__table__.insert().values(
                    started_at=utcnow(),
                    status="running",
                    host=host,
                    pid=os.getpid(),
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
                .values(finished_at=utcnow(), status=status, summary_json=canonical_json(summary))
            )

    def _toolchain(self, conn: Connection, toolchain: Toolchain) -> None:
        _insert_ignore(
            conn,
            ToolchainRow.__table__,
            {
                "hash": toolchain.hash,
                "dsl_json": canonical_json(toolchain.dsl),
                "options": toolchain.options,
                "created_at": utcnow(),
            },
        )

    def _provenance(self, conn: Connection, prov: Provenance) -> None:
        self._toolchain(conn, prov.toolchain)
        _insert_ignore(
            conn,
            Source.__table__,
            {
                "hash": prov.source_hash,
                "module": prov.module,
                "files_json": canonical_json(prov.source.files),
            },
        )
        _insert_ignore(
            conn,
            SpecRow.__table__,
            {
                "hash": prov.spec_hash,
                "family": str(prov.spec_contract["family"]),
                "path": prov.spec_path,
                "contract_json": canonical_json(prov.spec_contract),
            },
        )

    def _lock_key(self, conn: Connection, key: str) -> None:
        if conn.dialect.name == "postgresql":
            # SQLite's BEGIN IMMEDIATE already serialises writers; PostgreSQL needs a per-key lock.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext(%(k)s))", {"k": key})

    def record_variant(self, build_id: int, rec: VariantRecord) -> bool:
        """Record a compiled variant and make it current. False if it was already current, whole.

        A stored artifact that is missing or damaged (a blob file or inline bytes that do not
        hash to their sha256) is rewritten with these bytes and read back; a current variant
        that lost its kernels row is recorded again. Either counts as recorded (True).
        """
        sha = rec.artifact_sha256
        prov = rec.provenance
        repaired = False
        if self.store.blobs.directory is not None:
            # The blob before the row that names it.
            repaired = self.store.blobs.write_file(sha, rec.artifact)
        with self.store.write() as conn:
            self._lock_key(conn, rec.variant.key)
            self._provenance(conn, prov)
            repaired = self._artifact(conn, sha, rec.artifact) or repaired
            existing = conn.execute(
                select(
                    Variant.source_hash, Variant.spec_hash, Variant.toolchain_hash, Variant.artifact_sha256
                )
                .join(CurrentVariant, CurrentVariant.variant_id == Variant.id)
                .join(KernelRow, KernelRow.variant_id == Variant.id)
                .where(CurrentVariant.key == rec.variant.key)
            ).first()
            same = (prov.source_hash, prov.spec_hash, prov.toolchain_hash, sha)
            if existing is not None and tuple(existing) == same:
                return repaired
            v = rec.variant
            variant_id = conn.execute(
                Variant.__table__.insert().values(
                    key=v.key,
                    build_id=build_id,
                    family=v.family,
                    abi=v.abi,
                    arch=v.arch,
                    params_json=canonical_json(dict(v.params)),
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
                    args_json=canonical_json(list(rec.args)),
                    launch_json=canonical_json(dict(rec.launch)),
                    param_table_json=canonical_json(
                        [[p.ordinal, p.offset, p.size, p.log_align] for p in res.params]
                    ),
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
                    sass_json=canonical_json(rec.sass.to_json()) if rec.sass else None,
                )
            )
            _upsert_current(conn, v.key, int(variant_id))
            return True

    def _artifact(self, conn: Connection, sha: str, data: bytes) -> bool:
        """Store artifact ``sha``'s row (and its bytes, when the database keeps them); rewrite
        bytes that do not hash to ``sha``, then read them back. Returns whether it rewrote."""
        inline = self.store.blobs.directory is None
        row = conn.execute(select(Artifact.data, Artifact.size).where(Artifact.sha256 == sha)).first()
        if row is None:
            _insert_ignore(
                conn,
                Artifact.__table__,
                {
                    "sha256": sha,
                    "kind": "cubin",
                    "size": len(data),
                    "data": data if inline else None,
                    "created_at": utcnow(),
                },
            )
            return False
        if row.size == len(data) and (not inline or _hashes_to(row.data, sha)):
            return False
        conn.execute(
            update(Artifact)
            .where(Artifact.sha256 == sha)
            .values(size=len(data), data=data if inline else None)
        )
        self.store.blobs.read(conn, sha)  # raises BlobError unless the rewrite holds
        return True

    def record_failure(self, build_id: int, rec: FailureRecord) -> None:
        """Record a failed or rejected variant. A rejection also stops serving the key: the
        spec now says this variant must not be used. A failure keeps serving the last good one.
        """
        prov, v = rec.provenance, rec.variant
        with self.store.write() as conn:
            self._provenance(conn, prov)
            if rec.kind == "rejected":
                conn.execute(delete(CurrentVariant).where(CurrentVariant.key == v.key))
            _insert_ignore(
                conn,
                Failure.__table__,
                {
                    "key": v.key,
                    "build_id": build_id,
                    "family": v.family,
                    "abi": v.abi,
                    "arch": v.arch,
                    "params_json": canonical_json(dict(v.params)),
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
