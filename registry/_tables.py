"""Rich tables for ``b12x-registry``: how each audit looks on a terminal (``--json`` aside)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from b12x_aot.loader import params_text

from ._audit import Change, DiffReport, Fault, StaleVariant
from ._queries import FailureRow, VariantRow

__all__ = [
    "print_builds",
    "print_diff",
    "print_failures",
    "print_faults",
    "print_stale",
    "print_variant",
    "print_variants",
]

_NUMERIC = ("abi", "bytes", "regs", "spill B", "smem B", "build")


def _print_unclipped(table: Table) -> None:
    """Print ``table`` at least as wide as its unbreakable columns: piped output defaults to
    80 columns, and a clipped key or number reads as a different value."""
    console = Console()
    need = Measurement.get(console, console.options.update_width(10_000), table).minimum
    if need > console.width:
        console = Console(width=need)
    console.print(table)


def print_variants(rows: Sequence[VariantRow], title: str) -> None:
    table = Table(title=title)
    for col in ("key", "family", "abi", "arch", "params", "bytes", "regs", "spill B", "smem B", "build"):
        if col == "key" or col in _NUMERIC:
            table.add_column(col, justify="right" if col in _NUMERIC else "left", no_wrap=True)
        else:
            table.add_column(col, overflow="fold")  # these wrap, so the table fits where it can
    for r in rows:
        spills = "?" if r.spill_store_bytes is None else str(r.spill_store_bytes + (r.spill_load_bytes or 0))
        table.add_row(
            r.key[:12],
            Text(r.family),
            str(r.abi),
            r.arch,
            Text(params_text(r.params)),
            str(r.artifact_size),
            str(r.registers),
            spills,
            str(r.static_smem_bytes + r.dynamic_smem_bytes),
            str(r.build_id),
        )
    _print_unclipped(table)


def print_variant(row: VariantRow, prov: dict[str, Any]) -> None:
    """One variant's full provenance and resources, a field per line."""
    table = Table(title=f"{row.family} {params_text(row.params)} @ {row.arch}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
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
    for name, value in rows:
        table.add_row(name, Text(str(value)))
    Console().print(table)


def print_diff(
    name_a: str, name_b: str, report: DiffReport, regressions: Sequence[tuple[Change, list[str]]]
) -> None:
    """Counts, then added/removed/changed variants, then the regressions ``--fail-on`` found."""
    console = Console()
    console.print(
        f"{name_a} -> {name_b}: {len(report.added)} added, {len(report.removed)} removed, "
        f"{len(report.changed)} changed, {report.identical} identical",
        highlight=False,
    )
    for title, items in (("added", report.added), ("removed", report.removed)):
        if items:
            t = Table(title=title)
            t.add_column("key")
            t.add_column("variant", overflow="fold")
            for r in items:
                t.add_row(r.key[:12], Text(r.label))
            console.print(t)
    if report.changed:
        t = Table(title="changed")
        for col in ("variant", "artifact", ".text", "deltas (a -> b)", "SASS classes (b - a)"):
            t.add_column(col, overflow="fold")
        for c in report.changed:
            deltas = ", ".join(f"{k} {x}->{y}" for k, (x, y) in c.deltas.items())
            classes = ", ".join(f"{k} {d:+d}" for k, d in c.class_deltas.items())
            t.add_row(
                Text(c.label),
                "same" if c.artifact_equal else "differs",
                "same" if c.text_equal else "differs",
                deltas,
                classes,
            )
        console.print(t)
    for c, worse in regressions:
        console.print(f"[red]worse:[/] {c.label}: {'; '.join(worse)}", highlight=False)


def print_builds(rows: Sequence[dict[str, Any]]) -> None:
    t = Table(title="builds")
    cols = ("id", "started_at", "status", "user", "host", "shard", "command")
    for col in cols:
        t.add_column(col, overflow="fold")
    for b in rows:
        t.add_row(*(Text(str(b[c] if b[c] is not None else "")) for c in cols))
    Console().print(t)


def print_failures(rows: Sequence[FailureRow]) -> None:
    t = Table(title=f"{len(rows)} failure(s)")
    for col in ("key", "variant", "kind", "stage", "reason"):
        t.add_column(col, overflow="fold")
    for f in rows:
        t.add_row(f.key[:12], Text(f.label), f.kind, f.stage, Text(f.reason))
    Console().print(t)


def print_faults(blobs: int, variants: int, faults: Sequence[Fault]) -> None:
    console = Console()
    console.print(f"checked {blobs} blob(s) and {variants} variant(s): {len(faults)} fault(s)")
    if faults:
        t = Table(title="faults")
        t.add_column("variant", overflow="fold")
        t.add_column("key")
        t.add_column("problem", overflow="fold")
        for f in faults:
            t.add_row(Text(f.what), (f.key or "")[:12], Text(f.problem))
        console.print(t)


def print_stale(found: Sequence[StaleVariant], variants: int) -> None:
    console = Console()
    console.print(f"{len(found)} of {variants} variant(s) stale")
    if found:
        t = Table()
        t.add_column("key")
        t.add_column("variant", overflow="fold")
        t.add_column("reasons", overflow="fold")
        for s in found:
            t.add_row(s.row.key[:12], Text(s.row.label), Text("; ".join(s.reasons)))
        console.print(t)
