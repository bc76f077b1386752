"""``b12x-registry``: audit a registry from the registry alone, with no GPU.

Every command prints a rich table by default and JSON with ``--json``, and exits non-zero on
failure: 1 when the audit found faults or regressions, 2 on bad input.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import wraps
from pathlib import Path
from typing import Any

import click
import yaml
from sqlalchemy.exc import SQLAlchemyError

from b12x_aot.loader import Manifest, ManifestError

from ._audit import FAIL_METRICS, DiffReport, compare, diff
from ._maintain import export, gc, migrate
from ._output import Output
from ._queries import VariantRow, builds, failure_rows, find_variant, provenance_of, variant_rows
from ._store import RegistryStore
from ._tables import (
    print_builds,
    print_diff,
    print_failures,
    print_faults,
    print_stale,
    print_variant,
    print_variants,
)
from ._yaml import BoundedLoader, read_yaml, yaml_fault
from .errors import NoSuchVariant, RegistryDamaged, RegistryError

__all__ = ["main"]


def _error(message: str) -> None:
    """Print an error unwrapped, so file:line: field prefixes stay on one line."""
    click.echo(click.style("error:", fg="red") + " " + message, err=True)


_registry_option = click.option(
    "--registry", "-r", required=True, help="Registry: a SQLite path or a SQLAlchemy URL."
)
_json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=1, default=_default))


def _fails(fn: Callable[..., None]) -> Callable[..., None]:
    """Map registry and manifest errors to a message and an exit code."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except RegistryError as exc:
            _error(exc.format_message())
            sys.exit(exc.exit_code)
        except (ManifestError, FileExistsError) as exc:
            _error(str(exc))
            sys.exit(2)
        except SQLAlchemyError as exc:
            # The store names damage itself (RegistryDamaged); what is left is the database
            # refusing the read (gone, busy, no permission), not "faults found" (exit 1).
            _error(f"cannot read the registry: {getattr(exc, 'orig', None) or exc}")
            sys.exit(2)

    return wrapper


def _open(registry: str) -> RegistryStore:
    """Open for an audit: read-only, so read-only files and mounts work and nothing changes."""
    return RegistryStore.open(registry, read_only=True)


def _check_filters(
    rows: Sequence[VariantRow], family: str | None, arch: str | None, wanted: Mapping[str, str]
) -> None:
    """Refuse a family, arch or param name the registry does not have: a typo would otherwise
    list nothing and look like an answer."""
    families = sorted({r.family for r in rows})
    if family is not None and family not in families:
        raise click.UsageError(
            f"no family {family!r} in this registry (families: {', '.join(families) or 'none'})"
        )
    scope = [r for r in rows if family is None or r.family == family]
    archs = sorted({r.arch for r in scope})
    if arch is not None and arch not in archs:
        raise click.UsageError(f"no arch {arch!r} among these variants (archs: {', '.join(archs) or 'none'})")
    names = sorted({name for r in scope for name in r.params})
    unknown = [name for name in wanted if name not in names]
    if unknown:
        raise click.UsageError(
            f"no param named {', '.join(unknown)} among these variants (params: {', '.join(names) or 'none'})"
        )


