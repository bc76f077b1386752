"""``b12x-compile``: build every variant of the given specs into a registry, with no GPU.

A single command rather than a group, so the everyday call stays ``b12x-compile specs/
--registry build/kernels.db``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections import defaultdict

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from b12x_aot.registry import RegistryError, RegistryStore

from ._arch import ARCHS
from ._build import BuildSummary, run_build
from ._executor import EXECUTOR_FORMS, executor_from
from ._plan import Plan, make_plan, parse_shard
from ._progress import BuildProgress
from ._sass import find_nvdisasm
from ._spec import load_specs
from ._toolchain import current_toolchain
from ._variants import parse_where
from .errors import CompilerError

__all__ = ["main"]


def _error(message: str) -> None:
    """Print an error unwrapped, so file:line: field prefixes stay on one line."""
    click.echo(click.style("error:", fg="red") + " " + message, err=True)


def _warn(message: str) -> None:
    click.echo(click.style("warning:", fg="yellow") + " " + message, err=True)


_DETAIL_ROWS = 40


def _plan_table(plan: Plan) -> Table:
    table = Table(title="build plan", show_lines=False)
    for col in ("family", "abi", "arch", "present", "new", "stale", "failed", "rejected"):
        table.add_column(col, justify="right" if col not in ("family", "arch") else "left")
    groups: dict[tuple[str, int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for item in plan.items:
        v = item.variant
        groups[(v.id.family, v.id.abi, v.id.arch)][item.state] += 1
    for (family, abi, arch), counts in sorted(groups.items()):
        table.add_row(
            family,
            str(abi),
            arch,
            *(str(counts[s]) for s in ("present", "new", "stale", "failed", "rejected")),
        )
    return table


def _reasons_table(plan: Plan) -> Table | None:
    """Variants that will not be served as planned, the informative ones first.

    Constraint rejections are the spec pruning its own matrix: counted in the plan table, and
    listed here only after stale, failed and limit-rejected variants.
    """
    order = {"stale": 0, "failed": 1, "rejected": 2}
    rows = sorted(
        (i for i in plan.items if i.state in order),
        key=lambda i: (order[i.state], i.stage == "constraint"),
    )
    if not rows:
        return None
    pruned = sum(1 for i in rows if i.stage == "constraint")
    shown = rows[:_DETAIL_ROWS]
    title = (
        f"not present: {len(rows)}, of which {pruned} pruned by spec constraints (first {len(shown)} shown)"
    )
    table = Table(title=title)
    for col in ("variant", "state", "stage", "reason"):
        table.add_column(col, overflow="fold")
    for item in shown:
        table.add_row(Text(item.variant.label), item.state, item.stage, Text(item.reason))
    return table


def _print_summary(console: Console, summary: BuildSummary) -> None:
    planned = summary.planned
    console.print(
        f"build {summary.build_id}: {summary.built} built, {planned['present']} already present, "
        f"{len(summary.rejected)} rejected, {len(summary.failed)} failed in {summary.seconds:.1f}s",
        highlight=False,
    )
    if summary.failed:
        table = Table(title="failed variants")
        for col in ("variant", "stage", "reason"):
            table.add_column(col, overflow="fold")
        for f in summary.failed[:_DETAIL_ROWS]:
            table.add_row(Text(f["variant"]), f["stage"], Text(f["reason"]))
        console.print(table)
        console.print("full logs: `b12x-registry failures --registry ...`; retry with --retry-failed")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("specs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--registry", "registry", required=True, help="Registry: a SQLite path or a SQLAlchemy URL.")
@click.option(
    "--arch", "archs", multiple=True, type=click.Choice(sorted(ARCHS)), help="Only these archs (repeatable)."
)
@click.option(
    "--where",
    "where",
    multiple=True,
    metavar="PARAM=VALUE",
    help="Only variants with this param value (repeatable).",
)
@click.option(
    "--executor",
    "executor_text",
    default="local",
    show_default=True,
    metavar="local|dask://HOST:PORT|dask+file://PATH",
    help=f"Where variants compile: {EXECUTOR_FORMS}. A cluster needs the [dask] extra.",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Compile processes of --executor local [default: CPU count]; a dask cluster has its workers'.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds per variant before it counts as failed.",
)
@click.option(
    "--shard", default=None, metavar="I/N", help="Build only shard I of N (partitioned by variant key)."
)
@click.option(
    "--dry-run", is_flag=True, help="Print the plan (present/new/stale/failed/rejected) and compile nothing."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--retry-failed", is_flag=True, help="Recompile variants whose last build with the same inputs failed."
)
@click.option(
    "--toolchain-policy",
    type=click.Choice(["rebuild", "keep"]),
    default="rebuild",
    show_default=True,
    help="Whether a DSL/toolchain change makes variants stale.",
)
@click.option(
    "--blob-dir",
    default=None,
    type=click.Path(),
    help="On creation: keep blobs in this directory, not the database.",
)
def main(
    specs: tuple[str, ...],
    registry: str,
    archs: tuple[str, ...],
    where: tuple[str, ...],
    executor_text: str,
    jobs: int | None,
    timeout: float,
    shard: str | None,
    dry_run: bool,
    as_json: bool,
    retry_failed: bool,
    toolchain_policy: str,
    blob_dir: str | None,
) -> None:
    """Compile every variant of SPECS (YAML files or directories) into a registry.

    Plans first (no DSL import), then compiles what is new or stale on a local process pool or
    a dask cluster (--executor), committing each variant here as it finishes. Exits 1 if any
    variant failed, 2 on bad input or a worker whose toolchain differs from this one's.
    """
    console = Console(stderr=as_json)
    try:
        executor = executor_from(executor_text, jobs=jobs)
        loaded = load_specs(specs)
        where_map = parse_where(where)
        shard_t = parse_shard(shard) if shard else None
        toolchain = current_toolchain()
        store = (
            RegistryStore.open(registry, create=not dry_run, blob_dir=blob_dir)
            if not dry_run or _exists(registry)
            else None
        )
        plan = make_plan(
            loaded,
            store,
            toolchain=toolchain,
            archs=archs or None,
            where=where_map,
            shard=shard_t,
            toolchain_policy=toolchain_policy,
            retry_failed=retry_failed,
        )
    except (CompilerError, RegistryError) as exc:
        _error(exc.format_message())
        sys.exit(exc.exit_code)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    if dry_run:
        if as_json:
            click.echo(json.dumps(plan.to_json(), indent=1))
        else:
            console.print(_plan_table(plan))
            if (reasons := _reasons_table(plan)) is not None:
                console.print(reasons)
            counts = plan.counts()
            console.print(
                f"{len(plan.to_compile())} to compile; " + ", ".join(f"{v} {k}" for k, v in counts.items())
            )
        return

    assert store is not None
    todo = len(plan.to_compile())
    if todo and find_nvdisasm() is None:
        _warn(
            "nvdisasm not found (install the [sass] extra): SASS histograms and spill counts will be "
            "recorded as unknown"
        )
    if jobs is not None and executor_text != "local":
        _warn(f"-j applies to --executor local; {executor.describe()} compiles on its workers")
    try:
        with executor:
            if todo:
                executor.check(plan)  # before the progress bar: a refusal is the only output
            with BuildProgress(todo, console) as progress:
                summary = run_build(
                    plan,
                    store,
                    executor=executor,
                    timeout=timeout,
                    command=shlex.join(["b12x-compile", *sys.argv[1:]]),
                    on_outcome=progress.update,
                )
    except CompilerError as exc:
        _error(exc.format_message())
        sys.exit(exc.exit_code)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=1))
    else:
        _print_summary(console, summary)
    sys.exit(0 if summary.ok else 1)


def _exists(registry: str) -> bool:
    return "://" in registry or os.path.exists(registry)
