"""Read queries over a registry, shared by the planner and the audit commands.

Queries live here, not on the models. Each returns plain frozen records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, null, select

from b12x_aot.contract import VariantId

from ._blobs import BlobStore
from ._liveness import seen_status
from ._records import Provenance, SourceClosure
from ._schema import Artifact, Build, CurrentVariant, Failure, KernelRow, Source, SpecRow, Variant
from ._schema import Toolchain as ToolchainRow
from .errors import BlobError, NoSuchVariant, RegistryError

__all__ = [
    "BuildRow",
    "FailureRow",
    "FailureState",
    "VariantRow",
    "VariantState",
    "artifact_shas",
    "builds",
    "current_states",
    "failure_rows",
    "find_variant",
    "latest_failures",
    "launch_records",
    "lost_rows",
    "provenance_of",
    "source_closures",
    "variant_rows",
]


@dataclass(frozen=True, slots=True)
class VariantState:
    """The hashes of the variant row a key currently serves, and what of it is damaged."""

    key: str
    build_id: int
    source_hash: str
    spec_hash: str
    toolchain_hash: str
    damage: str = ""  # why the stored variant cannot be served as it is; empty when it can


@dataclass(frozen=True, slots=True)
class FailureState:
    """The latest failure recorded for a key."""

    key: str
    build_id: int
    kind: str
    stage: str
    reason: str
    source_hash: str
    spec_hash: str
    toolchain_hash: str

    def same_inputs(self, prov: Provenance) -> bool:
        return (self.source_hash, self.spec_hash, self.toolchain_hash) == (
            prov.source_hash,
            prov.spec_hash,
            prov.toolchain_hash,
        )

    def id_after(self, state: VariantState) -> bool:
        return self.build_id > state.build_id


def lost_rows(conn: Connection) -> dict[str, str]:
    """Current keys whose variants, kernels or artifact row is gone: key -> which row."""
    rows = conn.execute(
        select(CurrentVariant.key, Variant.id, KernelRow.variant_id, Artifact.sha256)
        .outerjoin(Variant, Variant.id == CurrentVariant.variant_id)
        .outerjoin(KernelRow, KernelRow.variant_id == Variant.id)
        .outerjoin(Artifact, Artifact.sha256 == Variant.artifact_sha256)
    )
    lost: dict[str, str] = {}
    for key, variant_id, kernel_id, sha in rows:
        if variant_id is None:
            lost[key] = "its variants row is missing"
        elif kernel_id is None:
            lost[key] = "its kernels row is missing"
        elif sha is None:
            lost[key] = "its artifact row is missing"
    return lost


def launch_records(conn: Connection) -> dict[int, tuple[str, str]]:
    """Each variant's stored argument list and launch record, as JSON text: variant id ->
    (args, launch). ``verify`` has the loader rehearse them."""
    rows = conn.execute(select(KernelRow.variant_id, KernelRow.args_json, KernelRow.launch_json))
    return {variant_id: (args, launch) for variant_id, args, launch in rows}


def current_states(conn: Connection, blobs: BlobStore | None = None) -> dict[str, VariantState]:
    """What each current key serves. A key that lost a row says so in ``damage``; with
    ``blobs``, so does one whose artifact bytes are missing or do not hash to their sha256
    (every artifact is read and hashed once)."""
    lost = lost_rows(conn)
    rows = conn.execute(
        select(
            CurrentVariant.key,
            Variant.build_id,
            Variant.source_hash,
            Variant.spec_hash,
            Variant.toolchain_hash,
            Variant.artifact_sha256,
        ).join(Variant, Variant.id == CurrentVariant.variant_id)
    )
    sound: dict[str, str] = {}  # sha -> "" or what is wrong with its bytes
    states: dict[str, VariantState] = {}
    for key, build_id, source, spec, toolchain, sha in rows:
        damage = lost.get(key, "")
        if not damage and blobs is not None:
            if sha not in sound:
                try:
                    blobs.read(conn, sha)
                    sound[sha] = ""
                except BlobError as exc:
                    sound[sha] = f"its artifact is damaged ({exc.format_message()})"
            damage = sound[sha]
        states[key] = VariantState(key, build_id, source, spec, toolchain, damage)
    return states


def _latest_failure_ids() -> Any:
    """The id of each key's latest failure row."""
    return select(func.max(Failure.id)).group_by(Failure.key).scalar_subquery()


