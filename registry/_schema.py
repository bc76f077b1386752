"""The registry schema: one declarative base, the only definition of every table.

Immutable history plus one mutable pointer per key:

- ``builds``: one row per ``b12x-compile`` run (who, when, toolchain, status).
- ``variants``: one row per compiled variant per build (key, family, abi, arch, params,
  source-closure hash, spec-contract hash, toolchain hash, artifact), never updated.
- ``kernels``: the kernel of a ``variants`` row (symbol, ABI, launch, resources, SASS).
- ``current_variants``: key -> the ``variants`` row that serves it now.
- ``failures``: variants a build could not produce, with stage, reason and log.
- ``artifacts``: content-addressed blobs (sha256 -> bytes), shared by identical cubins.
- ``toolchains``, ``sources``, ``specs``: what the hashes stand for.

Types are the ones both SQLite and PostgreSQL accept. The loader reads ``current_variants``,
``variants``, ``kernels``, ``specs``, ``artifacts`` and ``meta`` with plain SQL, so renaming
any of their columns is a schema version bump.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "Base",
    "Build",
    "CurrentVariant",
    "Failure",
    "KernelRow",
    "Meta",
    "Source",
    "SpecRow",
    "Toolchain",
    "Variant",
]

# Bump with every change to the tables below, and add a step to MIGRATIONS in _migrations.py.
# 2: kernels' JSON may hold tensor arguments, recorded parameters and lets; 3: builds.pid
SCHEMA_VERSION = 3

Sha256 = Annotated[str, mapped_column(String(64))]
Name = Annotated[str, mapped_column(String(200))]
JsonText = Annotated[str, mapped_column(Text)]
Timestamp = Annotated[datetime, mapped_column(DateTime(timezone=True))]
Count = Annotated[int, mapped_column(Integer)]

_NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=_NAMING)


class Meta(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Toolchain(Base):
    __tablename__ = "toolchains"
    hash: Mapped[Sha256] = mapped_column(primary_key=True)
    dsl_json: Mapped[JsonText]
    options: Mapped[str] = mapped_column(Text)
    created_at: Mapped[Timestamp]


class Source(Base):
    __tablename__ = "sources"
    hash: Mapped[Sha256] = mapped_column(primary_key=True)
    module: Mapped[Name]
    files_json: Mapped[JsonText]  # [[module, sha256], ...]


class SpecRow(Base):
    __tablename__ = "specs"
    hash: Mapped[Sha256] = mapped_column(primary_key=True)
    family: Mapped[Name]
    path: Mapped[str] = mapped_column(Text)
    contract_json: Mapped[JsonText]


class Build(Base):
    __tablename__ = "builds"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    started_at: Mapped[Timestamp]
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16))  # running, ok, failed, interrupted
    host: Mapped[Name]
    pid: Mapped[int | None]  # the building process on ``host``: a dead one's running build was cut off
    user: Mapped[Name]
    command: Mapped[str] = mapped_column(Text)
    shard: Mapped[str | None] = mapped_column(String(32))
    toolchain_hash: Mapped[str | None] = mapped_column(ForeignKey("toolchains.hash"))
    summary_json: Mapped[str | None] = mapped_column(Text)


class Artifact(Base):
    __tablename__ = "artifacts"
    sha256: Mapped[Sha256] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # cubin, ptx
    size: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes | None] = mapped_column(LargeBinary)  # NULL when kept in the blob directory
    created_at: Mapped[Timestamp]


class Variant(Base):
    __tablename__ = "variants"
    __table_args__ = (
        UniqueConstraint("key", "build_id"),
        Index("ix_variants_family_abi_arch", "family", "abi", "arch"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[Sha256] = mapped_column(index=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"))
    family: Mapped[Name]
    abi: Mapped[Count]
    arch: Mapped[str] = mapped_column(String(16))
    params_json: Mapped[JsonText]
    source_hash: Mapped[str] = mapped_column(ForeignKey("sources.hash"))
    spec_hash: Mapped[str] = mapped_column(ForeignKey("specs.hash"))
    toolchain_hash: Mapped[str] = mapped_column(ForeignKey("toolchains.hash"))
    artifact_sha256: Mapped[str] = mapped_column(ForeignKey("artifacts.sha256"), index=True)
    compile_seconds: Mapped[float | None]
    created_at: Mapped[Timestamp]


class KernelRow(Base):
    __tablename__ = "kernels"
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id", ondelete="CASCADE"), primary_key=True)
    symbol: Mapped[str] = mapped_column(Text)
    args_json: Mapped[JsonText]
    launch_json: Mapped[JsonText]
    param_table_json: Mapped[JsonText]  # [[ordinal, offset, size, log_align], ...] from the cubin
    param_bytes: Mapped[int | None]
    registers: Mapped[int | None]
    frame_bytes: Mapped[Count]
    min_stack_bytes: Mapped[Count]
    max_stack_bytes: Mapped[int | None]
    static_smem_bytes: Mapped[Count]
    dynamic_smem_bytes: Mapped[Count]
    max_threads: Mapped[int | None]
    const_bytes: Mapped[Count]
    text_sha256: Mapped[Sha256]
    code_size: Mapped[Count]
    ptxas_version: Mapped[str | None] = mapped_column(String(32))
    ptxas_flags: Mapped[str | None] = mapped_column(Text)
    spill_store_bytes: Mapped[int | None]  # NULL when SASS was unavailable
    spill_load_bytes: Mapped[int | None]
    sass_json: Mapped[str | None] = mapped_column(Text)  # {"opcodes": {...}, "classes": {...}}


class CurrentVariant(Base):
    __tablename__ = "current_variants"
    key: Mapped[Sha256] = mapped_column(primary_key=True)
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id"), unique=True)


class Failure(Base):
    __tablename__ = "failures"
    __table_args__ = (UniqueConstraint("key", "build_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key: Mapped[Sha256] = mapped_column(index=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"))
    family: Mapped[Name]
    abi: Mapped[Count]
    arch: Mapped[str] = mapped_column(String(16))
    params_json: Mapped[JsonText]
    kind: Mapped[str] = mapped_column(String(16))  # failed, timeout, transient, rejected
    stage: Mapped[str] = mapped_column(String(32))  # compile, contract, limits
    reason: Mapped[str] = mapped_column(Text)
    log: Mapped[str] = mapped_column(Text)
    source_hash: Mapped[Sha256]
    spec_hash: Mapped[Sha256]
    toolchain_hash: Mapped[Sha256]
    created_at: Mapped[Timestamp]
