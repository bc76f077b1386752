"""``b12x-compile``: build every variant of the given specs into a registry, with no GPU.

A single command rather than a group, so the everyday call stays ``b12x-compile specs/
--registry build/kernels.db``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from functools import wraps
from typing import Any, NoReturn

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from b12x_aot.registry import Column, Output, RegistryError, RegistryStore, registry_url

from ._arch import ARCHS
from ._build import BuildSummary, run_build
from ._executors import EXECUTOR_FORMS, executor_from
from ._plan import Plan, PlanRequest
from ._progress import BuildProgress
from ._spec import load_specs
from ._status import STATES, State
from .errors import CompilerError

__all__ = ["main"]


def _error(message: str) -> None:
    """Print an error unwrapped, so file:line: field prefixes stay on one line."""
    click.echo(click.style("error:", fg="red") + " " + message, err=True)


def _warn(message: str) -> None:
    click.echo(click.style("warning:", fg="yellow") + " " + message, err=True)


_DETAIL_ROWS = 40  # rows of a detail table on a terminal; piped output has every row
_PLAN_STATES = (*STATES, "pruned")


def _print_plan_table(out: Output, plan: Plan) -> None:
    groups: dict[tuple[str, int, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for item in plan.items:
        v = item.variant
        groups[(v.id.family, v.id.abi, v.id.arch)][item.state] += 1
    for p in plan.pruned:
        groups[(p.family, p.abi, p.arch)]["pruned"] += p.count
    columns = (
        Column("family"),
        Column("abi", numeric=True),
        Column("arch"),
        *(Column(state, numeric=True) for state in _PLAN_STATES),
    )
    rows = [(f, abi, arch, *(c[s] for s in _PLAN_STATES)) for (f, abi, arch), c in sorted(groups.items())]
    out.table("build plan", columns, rows)


def _print_reasons(out: Output, plan: Plan) -> None:
    """Variants that will not be served as planned: stale, failed, then rejected ones. (The
    combinations the spec's constraints prune are counted in the plan table, by constraint in
    ``--json``.)"""
    order = {State.STALE: 0, State.FAILED: 1, State.REJECTED: 2}
    items = sorted((i for i in plan.items if i.state in order), key=lambda i: order[i.state])
    if items:
        columns = (
            Column("variant", fold=True),
            Column("state"),
            Column("stage"),
            Column("reason", fold=True),
        )
        rows = [(i.variant.label, i.state, i.stage, i.reason) for i in items]
        out.table(f"not present: {len(items)}", columns, rows, limit=_DETAIL_ROWS)


def _print_summary(out: Output, summary: BuildSummary) -> None:
    out.line(f"build {summary.build_id}: {summary.tally().text()} in {summary.seconds:.1f}s")
    if summary.failed:
        columns = (Column("variant", fold=True), Column("stage"), Column("reason", fold=True))
        rows = [(f["variant"], f["stage"], f["reason"]) for f in summary.failed]
        out.table("failed variants", columns, rows, limit=_DETAIL_ROWS)
        out.note("full logs: `b12x-registry failures --registry ...`; retry with --retry-failed")


EXIT_STORE = 3  # the registry or the filesystem failed: neither the variants' fault nor bad input


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so every cleanup runs (children, scratch, build row).
    Not an Exception: no ``except Exception`` on the way may swallow it."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def _on_sigterm(handler: Any) -> Any:
    """Install ``handler`` for SIGTERM; the previous one. Only the main thread may install one."""
    if threading.current_thread() is not threading.main_thread() or handler is None:
        return None
    return signal.signal(signal.SIGTERM, handler)


def _fail(message: str, code: int, as_json: bool) -> NoReturn:
    """End the command: the message on stderr and, with --json, as JSON on stdout."""
    _error(message)
    if as_json:
        click.echo(json.dumps({"ok": False, "error": message, "exit_code": code}, indent=1))
    sys.exit(code)


def _store_failure(exc: BaseException, registry: str) -> str:
    """One line for an OSError or a SQLAlchemy error that stopped the command."""
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        reason = f"{exc.strerror or exc}{where}"
    else:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    return (
        f"{type(exc).__name__} with registry {registry}: {reason}. What was recorded stays; fix the "
        "cause (space, permissions, database connection) and rerun the same command to resume"
    )


def _stoppable(command: Callable[..., None]) -> Callable[..., None]:
    """Run ``command`` with SIGTERM raising :class:`_Terminated`, so every cleanup runs (children,
    scratch, build row), and end Ctrl-C and SIGTERM with one line and exit 130 / 143."""

    @wraps(command)
    def run(*args: Any, **options: Any) -> None:
        as_json = bool(options.get("as_json"))
        previous = _on_sigterm(_terminate)
        try:
            command(*args, **options)
        except KeyboardInterrupt:
            _fail(
                "interrupted (Ctrl-C); what was recorded stays, rerun the same command to resume",
                130,
                as_json,
            )
        except _Terminated:
            _fail(
                "terminated (SIGTERM); what was recorded stays, rerun the same command to resume",
                143,
                as_json,
            )
        finally:
            _on_sigterm(previous)

    return run


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
    help="Only variants with this param value (repeatable, one value per param).",
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
    help="Seconds per variant; past it the variant is recorded as timeout, which the next build retries.",
)
@click.option(
    "--shard", default=None, metavar="I/N", help="Build only shard I of N (partitioned by variant key)."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (present/new/stale/failed/rejected, and the combinations spec constraints pruned) and compile nothing.",
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
@_stoppable
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
    a dask cluster (--executor), committing each variant here as it finishes.

    \b
    Exit codes:
      0  every planned variant is built or rejected by its spec's limits
      1  a variant failed (see `b12x-registry failures`; retry with --retry-failed)
      2  bad input, or a worker whose toolchain differs from this one's
      3  the registry or the filesystem failed mid-build (disk full, permissions, a lost
         database connection); what was recorded stays, rerun the same command to resume
      130, 143  stopped by Ctrl-C or SIGTERM; rerun the same command to resume
    """
    out = Output(stderr=as_json)
    store: RegistryStore | None = None
    try:
        executor = executor_from(executor_text, jobs=jobs)
        loaded = load_specs(specs)
        request = PlanRequest.read(
            loaded,
            archs=archs,
            where=where,
            shard=shard,
            toolchain_policy=toolchain_policy,
            retry_failed=retry_failed,
            warn=_warn,
        )
        store = _open_registry(registry, blob_dir, dry_run)
        plan = request.plan(store)
        if dry_run:
            _print_plan(out, plan, as_json)
            return
        if jobs is not None and executor_text != "local":
            _warn(f"-j applies to --executor local; {executor.describe()} compiles on its workers")
        assert store is not None  # only a dry run plans without one
        with executor:
            summary = run_build(
                plan,
                store,
                executor=executor,
                timeout=timeout,
                command=shlex.join(["b12x-compile", *sys.argv[1:]]),
                progress=lambda total: BuildProgress(total, out),
                warn=_warn,
            )
    except CompilerError as exc:
        _fail(exc.format_message(), exc.exit_code, as_json)
    except RegistryError as exc:
        # Exit 1 means "variants failed"; a registry error without a code of its own is not that.
        _fail(exc.format_message(), exc.exit_code if exc.exit_code != 1 else EXIT_STORE, as_json)
    except (OSError, SQLAlchemyError) as exc:
        _fail(_store_failure(exc, registry), EXIT_STORE, as_json)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        if store is not None:
            store.close()
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=1))
    else:
        _print_summary(out, summary)
    sys.exit(0 if summary.ok else 1)