def latest_failures(conn: Connection) -> dict[str, FailureState]:
    rows = conn.execute(
        select(
            Failure.key,
            Failure.build_id,
            Failure.kind,
            Failure.stage,
            Failure.reason,
            Failure.source_hash,
            Failure.spec_hash,
            Failure.toolchain_hash,
        ).where(Failure.id.in_(_latest_failure_ids()))
    )
    return {r[0]: FailureState(*r) for r in rows}


_IDENTITY = frozenset({*VariantId._fields, "label"})


class _Identified:
    """A query row that carries a ``variant`` identity answers for its fields as well
    (``row.key``, ``row.family``, ``row.abi``, ``row.arch``, ``row.params``, ``row.label``)."""

    __slots__ = ()
    variant: VariantId

    def __getattr__(self, name: str) -> Any:
        if name in _IDENTITY:
            return getattr(self.variant, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _json(self, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
        """The identity's fields, then the row's own (its values are already JSON types)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("variant", *exclude)}  # type: ignore[arg-type]
        return {**self.variant.to_json(), **own}


@dataclass(frozen=True, slots=True)
class FailureRow(_Identified):
    """A key's latest failed or rejected build attempt, for the audit CLI."""

    variant: VariantId
    kind: str
    stage: str
    reason: str
    build_id: int
    log: str | None

    def to_json(self) -> dict[str, Any]:
        """Everything but the log, which ``failures --log`` prints on its own."""
        return self._json(exclude=("log",))


def _key_prefix(text: str) -> str:
    """A user's key or key prefix, normalised; too short a prefix is an error."""
    prefix = text.strip().lower()
    if len(prefix) < 4:
        raise NoSuchVariant(f"key prefix {prefix!r} is too short; give at least 4 hex digits")
    return prefix


def failure_rows(conn: Connection, *, key_prefix: str | None = None) -> list[FailureRow]:
    """Every key whose latest build attempt failed, with that failure, by family then key; with
    ``key_prefix``, only the keys that start with it, and their logs (compile logs are long:
    only one key's is ever printed). A key whose current variant was built in a later build
    than its latest failure succeeded since, and is not listed."""
    served = (
        select(CurrentVariant.key, Variant.build_id)
        .join(Variant, Variant.id == CurrentVariant.variant_id)
        .subquery()
    )
    query = select(
        Failure.key,
        Failure.family,
        Failure.abi,
        Failure.arch,
        Failure.params_json,
        Failure.kind,
        Failure.stage,
        Failure.reason,
        Failure.build_id,
        Failure.log if key_prefix is not None else null(),
    ).where(
        Failure.id.in_(_latest_failure_ids()),
        (served.c.build_id.is_(None)) | (served.c.build_id <= Failure.build_id),
    )
    query = query.outerjoin(served, served.c.key == Failure.key)
    if key_prefix is not None:
        query = query.where(Failure.key.startswith(_key_prefix(key_prefix), autoescape=True))
    rows = conn.execute(query.order_by(Failure.family, Failure.key))
    return [FailureRow(VariantId(r[1], r[2], r[3], json.loads(r[4]), r[0]), *r[5:]) for r in rows]


@dataclass(frozen=True, slots=True)
class VariantRow(_Identified):
    """A variant with its kernel's resources, as the audit commands show it."""

    variant: VariantId
    id: int
    build_id: int
    source_hash: str
    spec_hash: str
    toolchain_hash: str
    artifact_sha256: str
    artifact_size: int | None
    symbol: str
    registers: int | None
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    frame_bytes: int
    static_smem_bytes: int
    dynamic_smem_bytes: int
    max_threads: int | None
    text_sha256: str
    code_size: int
    ptxas_version: str | None
    classes: Mapping[str, int] | None
    opcodes: Mapping[str, int] | None

    def to_json(self) -> dict[str, Any]:
        return self._json()


def _variant_query() -> Any:
    return (
        select(
            Variant.id,
            Variant.key,
            Variant.build_id,
            Variant.family,
            Variant.abi,
            Variant.arch,
            Variant.params_json,
            Variant.source_hash,
            Variant.spec_hash,
            Variant.toolchain_hash,
            Variant.artifact_sha256,
            Artifact.size,
            KernelRow.symbol,
            KernelRow.registers,
            KernelRow.spill_store_bytes,
            KernelRow.spill_load_bytes,
            KernelRow.frame_bytes,
            KernelRow.static_smem_bytes,
            KernelRow.dynamic_smem_bytes,
            KernelRow.max_threads,
            KernelRow.text_sha256,
            KernelRow.code_size,
            KernelRow.ptxas_version,
            KernelRow.sass_json,
        )
        .join(KernelRow, KernelRow.variant_id == Variant.id)
        .join(Artifact, Artifact.sha256 == Variant.artifact_sha256, isouter=True)
    )


def _row(r: Any) -> VariantRow:
    sass = json.loads(r.sass_json) if r.sass_json else None
    return VariantRow(
        variant=VariantId(r.family, r.abi, r.arch, json.loads(r.params_json), r.key),
        id=r.id,
        build_id=r.build_id,
        source_hash=r.source_hash,
        spec_hash=r.spec_hash,
        toolchain_hash=r.toolchain_hash,
        artifact_sha256=r.artifact_sha256,
        artifact_size=r.size,
        symbol=r.symbol,
        registers=r.registers,
        spill_store_bytes=r.spill_store_bytes,
        spill_load_bytes=r.spill_load_bytes,
        frame_bytes=r.frame_bytes,
        static_smem_bytes=r.static_smem_bytes,
        dynamic_smem_bytes=r.dynamic_smem_bytes,
        max_threads=r.max_threads,
        text_sha256=r.text_sha256,
        code_size=r.code_size,
        ptxas_version=r.ptxas_version,
        classes=sass["classes"] if sass else None,
        opcodes=sass["opcodes"] if sass else None,
    )


def variant_rows(conn: Connection, *, as_of_build: int | None = None) -> list[VariantRow]:
    """The registry's variants: current ones, or as they stood after build ``as_of_build``.

    "As of build B" is, for each key, its newest variant row built in a build ``<= B``.
    """
    if as_of_build is None:
        query = _variant_query().join(CurrentVariant, CurrentVariant.variant_id == Variant.id)
    else:
        newest = (
            select(func.max(Variant.id))
            .where(Variant.build_id <= as_of_build)
            .group_by(Variant.key)
            .scalar_subquery()
        )
        query = _variant_query().where(Variant.id.in_(newest))
    return [_row(r) for r in conn.execute(query.order_by(Variant.family, Variant.arch, Variant.key))]


def find_variant(conn: Connection, key_or_prefix: str) -> VariantRow:
    """The current variant whose key is, or starts with, ``key_or_prefix``."""
    prefix = _key_prefix(key_or_prefix)
    query = (
        _variant_query()
        .join(CurrentVariant, CurrentVariant.variant_id == Variant.id)
        .where(CurrentVariant.key.startswith(prefix, autoescape=True))
        .limit(6)
    )
    rows = [_row(r) for r in conn.execute(query)]
    if not rows:
        raise NoSuchVariant(f"no current variant has a key starting with {prefix!r}; try `b12x-registry ls`")
    if len(rows) > 1:
        shown = ", ".join(r.key[:16] for r in rows[:5])
        raise NoSuchVariant(f"key prefix {prefix!r} is ambiguous ({shown}…); give more digits")
    return rows[0]


def provenance_of(conn: Connection, row: VariantRow) -> dict[str, Any]:
    """Spec, source closure, toolchain and build behind a variant row."""
    spec = conn.execute(
        select(SpecRow.path, SpecRow.contract_json).where(SpecRow.hash == row.spec_hash)
    ).first()
    source = conn.execute(
        select(Source.module, Source.files_json).where(Source.hash == row.source_hash)
    ).first()
    tool = conn.execute(
        select(ToolchainRow.dsl_json, ToolchainRow.options).where(ToolchainRow.hash == row.toolchain_hash)
    ).first()
    build = conn.execute(
        select(
            Build.id, Build.started_at, Build.finished_at, Build.status, Build.host, Build.user, Build.command
        ).where(Build.id == row.build_id)
    ).first()
    kernel = conn.execute(
        select(
            KernelRow.args_json,
            KernelRow.launch_json,
            KernelRow.param_table_json,
            KernelRow.param_bytes,
            KernelRow.min_stack_bytes,
            KernelRow.max_stack_bytes,
            KernelRow.const_bytes,
            KernelRow.ptxas_flags,
        ).where(KernelRow.variant_id == row.id)
    ).one()
    return {
        "spec": {
            "hash": row.spec_hash,
            "path": spec.path if spec else None,
            "contract": json.loads(spec.contract_json) if spec else None,
        },
        "source": {
            "hash": row.source_hash,
            "module": source.module if source else None,
            "files": json.loads(source.files_json) if source else None,
        },
        "toolchain": {
            "hash": row.toolchain_hash,
            "dsl": dict(json.loads(tool.dsl_json)) if tool else None,
            "options": tool.options if tool else None,
        },
        "build": dict(build._mapping) if build else None,
        "kernel": {
            "args": json.loads(kernel.args_json),
            "launch": json.loads(kernel.launch_json),
            "param_table": json.loads(kernel.param_table_json),
            "param_bytes": kernel.param_bytes,
            "min_stack_bytes": kernel.min_stack_bytes,
            "max_stack_bytes": kernel.max_stack_bytes,
            "const_bytes": kernel.const_bytes,
            "ptxas_flags": kernel.ptxas_flags,
        },
    }


def artifact_shas(conn: Connection) -> list[str]:
    """The sha256 of every stored artifact."""
    return list(conn.execute(select(Artifact.sha256)).scalars())


def source_closures(conn: Connection) -> dict[str, tuple[str, SourceClosure]]:
    """Every recorded source closure: its hash -> (kernel module, the closure's files)."""
    rows = conn.execute(select(Source.hash, Source.module, Source.files_json))
    return {h: (m, SourceClosure(tuple(tuple(f) for f in json.loads(files)))) for h, m, files in rows}


@dataclass(frozen=True, slots=True)
class BuildRow:
    """One build, with the summary it recorded when it finished (None while running)."""

    id: int
    started_at: datetime
    finished_at: datetime | None
    status: str
    host: str
    user: str
    shard: str | None
    command: str
    summary: dict[str, Any] | None

    def counts_text(self) -> str:
        """The build's counts as its own summary line gave them; empty until it finishes."""
        s = self.summary
        if not s:
            return ""
        rejected, failed = s.get("rejected", 0), s.get("failed", [])
        return (
            f"{s.get('built', 0)} built, {s.get('unchanged', 0)} unchanged, "
            f"{s.get('planned', {}).get('present', 0)} already present, "
            f"{rejected if isinstance(rejected, int) else len(rejected)} rejected, "
            f"{failed if isinstance(failed, int) else len(failed)} failed"
        )

    def to_json(self) -> dict[str, Any]:
        """The row as nested JSON: the summary an object, never a JSON string inside a string."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        for when in ("started_at", "finished_at"):
            data[when] = data[when].isoformat() if data[when] is not None else None
        return data


def builds(conn: Connection) -> list[BuildRow]:
    """Every build, oldest first. A running build of this host whose process is gone shows
    as ``interrupted`` (:func:`seen_status`)."""
    cols = ("id", "started_at", "finished_at", "status", "host", "user", "shard", "command", "summary_json")
    rows = conn.execute(select(*(getattr(Build, c) for c in cols), Build.pid).order_by(Build.id))
    out = []
    for *head, summary_json, pid in rows:
        head[3] = seen_status(head[3], head[4], pid, head[1])
        try:
            summary = json.loads(summary_json) if summary_json else None
        except ValueError:
            raise RegistryError(
                f"build {head[0]}'s recorded summary is not JSON (got {summary_json[:40]!r}); the "
                "registry is damaged: run b12x-registry verify"
            ) from None
        out.append(BuildRow(*head, summary))
    return out
