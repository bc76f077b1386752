"""The audits that need the build side: ``verify`` re-reads every cubin, ``stale`` re-hashes
source closures. They read the registry through its queries and report with its records.

- ``verify``: SQLite's ``PRAGMA quick_check`` over every page; every current key's variants,
  kernels and artifact rows present; every blob re-hashed; every variant's cubin parsed to
  check that its ELF arch is the recorded arch, its kernel symbol exists and its ``.text``
  hash is the recorded one; every variant's stored arguments and launch record rehearsed by
  the loader as it would prepare the launch (a tampered expression is a fault here).
- ``stale``: variants whose source closure, spec contract or toolchain differs from the
  current checkout and environment, each with its reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from b12x_aot.contract import B12xError
from b12x_aot.loader import IndexEntry, rehearse
from b12x_aot.registry import (
    BlobError,
    Fault,
    RegistryDamaged,
    RegistryStore,
    SourceClosure,
    StaleVariant,
    Toolchain,
    VariantRow,
    artifact_shas,
    launch_records,
    lost_rows,
    source_closures,
)

from ._arch import ARCHS
from ._closure import source_closure
from ._cubin import inspect_cubin
from ._spec import Spec
from .errors import ClosureError, ContractError

__all__ = ["stale", "verify"]


def verify(store: RegistryStore, rows: Sequence[VariantRow]) -> tuple[int, list[Fault]]:
    """SQLite's quick_check, every current key's rows, every blob re-hashed and every variant's
    cubin checked. Returns (blobs checked, faults); a page too damaged to read is a fault."""
    faults: list[Fault] = []
    good: dict[str, bytes] = {}
    shas: list[str] = []
    launches: Mapping[int, tuple[str, str]] = {}
    try:
        faults.extend(
            Fault(store.display, None, "quick_check: " + " ".join(line.split()))
            for line in store.integrity_faults()
        )
        with store.read() as conn:
            faults.extend(Fault(key[:16], key, problem) for key, problem in sorted(lost_rows(conn).items()))
            shas = artifact_shas(conn)
            launches = launch_records(conn)
            for sha in shas:
                try:
                    good[sha] = store.blobs.read(conn, sha)
                except BlobError as exc:
                    users = [r for r in rows if r.artifact_sha256 == sha]
                    what = ", ".join(r.label for r in users) if users else f"artifact {sha[:16]}"
                    faults.append(Fault(what, users[0].key if users else None, exc.problem))
    except RegistryDamaged as exc:
        return len(shas), [*faults, Fault(store.display, None, exc.format_message())]
    for row in rows:
        problem = _launch_problem(row, launches.get(row.id))
        if problem is not None:
            faults.append(Fault(row.label, row.key, problem))
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


def _launch_problem(row: VariantRow, recorded: tuple[str, str] | None) -> str | None:
    """What preparing ``row``'s launch from its stored record would raise, if anything."""
    if recorded is None:
        return None  # a lost kernels row is reported by lost_rows
    args, launch = recorded
    entry = IndexEntry.of(row.variant, row.artifact_sha256, row.symbol, args, launch)
    try:
        rehearse(entry)
    except B12xError as exc:  # the loader's refusal, or the contract's (a malformed expression)
        return f"stored launch record: {exc}; rebuild the variant with b12x-compile"
    except (ValueError, TypeError, KeyError, IndexError) as exc:  # a record not in the loader's shape
        return f"stored launch record is malformed ({type(exc).__name__}: {exc}); rebuild the variant with b12x-compile"
    return None


def stale(
    store: RegistryStore,
    rows: Sequence[VariantRow],
    toolchain: Toolchain,
    specs: Sequence[Spec] = (),
) -> list[StaleVariant]:
    """Variants built from another source closure, spec contract or toolchain than now's."""
    with store.read() as conn:
        recorded = source_closures(conn)
    now: dict[str, SourceClosure | ClosureError] = {}
    contracts = {(s.family, s.abi): s.contract_hash() for s in specs}
    out: list[StaleVariant] = []
    for row in rows:
        reasons: list[str] = []
        was = recorded.get(row.source_hash)
        if was is not None:
            module, closure = was
            if module not in now:
                try:
                    now[module] = source_closure(module)
                except ClosureError as exc:
                    now[module] = exc
            current = now[module]
            if isinstance(current, ClosureError):
                reasons.append(f"kernel module unavailable: {current}")
            elif current.hash != row.source_hash:
                before, after = dict(closure.files), dict(current.files)
                changed = sorted(m for m in before.keys() | after.keys() if before.get(m) != after.get(m))
                reasons.append("source changed: " + ", ".join(changed))
        if row.toolchain_hash != toolchain.hash:
            reasons.append(f"toolchain changed (now {toolchain.describe()})")
        want = contracts.get((row.family, row.abi))
        if want is not None and want != row.spec_hash:
            reasons.append("spec contract changed")
        if reasons:
            out.append(StaleVariant(row, tuple(reasons)))
    return out
