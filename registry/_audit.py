"""Audits over a registry, with no GPU: diff two builds, verify every blob, find stale variants.

- ``diff``: variants matched by key; added, removed and changed, where a change reports
  whether the artifact and the ``.text`` are byte-identical and the deltas of registers,
  spills, shared memory, stack and SASS instruction classes.
- ``verify``: every blob re-hashed; every variant's cubin parsed to check that its ELF arch is
  the recorded arch, its kernel symbol exists and its ``.text`` hash is the recorded one.
- ``stale``: variants whose source closure, spec contract or toolchain differs from the
  current checkout and environment, each with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from b12x_aot.compiler._arch import ARCHS
from b12x_aot.compiler._closure import source_closure
from b12x_aot.compiler._cubin import inspect_cubin
from b12x_aot.compiler._spec import Spec
from b12x_aot.compiler._toolchain import Toolchain
from b12x_aot.compiler.errors import ClosureError, ContractError

from ._queries import VariantRow
from ._schema import Artifact, Source
from ._store import RegistryStore
from .errors import BlobError

__all__ = [
    "FAIL_METRICS",
    "Change",
    "DiffReport",
    "Fault",
    "StaleVariant",
    "compare",
    "diff",
    "stale",
    "verify",
]

# --fail-on names -> how to read "worse" from a pair of rows.
FAIL_METRICS = ("registers", "spills", "smem", "local")


def _metrics(row: VariantRow) -> dict[str, int | None]:
    instructions = sum(row.opcodes.values()) if row.opcodes is not None else None
    spills = None
    if row.spill_store_bytes is not None and row.spill_load_bytes is not None:
        spills = row.spill_store_bytes + row.spill_load_bytes
    return {
        "registers": row.registers,
        "spills": spills,
        "smem": row.static_smem_bytes + row.dynamic_smem_bytes,
        "local": row.frame_bytes,
        "code_size": row.code_size,
        "instructions": instructions,
    }


@dataclass(frozen=True, slots=True)
class Change:
    key: str
    label: str
    artifact_equal: bool
    text_equal: bool
    deltas: Mapping[str, tuple[int | None, int | None]]  # metric -> (a, b), changed ones only
    class_deltas: Mapping[str, int]  # SASS class -> b - a, nonzero only
    opcode_deltas: Mapping[str, int] = field(default_factory=dict)  # SASS opcode -> b - a

    def worse(self, metrics: Iterable[str]) -> list[str]:
        out = []
        for metric in metrics:
            a, b = self.deltas.get(metric, (None, None))
            if a is not None and b is not None and b > a:
                out.append(f"{metric} {a} -> {b}")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "variant": self.label,
            "artifact_equal": self.artifact_equal,
            "text_equal": self.text_equal,
            "deltas": {k: list(v) for k, v in self.deltas.items()},
            "class_deltas": dict(self.class_deltas),
            "opcode_deltas": dict(self.opcode_deltas),
        }


@dataclass(slots=True)
class DiffReport:
    added: list[VariantRow] = field(default_factory=list)
    removed: list[VariantRow] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    identical: int = 0

    def regressions(self, metrics: Sequence[str]) -> list[tuple[Change, list[str]]]:
        return [(c, w) for c in self.changed if (w := c.worse(metrics))]

    def to_json(self) -> dict[str, Any]:
        return {
            "added": [{"key": r.key, "variant": r.label} for r in self.added],
            "removed": [{"key": r.key, "variant": r.label} for r in self.removed],
            "changed": [c.to_json() for c in self.changed],
            "identical": self.identical,
        }


def _counts_delta(a: Mapping[str, int] | None, b: Mapping[str, int] | None) -> dict[str, int]:
    if a is None or b is None:
        return {}
    return {k: d for k in sorted(set(a) | set(b)) if (d := b.get(k, 0) - a.get(k, 0))}


def compare(x: VariantRow, y: VariantRow, *, label: str | None = None) -> Change:
    """How variant ``y`` differs from ``x`` (one key across builds, or any two variants)."""
    mx, my = _metrics(x), _metrics(y)
    return Change(
        key=y.key,
        label=label or y.label,
        artifact_equal=x.artifact_sha256 == y.artifact_sha256,
        text_equal=x.text_sha256 == y.text_sha256,
        deltas={m: (mx[m], my[m]) for m in mx if mx[m] != my[m]},
        class_deltas=_counts_delta(x.classes, y.classes),
        opcode_deltas=_counts_delta(x.opcodes, y.opcodes),
    )


def diff(a: Sequence[VariantRow], b: Sequence[VariantRow]) -> DiffReport:
    """Compare two sets of variants by key."""
    left = {r.key: r for r in a}
    right = {r.key: r for r in b}
    report = DiffReport()
    report.added = [right[k] for k in sorted(right.keys() - left.keys())]
    report.removed = [left[k] for k in sorted(left.keys() - right.keys())]
    for key in sorted(left.keys() & right.keys()):
        change = compare(left[key], right[key])
        if change.artifact_equal and not change.deltas and not change.class_deltas:
            report.identical += 1
        else:
            report.changed.append(change)
    return report


@dataclass(frozen=True, slots=True)
class Fault:
    what: str  # a variant label, or an artifact sha
    key: str | None
    problem: str

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "key": self.key, "problem": self.problem}


def verify(store: RegistryStore, rows: Sequence[VariantRow]) -> tuple[int, list[Fault]]:
    """Re-hash every blob and check every variant's cubin. Returns (blobs checked, faults)."""
    faults: list[Fault] = []
    good: dict[str, bytes] = {}
    with store.read() as conn:
        shas = conn.execute(select(Artifact.sha256)).scalars().all()
        for sha in shas:
            try:
                good[sha] = store.blobs.read(conn, sha)
            except BlobError as exc:
                users = [r.label for r in rows if r.artifact_sha256 == sha]
                what = ", ".join(users) if users else f"artifact {sha[:16]}"
                faults.append(
                    Fault(what, next((r.key for r in rows if r.artifact_sha256 == sha), None), exc.problem)
                )
    for row in rows:
        data = good.get(row.artifact_sha256)
        if data is None:
            if row.artifact_sha256 not in shas:
                faults.append(Fault(row.label, row.key, f"artifact {row.artifact_sha256[:16]} is missing"))
            continue
        try:
            info = inspect_cubin(data)
            kernel = info.kernel(row.symbol)
        except ContractError as exc:
            faults.append(Fault(row.label, row.key, str(exc)))
            continue
        arch = ARCHS.get(row.arch)
        if arch is not None and info.sm != arch.sm:
            faults.append(
                Fault(row.label, row.key, f"cubin ELF is SM {info.sm}; recorded arch is {row.arch}")
            )
        if kernel.text_sha256 != row.text_sha256:
            faults.append(Fault(row.label, row.key, ".text sha256 differs from the recorded one"))
    return len(shas), faults


