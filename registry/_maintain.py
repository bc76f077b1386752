"""Export, garbage collection and schema migration.

- ``export``: a standalone SQLite registry (blobs inline) holding only the current variants a
  manifest matches, for baking into a serving image. A manifest entry that matches nothing is
  an error that lists every such entry.
- ``gc``: delete artifacts, blob files and provenance rows that nothing references; with keep
  manifests (or ``prune_history``), first drop the variants outside them.
- ``migrate``: bring an older registry to this code's schema, one version step at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, delete, select, update

from b12x_aot.loader import Manifest, Requirement

from ._queries import VariantRow
from ._schema import (
    SCHEMA_VERSION,
    Artifact,
    Build,
    CurrentVariant,
    Failure,
    KernelRow,
    Meta,
    Source,
    SpecRow,
    Toolchain,
    Variant,
)
from ._store import RegistryStore
from .errors import ManifestUnsatisfied, SchemaMismatch

__all__ = ["GcReport", "export", "gc", "migrate", "unsatisfied"]

# Orphan blob files younger than this may belong to a builder about to commit their row.
_BLOB_GRACE_S = 600.0


def _contains(params: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(name in params and params[name] == value for name, value in wanted.items())


def unsatisfied(manifest: Manifest, rows: Sequence[VariantRow]) -> list[str]:
    """Each manifest entry (or exact combination) that no variant satisfies."""
    missing: list[str] = []
    for req in manifest.requirements:
        matched = [r for r in rows if req.matches(r.family, r.abi, r.arch, r.params)]
        if not req.is_exact:
            if not matched:
                missing.append(req.describe())
            continue
        archs = req.archs or sorted({r.arch for r in matched}) or [None]
        for combo in req.combinations():
            for arch in archs:
                if not any((arch is None or r.arch == arch) and _contains(r.params, combo) for r in matched):
                    shown = " ".join(f"{k}={v}" for k, v in combo.items())
                    missing.append(f"{req.family} abi={req.abi} [{arch or 'any arch'}] {shown}")
    return missing


def _selected(manifests: Sequence[Manifest], rows: Sequence[VariantRow]) -> list[VariantRow]:
    reqs: list[Requirement] = [r for m in manifests for r in m.requirements]
    return [row for row in rows if any(q.matches(row.family, row.abi, row.arch, row.params) for q in reqs)]


def export(
    store: RegistryStore, manifest: Manifest, rows: Sequence[VariantRow], out: str | Path
) -> list[VariantRow]:
    """Write the current variants the manifest matches to a new SQLite file ``out``.

    Raises :class:`ManifestUnsatisfied` (writing nothing) when an entry matches nothing.
    """
    missing = unsatisfied(manifest, rows)
    if missing:
        raise ManifestUnsatisfied(missing)
    chosen = _selected([manifest], rows)
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; export writes a new file (remove it or choose another path)")
    target = RegistryStore.open(out, create=True)
    try:
        with store.read() as src, target.write() as dst:
            ids = [r.id for r in chosen]
            variants = src.execute(select(Variant.__table__).where(Variant.id.in_(ids))).mappings().all()
            build_ids = {v["build_id"] for v in variants}
            build_tools = set(
                src.execute(select(Build.toolchain_hash).where(Build.id.in_(build_ids))).scalars()
            )
            tools = {v["toolchain_hash"] for v in variants} | (build_tools - {None})
            _copy(src, dst, Toolchain, Toolchain.hash.in_(tools))
            _copy(src, dst, Build, Build.id.in_(build_ids))
            _copy(src, dst, Source, Source.hash.in_({v["source_hash"] for v in variants}))
            _copy(src, dst, SpecRow, SpecRow.hash.in_({v["spec_hash"] for v in variants}))
            for sha in sorted({v["artifact_sha256"] for v in variants}):
                row = src.execute(select(Artifact.__table__).where(Artifact.sha256 == sha)).mappings().one()
                dst.execute(Artifact.__table__.insert().values({**row, "data": store.blobs.read(src, sha)}))
            for v in variants:
                dst.execute(Variant.__table__.insert().values(dict(v)))
            _copy(src, dst, KernelRow, KernelRow.variant_id.in_(ids))
            for r in chosen:
                dst.execute(CurrentVariant.__table__.insert().values(key=r.key, variant_id=r.id))
        raw = target.engine.raw_connection()  # VACUUM cannot run inside SQLAlchemy's transaction
        try:
            raw.driver_connection.execute("VACUUM")  # a serving image gets the smallest file
        finally:
            raw.close()
    finally:
        target.close()
    return chosen


def _copy(src: Connection, dst: Connection, model: Any, where: Any) -> None:
    rows = src.execute(select(model.__table__).where(where)).mappings().all()
    if rows:
        dst.execute(model.__table__.insert(), [dict(r) for r in rows])


@dataclass(slots=True)
class GcReport:
    uncurrent: list[str] = field(default_factory=list)  # keys dropped by keep manifests
    variants: int = 0  # variant rows deleted
    artifacts: int = 0
    artifact_bytes: int = 0
    blob_files: int = 0
    provenance: int = 0  # sources, specs and toolchains rows deleted

    def to_json(self) -> dict[str, Any]:
        return {
            "uncurrent": self.uncurrent,
            "variants": self.variants,
            "artifacts": self.artifacts,
            "artifact_bytes": self.artifact_bytes,
            "blob_files": self.blob_files,
            "provenance": self.provenance,
        }


def gc(
    store: RegistryStore,
    rows: Sequence[VariantRow],
    *,
    keep: Sequence[Manifest] = (),
    prune_history: bool = False,
    dry_run: bool = True,
) -> GcReport:
    """Delete what nothing references. ``keep`` first drops current variants outside it."""
    report = GcReport()
    with store.write() as conn:
        if keep:
            kept = {r.key for r in _selected(keep, rows)}
            report.uncurrent = sorted(r.key for r in rows if r.key not in kept)
            if not dry_run and report.uncurrent:
                conn.execute(delete(CurrentVariant).where(CurrentVariant.key.in_(report.uncurrent)))
        if keep or prune_history:
            current_ids = set(conn.execute(select(CurrentVariant.variant_id)).scalars())
            if dry_run:
                current_ids -= {r.id for r in rows if r.key in report.uncurrent}
            doomed = [i for i in conn.execute(select(Variant.id)).scalars() if i not in current_ids]
            report.variants = len(doomed)
            if not dry_run and doomed:
                conn.execute(delete(KernelRow).where(KernelRow.variant_id.in_(doomed)))
                conn.execute(delete(Variant).where(Variant.id.in_(doomed)))
        else:
            doomed = []
        live = set(conn.execute(select(Variant.artifact_sha256).where(Variant.id.not_in(doomed))).scalars())
        dead = conn.execute(select(Artifact.sha256, Artifact.size).where(Artifact.sha256.not_in(live))).all()
        report.artifacts = len(dead)
        report.artifact_bytes = sum(size for _, size in dead)
        if not dry_run and dead:
            conn.execute(delete(Artifact).where(Artifact.sha256.in_([sha for sha, _ in dead])))
        report.provenance = _prune_provenance(conn, doomed, dry_run)
        known = set(conn.execute(select(Artifact.sha256)).scalars())
    report.blob_files = _prune_blob_files(store, known, dry_run)
    return report


def _prune_provenance(conn: Connection, doomed: Sequence[int], dry_run: bool) -> int:
    alive = Variant.id.not_in(doomed)
    used: dict[Any, set[str]] = {
        Source: set(conn.execute(select(Variant.source_hash).where(alive)).scalars())
        | set(conn.execute(select(Failure.source_hash)).scalars()),
        SpecRow: set(conn.execute(select(Variant.spec_hash).where(alive)).scalars())
        | set(conn.execute(select(Failure.spec_hash)).scalars()),
        Toolchain: set(conn.execute(select(Variant.toolchain_hash).where(alive)).scalars())
        | set(conn.execute(select(Failure.toolchain_hash)).scalars())
        | set(conn.execute(select(Build.toolchain_hash)).scalars()),
    }
    count = 0
    for model, keep in used.items():
        stale = [h for h in conn.execute(select(model.hash)).scalars() if h not in keep]
        count += len(stale)
        if not dry_run and stale:
            conn.execute(delete(model).where(model.hash.in_(stale)))
    return count


def _prune_blob_files(store: RegistryStore, known: set[str], dry_run: bool) -> int:
    root = store.blobs.directory
    if root is None or not root.is_dir():
        return 0
    now = time.time()
    count = 0
    for path in root.glob("*/*"):
        if path.name.startswith(".tmp-") or path.name in known:
            continue
        if now - path.stat().st_mtime < _BLOB_GRACE_S:
            continue  # may be a builder's blob whose row is about to commit
        count += 1
        if not dry_run:
            path.unlink(missing_ok=True)
    return count


# version v -> the function that upgrades a registry from v to v + 1.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {}


def migrate(store: RegistryStore) -> tuple[int, int]:
    """Upgrade to :data:`SCHEMA_VERSION`. Returns (from, to). Refuses newer registries."""
    with store.write() as conn:
        found = int(conn.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar_one())
        if found > SCHEMA_VERSION:
            raise SchemaMismatch(store.display, found, SCHEMA_VERSION)
        version = found
        while version < SCHEMA_VERSION:
            step = MIGRATIONS.get(version)
            if step is None:
                raise SchemaMismatch(store.display, version, SCHEMA_VERSION)
            step(conn)
            version += 1
        conn.execute(update(Meta).where(Meta.key == "schema_version").values(value=str(version)))
    return found, version
