"""The build plan: every variant classified before anything compiles, without the DSL.

States: ``present`` (current, built from the same source closure, spec contract and, under
the ``rebuild`` toolchain policy, the same toolchain), ``stale`` (current, but one of those
changed: the reason says which), ``new`` (never built), ``failed`` (its last build with these
same inputs failed; retried only with ``--retry-failed``) and ``rejected`` (by the planner
checks, or by the spec's register/spill bounds on an earlier compile of these same inputs).
Combinations the spec's constraints prune are not variants: the plan counts them per arch and
constraint (:class:`~._variants.Pruned`).
A ``timeout`` or ``transient`` failure is not a verdict on the inputs: the variant plans as new
or stale again.

A build asks for its plan with a :class:`PlanRequest`, read from its options (an --arch that no
spec lists is refused there); the plan then holds what it must before anything compiles: each
kernel entry matches its spec and, where a spec's limits need SASS, every process that will
compile its jobs has nvdisasm (:meth:`Plan.check_nvdisasm`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from b12x_aot.registry import (
    FailureState,
    Provenance,
    RegistryStore,
    Toolchain,
    VariantState,
    current_states,
    latest_failures,
)

from ._closure import source_closure
from ._probe import check_entries
from ._sass import sass_refusal
from ._spec import Spec
from ._status import STATES, State, Status
from ._toolchain import Fingerprint, current_toolchain, ptxas_release
from ._variants import Pruned, Variant, expand, parse_where

__all__ = ["Plan", "PlanItem", "PlanRequest", "in_shard", "make_plan", "parse_shard"]


@dataclass(frozen=True, slots=True)
class PlanItem:
    variant: Variant
    state: State
    reason: str = ""
    stage: str = ""
    recorded: bool = False  # the registry holds this failure or rejection for these inputs

    def to_json(self) -> dict[str, Any]:
        return {**self.variant.id.to_json(), "state": self.state, "stage": self.stage, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Plan:
    items: tuple[PlanItem, ...]
    toolchain: Toolchain
    provenance: Mapping[tuple[str, int], Provenance]
    shard: tuple[int, int] | None
    pruned: tuple[Pruned, ...] = ()  # the whole matrix's, in every shard

    def counts(self) -> dict[str, int]:
        """Variants per state, and the combinations pruned."""
        found = Counter(item.state for item in self.items)
        return {
            **{state.value: found.get(state, 0) for state in STATES},
            "pruned": sum(p.count for p in self.pruned),
        }

    def to_compile(self) -> list[PlanItem]:
        return [item for item in self.items if item.state in (State.NEW, State.STALE)]

    def needs_sass(self) -> list[str]:
        """The specs (paths, sorted) of the variants to compile whose limits need nvdisasm's SASS
        histogram to be decided (:attr:`Limits.needs_sass`)."""
        return sorted(
            {str(i.variant.spec.path) for i in self.to_compile() if i.variant.spec.limits.needs_sass}
        )

    def check_nvdisasm(self, missing: Sequence[str]) -> str | None:
        """What a missing nvdisasm means for this plan, where ``missing`` names the processes that
        may compile its jobs and have none ("this machine", "worker tcp://..."). Raises the
        :func:`sass_refusal` when a spec's limits need the SASS histogram to be decided; else
        returns the warning to show, or None when nothing is missing."""
        if not missing:
            return None
        if needing := self.needs_sass():
            raise sass_refusal(needing, missing)
        return (
            f"nvdisasm not found on {', '.join(missing)} (install nvidia-cuda-nvdisasm, the [sass] "
            "extra): SASS histograms and spill counts will be recorded as unknown"
        )

    def provenance_of(self, variant: Variant) -> Provenance:
        return self.provenance[(variant.spec.family, variant.spec.abi)]

    def fingerprint(self) -> Fingerprint:
        """What a process must share with this one to compile the new and stale variants: the
        plan's toolchain and closures, and this environment's ptxas release (read once)."""
        closures = {}
        for item in self.to_compile():
            prov = self.provenance_of(item.variant)
            closures[prov.module] = prov.source
        return Fingerprint.of(self.toolchain, ptxas_release(self.toolchain), closures)

    def to_json(self) -> dict[str, Any]:
        return {
            "toolchain": {"dsl": dict(self.toolchain.dsl), "options": self.toolchain.options},
            "shard": f"{self.shard[0]}/{self.shard[1]}" if self.shard else None,
            "counts": self.counts(),
            "variants": [item.to_json() for item in self.items],
            "pruned": [p.to_json() for p in self.pruned],
        }


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What a build asks to plan: the specs, this environment's toolchain and the selection
    (:func:`make_plan`'s arguments). Read from the options before the registry is opened, so a
    selection that cannot hold never makes one; :meth:`plan` then reads the registry."""

    specs: tuple[Spec, ...]
    toolchain: Toolchain
    archs: tuple[str, ...] | None = None
    where: Mapping[str, str] = field(default_factory=dict)
    shard: tuple[int, int] | None = None
    toolchain_policy: str = "rebuild"
    retry_failed: bool = False

    @classmethod
    def read(
        cls,
        specs: Sequence[Spec],
        *,
        archs: Sequence[str] = (),
        where: Sequence[str] = (),
        shard: str | None = None,
        toolchain_policy: str = "rebuild",
        retry_failed: bool = False,
        warn: Callable[[str], None],
    ) -> PlanRequest:
        """The request to plan ``specs`` with the selection as ``b12x-compile`` spells it
        (``--arch``, ``--where PARAM=VALUE``, ``--shard I/N``), in this environment. Raises
        ``ValueError`` for a selection that cannot hold (--arch values that no spec lists, a
        malformed --where or --shard); ``warn`` hears of the --arch values that no spec lists
        beside some that one does."""
        _check_archs(archs, specs, warn)
        where_map = parse_where(where)
        shard_t = parse_shard(shard) if shard is not None else None
        return cls(
            tuple(specs),
            current_toolchain(),
            tuple(archs) or None,
            where_map,
            shard_t,
            toolchain_policy,
            retry_failed,
        )

    def plan(self, store: RegistryStore | None) -> Plan:
        """The plan of this request against ``store`` (None: a registry that holds nothing yet),
        once the kernel entry of every spec with variants to compile matches the spec
        (:func:`check_entries`: a fault raises :class:`SpecError`, once for its spec)."""
        plan = make_plan(
            self.specs,
            store,
            toolchain=self.toolchain,
            archs=self.archs,
            where=self.where,
            shard=self.shard,
            toolchain_policy=self.toolchain_policy,
            retry_failed=self.retry_failed,
        )
        compiling = {id(i.variant.spec): i.variant.spec for i in plan.to_compile()}
        check_entries(list(compiling.values()))
        return plan