def _manifest(path: str) -> Manifest:
    try:
        data = yaml.load(read_yaml(Path(path)), Loader=BoundedLoader)
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        line, reason = yaml_fault(exc)
        raise ManifestError(f"manifest {path}{f':{line}' if line else ''}: {reason}") from None
    try:
        return Manifest.from_mapping(data)
    except ManifestError as exc:
        raise ManifestError(f"manifest {path}: {exc}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Query and maintain a b12x-aot kernel registry."""


@main.command("ls")
@_registry_option
@click.option("--family", help="Only this family.")
@click.option("--arch", help="Only this arch.")
@click.option("--abi", type=int, help="Only this ABI version.")
@click.argument("filters", nargs=-1, metavar="[PARAM=VALUE]...")
@_json_option
@_fails
def ls_(
    registry: str,
    family: str | None,
    arch: str | None,
    abi: int | None,
    filters: Sequence[str],
    as_json: bool,
) -> None:
    """List current variants with size, registers, spills and shared memory."""
    wanted: dict[str, str] = {}
    for item in filters:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.UsageError(f"filters are PARAM=VALUE (got {item!r})")
        wanted[name] = value
    store = _open(registry)
    with store.read() as conn:
        rows = variant_rows(conn)
    _check_filters(rows, family, arch, wanted)
    rows = [
        r
        for r in rows
        if (family is None or r.family == family)
        and (arch is None or r.arch == arch)
        and (abi is None or r.abi == abi)
        and all(str(r.params.get(k)) == v for k, v in wanted.items())
    ]
    if as_json:
        _emit_json([r.to_json() for r in rows])
        return
    print_variants(rows, f"{len(rows)} variant(s) in {store.display}")


@main.command()
@_registry_option
@click.argument("key")
@_json_option
@_fails
def show(registry: str, key: str, as_json: bool) -> None:
    """Full provenance of the variant whose key is, or starts with, KEY."""
    store = _open(registry)
    with store.read() as conn:
        row = find_variant(conn, key)
        prov = provenance_of(conn, row)
    data = {"variant": row.to_json(), **prov}
    if as_json:
        _emit_json(data)
        return
    print_variant(row, prov)


_KEYLIKE = re.compile(r"(build:)?[0-9]+|[0-9a-fA-F]+")


def _side(spec: str, registry: str | None) -> tuple[str, list[VariantRow], bool]:
    """A diff operand: a build id (``N`` or ``build:N``) or a variant key prefix in
    --registry, or a registry path/URL.

    Returns its name, its variants, and whether it named a single variant.
    """
    # Build ids and key prefixes are digits and hex; anything else names a registry, and one
    # that is not there is reported as missing, not as a bad key.
    is_location = "://" in spec or Path(spec).exists() or not _KEYLIKE.fullmatch(spec)
    if is_location:
        store = _open(spec)
        with store.read() as conn:
            return store.display, variant_rows(conn), False
    build_text = spec.removeprefix("build:")
    if registry is None:
        what = "a build id" if build_text.isdigit() else "a variant key"
        raise click.UsageError(f"{spec!r} is not a registry; as {what} it needs --registry to say where")
    store = _open(registry)
    with store.read() as conn:
        known = sorted(b.id for b in builds(conn))
        if spec.startswith("build:"):
            if not build_text.isdigit() or int(build_text) not in known:
                raise click.UsageError(f"{spec} is not a build of {store.display} (builds: {known})")
            return f"build {build_text}", variant_rows(conn, as_of_build=int(build_text)), False
        is_build = spec.isdigit() and int(spec) in known
        try:
            row: VariantRow | None = find_variant(conn, spec)
        except NoSuchVariant:
            if not is_build:
                if spec.isdigit():
                    raise click.UsageError(
                        f"{spec!r} is neither a build of {store.display} (builds: {known}) nor the "
                        "start of a current variant's key"
                    ) from None
                raise
            row = None
        if is_build and row is not None:
            raise click.UsageError(
                f"{spec!r} is both build {spec} and the start of variant key {row.key[:16]}; write "
                f"build:{spec} for the build, or more key digits for the variant"
            )
        if row is None:
            return f"build {spec}", variant_rows(conn, as_of_build=int(spec)), False
    return f"variant {row.key[:12]}", [row], True


@main.command("diff")
@click.argument("a")
@click.argument("b")
@click.option(
    "--registry", "-r", default=None, help="The registry holding builds A and B (when they are build ids)."
)
@click.option(
    "--fail-on",
    default="",
    metavar="METRICS",
    help=f"Exit 1 if a shared variant got worse in any of: {','.join(FAIL_METRICS)}.",
)
@_json_option
@_fails
def diff_(a: str, b: str, registry: str | None, fail_on: str, as_json: bool) -> None:
    """Compare two registries (paths/URLs), two builds of one registry (ids, with --registry), or
    two variants of one registry (key prefixes, with --registry)."""
    metrics = [m.strip() for m in fail_on.split(",") if m.strip()]
    bad = [m for m in metrics if m not in FAIL_METRICS]
    if bad:
        raise click.UsageError(f"--fail-on takes {','.join(FAIL_METRICS)} (got {','.join(bad)})")
    name_a, rows_a, single_a = _side(a, registry)
    name_b, rows_b, single_b = _side(b, registry)
    if single_a != single_b:
        raise click.UsageError("compare a variant with a variant, or a registry/build with a registry/build")
    if single_a:
        report = DiffReport(
            changed=[compare(rows_a[0], rows_b[0], label=f"{rows_a[0].label} -> {rows_b[0].label}")]
        )
    else:
        report = diff(rows_a, rows_b)
    regressions = report.regressions(metrics)
    if as_json:
        _emit_json(
            {
                "a": name_a,
                "b": name_b,
                **report.to_json(),
                "regressions": [{"key": c.key, "variant": c.label, "worse": w} for c, w in regressions],
            }
        )
    else:
        print_diff(name_a, name_b, report, regressions)
    if regressions:
        sys.exit(1)


@main.command("verify")
@_registry_option
@_json_option
@_fails
def verify_(registry: str, as_json: bool) -> None:
    """Re-hash every blob; check each cubin's ELF arch, kernel symbol and .text hash, the
    database's pages and rows, and that every stored launch record prepares."""
    from b12x_aot.compiler import verify  # cubin inspection lives with the build side

    store = _open(registry)
    try:
        with store.read() as conn:
            rows = variant_rows(conn)
    except RegistryDamaged:
        rows = []  # verify reports the damage as a fault, and exits 1
    checked, faults = verify(store, rows)
    if as_json:
        _emit_json({"blobs": checked, "variants": len(rows), "faults": [f.to_json() for f in faults]})
    else:
        print_faults(checked, len(rows), faults)
    if faults:
        sys.exit(1)


@main.command("stale")
@_registry_option
@click.option(
    "--specs",
    "spec_paths",
    multiple=True,
    type=click.Path(exists=True),
    help="Also compare spec contracts (files or dirs).",
)
@_json_option
@_fails
def stale_(registry: str, spec_paths: Sequence[str], as_json: bool) -> None:
    """Variants whose source closure, toolchain (or spec) differs from this checkout."""
    from b12x_aot.compiler import CompilerError, current_toolchain, load_specs, stale

    try:
        specs = load_specs(spec_paths) if spec_paths else []
        toolchain = current_toolchain()
    except CompilerError as exc:
        _error(exc.format_message())
        sys.exit(2)
    store = _open(registry)
    with store.read() as conn:
        rows = variant_rows(conn)
    found = stale(store, rows, toolchain, specs)
    if as_json:
        _emit_json({"variants": len(rows), "stale": [s.to_json() for s in found]})
        return
    print_stale(found, len(rows))


@main.command("gc")
@_registry_option
@click.option(
    "--keep",
    "keep",
    multiple=True,
    type=click.Path(exists=True),
    help="Keep only variants these manifests match (repeatable).",
)
@click.option(
    "--prune-history", is_flag=True, help="Also delete variant rows of earlier builds that nothing serves."
)
@click.option("--dry-run", is_flag=True, help="Report what would be deleted; delete nothing.")
@_json_option
@_fails
def gc_(registry: str, keep: Sequence[str], prune_history: bool, dry_run: bool, as_json: bool) -> None:
    """Delete blobs and rows that no variant references (run with --dry-run first).

    A --keep entry that matches nothing stops gc before it deletes anything. A blob file is
    pruned only when no registry listed in the blob directory's .b12x-registries (this one and
    its copies) references it, and none is while one of them cannot be read.
    """
    manifests = [_manifest(p) for p in keep]
    store = RegistryStore.open(registry, read_only=dry_run)  # gc writes, unless it only reports
    with store.read() as conn:
        rows = variant_rows(conn)
    report = gc(store, rows, keep=manifests, prune_history=prune_history, dry_run=dry_run)
    if as_json:
        _emit_json({"dry_run": dry_run, **report.to_json()})
        return
    if report.blob_files_kept:
        click.echo(f"note: {report.blob_files_kept}", err=True)
    verb = "would delete" if dry_run else "deleted"
    Output().line(
        f"{verb}: {len(report.uncurrent)} variant(s) outside the keep manifests, {report.variants} variant row(s), "
        f"{report.artifacts} artifact(s) ({report.artifact_bytes} B), {report.blob_files} orphan blob file(s), "
        f"{report.provenance} provenance row(s)"
    )


@main.command("export")
@_registry_option
@click.option(
    "--manifest",
    "manifest_path",
    required=True,
    type=click.Path(exists=True),
    help="YAML manifest of needed variants.",
)
@click.argument("out", type=click.Path())
@_json_option
@_fails
def export_(registry: str, manifest_path: str, out: str, as_json: bool) -> None:
    """Write a standalone SQLite registry OUT with just the manifest's variants."""
    manifest = _manifest(manifest_path)
    store = _open(registry)
    with store.read() as conn:
        rows = variant_rows(conn)
    chosen = export(store, manifest, rows, out)
    if as_json:
        _emit_json({"out": out, "variants": [r.key for r in chosen]})
    else:
        Output().line(f"exported {len(chosen)} variant(s) to {out}")


@main.command("migrate")
@_registry_option
@click.option("--dry-run", is_flag=True, help="Only say what would change; opens the registry read-only.")
@_json_option
@_fails
def migrate_(registry: str, dry_run: bool, as_json: bool) -> None:
    """Upgrade a registry to this code's schema version."""
    store = RegistryStore.open(registry, check_schema=False, read_only=dry_run)
    before, after = migrate(store, dry_run=dry_run)
    changes = before != after
    if as_json:
        _emit_json(
            {"registry": store.display, "from": before, "to": after, "migrated": changes and not dry_run}
            | ({"dry_run": True, "would_migrate": changes} if dry_run else {})
        )
        return
    if not changes:
        Output().line(f"already at schema {after}")
    else:
        Output().line(f"schema {before} -> {after}" + (" (dry run: nothing written)" if dry_run else ""))


@main.command("builds")
@_registry_option
@_json_option
@_fails
def builds_(registry: str, as_json: bool) -> None:
    """List builds: when, who, status, counts, command (--json: each build's summary as an object)."""
    store = _open(registry)
    with store.read() as conn:
        rows = builds(conn)
    if as_json:
        _emit_json([b.to_json() for b in rows])
        return
    print_builds(rows)


@main.command("failures")
@_registry_option
@click.option(
    "--log", "log_key", default=None, metavar="KEY", help="Print the full log of this key's latest failure."
)
@_json_option
@_fails
def failures_(registry: str, log_key: str | None, as_json: bool) -> None:
    """Variants whose latest build failed or rejected them (at planning or after compiling), with
    the reason: the failed and rejected variants a build's summary counts."""
    store = _open(registry)
    with store.read() as conn:
        rows = failure_rows(conn, key_prefix=log_key or None)
    if log_key:
        if len(rows) != 1:
            raise click.UsageError(f"--log {log_key!r} matches {len(rows)} failures")
        if as_json:
            _emit_json({**rows[0].to_json(), "log": rows[0].log or ""})
            return
        click.echo(rows[0].log or rows[0].reason)
        return
    if as_json:
        _emit_json([f.to_json() for f in rows])
        return
    print_failures(rows)
