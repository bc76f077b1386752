"""Export, garbage collection and schema migration.

- ``export``: a standalone SQLite registry (blobs inline) holding only the current variants a
  manifest matches, for baking into a serving image. A manifest entry that matches nothing is
  an error that lists every such entry.
- ``gc``: delete artifacts, blob files and provenance rows that nothing references; with keep
  manifests (or ``prune_history``), first drop the variants outside them. Keep manifests are
  checked as export checks its manifest: an entry that matches nothing (a typo) stops gc
  before it deletes anything. A blob file is an orphan only when no registry registered in
  the blob directory (copies of this one included) references it; while any of them cannot
  be read, none is pruned.
- ``migrate``: bring an older registry to this code's schema with the steps in ``_migrations``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, delete, select, update

from b12x_aot.loader import Manifest, Requirement

from ._blobs import OWNER_FILE, REGISTRIES_DIR, registration_file, registrations
from ._migrations import MIGRATIONS, migratable, parse_schema_version
from ._queries import VariantRow, artifact_shas
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
from ._store import RegistryStore, file_missing
from .errors import ManifestUnsatisfied, RegistryError, RegistryUsageError, SchemaMismatch

__all__ = ["GcReport", "export", "gc", "migrate", "require_satisfied", "unsatisfied"]

# Orphan blob files younger than this may belong to a builder about to commit their row.
_BLOB_GRACE_S = 600.0


def _contains(params: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(name in params and params[name] == value for name, value in wanted.items())


def unsatisfied(manifest: Manifest, rows: Sequence[VariantRow]) -> list[str]:
    """Each manifest entry (or exact combination) that no variant satisfies."""
    missing: list[str] = []
    for req in manifest.requirements:
        matched = [r for r in rows if req.matches(r.family, r.abi, r.arch, r.params)]
        unknown = "" if matched else req.unknown_params((r.family, r.abi, r.params) for r in rows)
        if unknown:  # a misspelt param matches nothing: say so, not only that nothing matched
            missing.append(f"{req.describe()}: {unknown}")
            continue
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


def require_satisfied(manifests: Sequence[Manifest], rows: Sequence[VariantRow], *, outcome: str) -> None:
    """Raise :class:`ManifestUnsatisfied` listing every entry of ``manifests`` that matches
    nothing; ``outcome`` says what the command therefore did not do."""
    missing = [m for manifest in manifests for m in unsatisfied(manifest, rows)]
    if missing:
        raise ManifestUnsatisfied(missing, outcome)


def _selected(manifests: Sequence[Manifest], rows: Sequence[VariantRow]) -> list[VariantRow]:
    reqs: list[Requirement] = [r for m in manifests for r in m.requirements]
    return [row for row in rows if any(q.matches(row.family, row.abi, row.arch, row.params) for q in reqs)]


def export(
    store: RegistryStore, manifest: Manifest, rows: Sequence[VariantRow], out: str | Path
) -> list[VariantRow]:
    """Write the current variants the manifest matches to a new SQLite file ``out``.

    Raises :class:`ManifestUnsatisfied` (writing nothing) when an entry matches nothing. The
    file is built beside ``out`` and renamed into place once complete, so a failed export
    leaves nothing at ``out``; it is in rollback-journal mode, so it opens read-only (the
    loader's ``mode=ro``) with no ``-wal``/``-shm`` files beside it.
    """
    require_satisfied([manifest], rows, outcome="nothing was written")
    chosen = _selected([manifest], rows)
    out = Path(out).expanduser().absolute()
    if out.exists():
        raise RegistryUsageError(f"{out} exists; export writes a new file (remove it or choose another path)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RegistryUsageError(
            f"cannot create {out.parent} for the export: {exc.strerror}; choose another path"
        ) from None
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        _write_export(store, chosen, tmp)
        try:
            os.link(tmp, out)  # fails, rather than overwrites, if OUT appeared meanwhile
        except FileExistsError:
            raise RegistryUsageError(f"{out} appeared while exporting; nothing was written there") from None
        except OSError:
            os.replace(tmp, out)  # a filesystem without hard links
    finally:
        for leftover in (tmp, *(tmp.with_name(tmp.name + s) for s in ("-wal", "-shm", "-journal"))):
            with contextlib.suppress(OSError):
                leftover.unlink()
    return chosen


def _write_export(store: RegistryStore, chosen: Sequence[VariantRow], path: Path) -> None:
    target = RegistryStore.open(path, create=True)
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
            raw.driver_connection.execute("PRAGMA journal_mode = DELETE")  # read-only opens need no -shm
            raw.driver_connection.execute("VACUUM")  # a serving image gets the smallest file
        finally:
            raw.close()
    finally:
        target.close()


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
    blob_files_kept: str | None = None  # why orphan blob files were not looked for, if they were not

    def to_json(self) -> dict[str, Any]:
        return {
            "uncurrent": self.uncurrent,
            "variants": self.variants,
            "artifacts": self.artifacts,
            "artifact_bytes": self.artifact_bytes,
            "blob_files": self.blob_files,
            "provenance": self.provenance,
            "blob_files_kept": self.blob_files_kept,
        }


def gc(
    store: RegistryStore,
    rows: Sequence[VariantRow],
    *,
    keep: Sequence[Manifest] = (),
    prune_history: bool = False,
    dry_run: bool = True,
) -> GcReport:
    """Delete what nothing references. ``keep`` first drops current variants outside it.

    Raises :class:`ManifestUnsatisfied`, deleting nothing, when a keep entry matches nothing.
    """
    require_satisfied(keep, rows, outcome="nothing was deleted")
    report = GcReport()
    with store.read() if dry_run else store.write() as conn:
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
        known = set(conn.execute(select(Artifact.sha256)).scalars()) - {sha for sha, _ in dead}
    report.blob_files, report.blob_files_kept = _prune_blob_files(store, known, dry_run)
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


def _prune_blob_files(store: RegistryStore, known: set[str], dry_run: bool) -> tuple[int, str | None]:
    """Delete (count) blob files that no registry using the directory references: the orphan
    count, and why none were looked for when some registry's references cannot be read."""
    root = store.blobs.directory
    if root is None or not root.is_dir():
        return 0, None
    elsewhere, why = _references_elsewhere(store, root)
    if why is not None:
        return 0, f"orphan blob files were not pruned: {why}"
    now = time.time()
    count = 0
    for path in store.blobs.blob_files():
        if path.name in known or path.name in elsewhere:
            continue
        if now - path.stat().st_mtime < _BLOB_GRACE_S:
            continue  # may be a builder's blob whose row is about to commit
        count += 1
        if not dry_run:
            path.unlink(missing_ok=True)
    return count, None


def _references_elsewhere(store: RegistryStore, root: Path) -> tuple[set[str], str | None]:
    """The artifacts every other registry registered in ``root`` holds, or why they are unknown."""
    registered = registrations(root)
    if store.registry_id not in registered:
        return set(), (
            f"{root} does not list {store.display} in {REGISTRIES_DIR}, so other registries may keep "
            "blobs there; give each registry its own --blob-dir"
        )
    shas: set[str] = set()
    for rid, location in sorted(registered.items()):
        if location == store.display:
            continue
        entry = registration_file(root, rid)
        entry = entry if entry.exists() else root / OWNER_FILE
        if not location or file_missing(location):
            return set(), (
                f"registry {location or '?'}, registered in {entry}, is not there. If it was deleted, "
                f"delete {entry}; if it moved, run `b12x-registry migrate -r NEW_PATH` once, which "
                "registers it where it is now"
            )
        try:
            other = RegistryStore.open(location, read_only=True, check_schema=False)
        except RegistryError as exc:
            return set(), f"registry {location}, registered in {entry}, cannot be read ({exc})"
        try:
            if other.blobs.directory == root:
                with other.read() as conn:
                    shas.update(artifact_shas(conn))
        finally:
            other.close()
    return shas, None


def migrate(store: RegistryStore, *, dry_run: bool = False) -> tuple[int, int]:
    """Upgrade to :data:`SCHEMA_VERSION`. Returns (from, to). Refuses newer registries and
    ones older than every migration here, before changing anything. ``dry_run``: only read the
    version and check that the migrations exist (open the store read-only for it)."""
    if dry_run:
        with store.read() as conn:
            return _migratable_version(conn, store.display), SCHEMA_VERSION
    with store.write() as conn:
        found = _migratable_version(conn, store.display)
        for version in range(found, SCHEMA_VERSION):
            MIGRATIONS[version](conn)
        if found != SCHEMA_VERSION:
            conn.execute(update(Meta).where(Meta.key == "schema_version").values(value=str(SCHEMA_VERSION)))
    return found, SCHEMA_VERSION


def _migratable_version(conn: Connection, display: str) -> int:
    """The registry's schema version, which the migrations here must reach from."""
    value = conn.execute(select(Meta.value).where(Meta.key == "schema_version")).scalar_one_or_none()
    found = parse_schema_version(value, display)
    if found > SCHEMA_VERSION or not migratable(found):
        raise SchemaMismatch(display, found, SCHEMA_VERSION, migratable=False)
    return found