def _check_archs(archs: Sequence[str], specs: Sequence[Spec], warn: Callable[[str], None]) -> None:
    """Refuse --arch values that select nothing: a build that compiles nothing must not pass."""
    if not archs:
        return
    listed = sorted({arch for spec in specs for arch in spec.archs})
    unlisted = [arch for arch in archs if arch not in listed]
    if len(unlisted) == len(archs):
        raise ValueError(
            f"no spec lists --arch {', '.join(unlisted)}; the specs list {', '.join(listed) or 'no arch'}"
        )
    if unlisted:
        warn(
            f"no spec lists --arch {', '.join(unlisted)}; building {', '.join(a for a in archs if a in listed)}"
        )


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` with ``0 <= i < N``; raises ``ValueError`` otherwise."""
    index, sep, total = text.partition("/")
    try:
        i, n = int(index), int(total)
    except ValueError:
        raise ValueError(f"--shard takes i/N, like 0/3 (got {text!r})") from None
    if not sep or n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard i/N needs 0 <= i < N (got {text!r})")
    return i, n


def in_shard(key: str, shard: tuple[int, int] | None) -> bool:
    """Deterministic partition by variant key: the same key lands in the same shard anywhere."""
    return shard is None or int(key[:16], 16) % shard[1] == shard[0]


def _display_path(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path.resolve())


def _staleness(state: VariantState, prov: Provenance, policy: str) -> str:
    changed = [state.damage] if state.damage else []
    if state.source_hash != prov.source_hash:
        changed.append("kernel source changed")
    if state.spec_hash != prov.spec_hash:
        changed.append("spec contract changed")
    if state.toolchain_hash != prov.toolchain_hash and policy == "rebuild":
        changed.append("toolchain changed")
    return "; ".join(changed)


def make_plan(
    specs: Sequence[Spec],
    store: RegistryStore | None,
    *,
    toolchain: Toolchain,
    archs: Sequence[str] | None = None,
    where: Mapping[str, str] | None = None,
    shard: tuple[int, int] | None = None,
    toolchain_policy: str = "rebuild",
    retry_failed: bool = False,
) -> Plan:
    """Classify every variant of ``specs``. Reads the registry; imports no DSL."""
    if toolchain_policy not in ("rebuild", "keep"):
        raise ValueError(f"toolchain policy must be 'rebuild' or 'keep' (got {toolchain_policy!r})")
    provenance = {
        (s.family, s.abi): Provenance(
            module=s.module,
            source=source_closure(s.module),
            spec_path=_display_path(s.path),
            spec_contract=s.contract(),
            toolchain=toolchain,
        )
        for s in specs
    }
    states: Mapping[str, VariantState] = {}
    failures: Mapping[str, FailureState] = {}
    if store is not None:
        with store.read() as conn:
            states = current_states(conn, store.blobs)  # damaged ones rebuild as stale
            failures = latest_failures(conn)
    items: list[PlanItem] = []
    pruned: list[Pruned] = []
    for spec in specs:
        prov = provenance[(spec.family, spec.abi)]
        expansion = expand(spec, archs=archs, where=where)
        pruned.extend(expansion.pruned)
        for rejection in expansion.rejected:
            if in_shard(rejection.variant.key, shard):
                v = rejection.variant
                held = _holds(failures.get(v.key), states.get(v.key), prov, rejection.reason)
                items.append(PlanItem(v, State.REJECTED, rejection.reason, rejection.stage, held))
        for variant in expansion.accepted:
            if not in_shard(variant.key, shard):
                continue
            items.append(_classify(variant, prov, states, failures, toolchain_policy, retry_failed))
    return Plan(tuple(items), toolchain, provenance, shard, tuple(pruned))


def _holds(last: FailureState | None, state: VariantState | None, prov: Provenance, reason: str) -> bool:
    """Whether the registry already records this planner rejection as the key's latest word."""
    return (
        last is not None
        and last.kind == Status.REJECTED
        and last.reason == reason
        and last.same_inputs(prov)
        and (state is None or last.id_after(state))
    )


def _judged_without_sass(failure: FailureState) -> bool:
    """A limits rejection recorded with no SASS to judge by: builds that lacked nvdisasm took a
    stack frame for spills and an unknown async_wgmma as broken. --retry-failed retries those."""
    return failure.stage == "limits" and "SASS" in failure.reason


def _classify(
    variant: Variant,
    prov: Provenance,
    states: Mapping[str, VariantState],
    failures: Mapping[str, FailureState],
    policy: str,
    retry_failed: bool,
) -> PlanItem:
    state = states.get(variant.key)
    last = failures.get(variant.key)
    newer_failure = last is not None and (state is None or last.id_after(state))
    reason = _staleness(state, prov, policy) if state is not None else None
    if newer_failure and last.same_inputs(prov):  # type: ignore[union-attr]
        if last.kind == Status.REJECTED and not (retry_failed and _judged_without_sass(last)):  # type: ignore[union-attr]
            return PlanItem(variant, State.REJECTED, last.reason, last.stage, True)  # type: ignore[union-attr]
        # A failure recorded after another builder stored these very inputs (the two raced)
        # does not take back the artifact: the variant is present.
        if last.kind == Status.FAILED and not retry_failed and (state is None or reason):  # type: ignore[union-attr]
            return PlanItem(variant, State.FAILED, last.reason, last.stage, True)  # type: ignore[union-attr]
    if state is None:
        return PlanItem(variant, State.NEW)
    return PlanItem(variant, State.STALE, reason) if reason else PlanItem(variant, State.PRESENT)
