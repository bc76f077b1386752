"""Audits over a registry's rows, with no GPU: diff two builds or variants, and the records of
the audits that need the build side (``verify`` re-reads cubins and ``stale`` re-hashes source
closures, so those two live in the compiler and report through :class:`Fault` and
:class:`StaleVariant`).

``diff`` matches variants by key: added, removed and changed, where a change reports whether
the artifact and the ``.text`` are byte-identical and the deltas of registers, spills, shared
memory, stack and SASS instruction classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ._queries import VariantRow

__all__ = [
    "FAIL_METRICS",
    "Change",
    "DiffReport",
    "Fault",
    "StaleVariant",
    "compare",
    "diff",
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
    """Something ``verify`` found wrong with a stored variant or blob."""

    what: str  # a variant label, or an artifact sha
    key: str | None
    problem: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class StaleVariant:
    """A stored variant built from other inputs than the checkout's, and which ones changed."""

    row: VariantRow
    reasons: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.row.key, "variant": self.row.label, "reasons": list(self.reasons)}