@dataclass(frozen=True, slots=True)
class StaleVariant:
    row: VariantRow
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.row.key, "variant": self.row.label, "reasons": list(self.reasons)}


def stale(
    store: RegistryStore,
    rows: Sequence[VariantRow],
    toolchain: Toolchain,
    specs: Sequence[Spec] = (),
) -> list[StaleVariant]:
    """Variants built from another source closure, spec contract or toolchain than now's."""
    with store.read() as conn:
        sources = {
            h: (m, f) for h, m, f in conn.execute(select(Source.hash, Source.module, Source.files_json))
        }
    import json

    now: dict[str, Any] = {}
    contracts = {(s.family, s.abi): s.contract_hash() for s in specs}
    out: list[StaleVariant] = []
    for row in rows:
        reasons: list[str] = []
        module, files_json = sources.get(row.source_hash, (None, "[]"))
        if module is not None:
            if module not in now:
                try:
                    now[module] = source_closure(module)
                except ClosureError as exc:
                    now[module] = exc
            current = now[module]
            if isinstance(current, ClosureError):
                reasons.append(f"kernel module unavailable: {current}")
            elif current.hash != row.source_hash:
                was = dict(json.loads(files_json))
                is_ = dict(current.files)
                changed = sorted(m for m in was.keys() | is_.keys() if was.get(m) != is_.get(m))
                reasons.append("source changed: " + ", ".join(changed))
        if row.toolchain_hash != toolchain.hash:
            reasons.append(f"toolchain changed (now {toolchain.describe()})")
        want = contracts.get((row.family, row.abi))
        if want is not None and want != row.spec_hash:
            reasons.append("spec contract changed")
        if reasons:
            out.append(StaleVariant(row, tuple(reasons)))
    return out