def _print_plan(out: Output, plan: Plan, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(plan.to_json(), indent=1))
        return
    _print_plan_table(out, plan)
    _print_reasons(out, plan)
    if plan.pruned and not plan.items and plan.shard is None:  # say which constraints took it all
        columns = (
            Column("family"),
            Column("arch"),
            Column("combinations", numeric=True),
            Column("constraint", fold=True),
        )
        rows = [(p.family, p.arch, p.count, p.reason) for p in plan.pruned]
        out.table("every combination was pruned by a spec constraint", columns, rows, limit=_DETAIL_ROWS)
    counts = plan.counts()
    out.note(f"{len(plan.to_compile())} to compile; " + ", ".join(f"{v} {k}" for k, v in counts.items()))


def _open_registry(registry: str, blob_dir: str | None, dry_run: bool) -> RegistryStore | None:
    """The registry to plan against and build into, made where it is missing. A dry run writes
    nothing, not even the WAL switch that a read-write open makes: it reads the registry, where
    one exists (None where none does)."""
    if not dry_run:
        return RegistryStore.open(registry, create=True, blob_dir=blob_dir)
    if _exists(registry):
        return RegistryStore.open(registry, read_only=True, blob_dir=blob_dir)
    return None


def _exists(registry: str) -> bool:
    """Whether ``registry`` names a database to read: a server URL, or a SQLite file that exists,
    resolved as :meth:`RegistryStore.open` resolves it (``~``, ``sqlite:///`` URLs)."""
    url = make_url(registry_url(registry))
    return url.get_backend_name() != "sqlite" or os.path.exists(url.database or "")
