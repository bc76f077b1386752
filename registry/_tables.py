"""How each ``b12x-registry`` audit looks without ``--json``: tables through :class:`Output`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from b12x_aot.contract import params_text

from ._audit import Change, DiffReport, Fault, StaleVariant
from ._output import Column, Output
from ._queries import BuildRow, FailureRow, VariantRow

__all__ = [
    "print_builds",
    "print_diff",
    "print_failures",
    "print_faults",
    "print_stale",
    "print_variant",
    "print_variants",
]

_KEY = Column("key", width=12)  # whole when piped, so a row's key is its key


def print_variants(rows: Sequence[VariantRow], title: str) -> None:
    columns = (
        _KEY,
        Column("family"),
        Column("abi", numeric=True),
        Column("arch"),
        Column("params", fold=True),
        *(Column(name, numeric=True) for name in ("bytes", "regs", "spill B", "smem B", "build")),
    )
    lines = []
    for r in rows:
        spills = "?" if r.spill_store_bytes is None else r.spill_store_bytes + (r.spill_load_bytes or 0)
        smem = r.static_smem_bytes + r.dynamic_smem_bytes
        lines.append(
            (
                r.key,
                r.family,
                r.abi,
                r.arch,
                params_text(r.params),
                r.artifact_size,
                r.registers,
                spills,
                smem,
                r.build_id,
            )
        )
    Output().table(title, columns, lines)


def print_variant(row: VariantRow, prov: dict[str, Any]) -> None:
    """One variant's full provenance and resources, a field per line."""
    rows: list[tuple[str, Any]] = [
        ("key", row.key),
        ("abi", row.abi),
        ("artifact", f"{row.artifact_sha256} ({row.artifact_size} B)"),
        ("symbol", row.symbol),
        ("spec", f"{prov['spec']['path']} (contract {row.spec_hash[:16]})"),
        ("source", f"{prov['source']['module']} (closure {row.source_hash[:16]})"),
        *[(f"  {m}", h) for m, h in prov["source"]["files"] or []],
        ("toolchain", ", ".join(f"{k}=={v}" for k, v in (prov["toolchain"]["dsl"] or {}).items())),
        ("compile options", prov["toolchain"]["options"]),
        ("ptxas", f"{row.ptxas_version} {prov['kernel']['ptxas_flags'] or ''}"),
        (
            "build",
            f"{prov['build']['id']} by {prov['build']['user']}@{prov['build']['host']} "
            f"at {prov['build']['started_at']} ({prov['build']['status']})"
            if prov["build"]
            else "?",
        ),
        ("registers", row.registers),
        ("spills (store/load B)", f"{row.spill_store_bytes}/{row.spill_load_bytes}"),
        ("stack frame B", row.frame_bytes),
        ("smem static/dynamic B", f"{row.static_smem_bytes}/{row.dynamic_smem_bytes}"),
        ("max threads", row.max_threads),
        (".text", f"{row.text_sha256} ({row.code_size} B)"),
        ("param table", prov["kernel"]["param_table"]),
        (
            "args",
            ", ".join(
                f"{a['name']}:{a['kind']}" + (f"<{a['dtype']}>/{a['align']}" if a["kind"] == "ptr" else "")
                for a in prov["kernel"]["args"]
            ),
        ),
        ("launch", prov["kernel"]["launch"]),
        ("SASS classes", row.classes if row.classes is not None else "unknown (no nvdisasm at build)"),
    ]
    title = f"{row.family} {params_text(row.params)} @ {row.arch}"
    Output().table(title, (Column("field"), Column("value", fold=True)), rows, header=False)


def print_diff(
    name_a: str, name_b: str, report: DiffReport, regressions: Sequence[tuple[Change, list[str]]]
) -> None:
    """Counts, then added/removed/changed variants, then the regressions ``--fail-on`` found."""
    out = Output()
    out.note(
        f"{name_a} -> {name_b}: {len(report.added)} added, {len(report.removed)} removed, "
        f"{len(report.changed)} changed, {report.identical} identical"
    )
    for title, items in (("added", report.added), ("removed", report.removed)):
        if items:
            out.table(
                title, (_KEY, Column("variant", fold=True)), [(r.key, r.label) for r in items], tag=title
            )
    if report.changed:
        columns = (
            _KEY,
            Column("variant", fold=True),
            Column("artifact"),
            Column(".text"),
            Column("deltas (a -> b)", fold=True),
            Column("SASS classes (b - a)", fold=True),
        )
        rows = [
            (
                c.key,
                c.label,
                "same" if c.artifact_equal else "differs",
                "same" if c.text_equal else "differs",
                ", ".join(f"{k} {x}->{y}" for k, (x, y) in c.deltas.items()),
                ", ".join(f"{k} {d:+d}" for k, d in c.class_deltas.items()),
            )
            for c in report.changed
        ]
        out.table("changed", columns, rows, tag="changed")
    for c, worse in regressions:
        out.line(f"worse: {c.label}: {'; '.join(worse)}")


def print_builds(rows: Sequence[BuildRow]) -> None:
    columns = (
        Column("id", numeric=True),
        Column("started_at"),
        Column("status"),
        Column("user"),
        Column("host"),
        Column("shard"),
        Column("counts", fold=True),
        Column("command", fold=True),
    )
    lines = [
        (b.id, b.started_at.isoformat(), b.status, b.user, b.host, b.shard, b.counts_text(), b.command)
        for b in rows
    ]
    Output().table("builds", columns, lines)


def print_failures(rows: Sequence[FailureRow]) -> None:
    columns = (
        _KEY,
        Column("variant", fold=True),
        Column("kind"),
        Column("stage"),
        Column("reason", fold=True),
    )
    lines = [(f.key, f.label, f.kind, f.stage, f.reason) for f in rows]
    Output().table(f"{len(rows)} failure(s)", columns, lines)


def print_faults(blobs: int, variants: int, faults: Sequence[Fault]) -> None:
    out = Output()
    out.note(f"checked {blobs} blob(s) and {variants} variant(s): {len(faults)} fault(s)")
    if faults:
        columns = (Column("variant", fold=True), _KEY, Column("problem", fold=True))
        out.table("faults", columns, [(f.what, f.key or "", f.problem) for f in faults])


def print_stale(found: Sequence[StaleVariant], variants: int) -> None:
    out = Output()
    out.note(f"{len(found)} of {variants} variant(s) stale")
    if found:
        columns = (_KEY, Column("variant", fold=True), Column("reasons", fold=True))
        out.table("stale", columns, [(s.row.key, s.row.label, "; ".join(s.reasons)) for s in found])
