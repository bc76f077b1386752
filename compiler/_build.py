"""Running a plan: compile what is new or stale in parallel, record each outcome as it lands.

Each variant is committed in its own short transaction the moment its worker returns, so a
build killed at any point keeps everything finished before it, leaves nothing half-written,
and a re-run continues where it stopped (the plan sees the finished variants as present).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any, Protocol

from b12x_aot.registry import FailureRecord, RegistryStore, RegistryWriter, VariantRecord

from ._driver import CompileJob, CompileOutcome
from ._executor import Executor
from ._plan import Plan
from ._status import State, Status
from ._variants import Variant

__all__ = ["BuildSummary", "Progress", "Tally", "run_build"]


@dataclass(frozen=True, slots=True)
class Tally:
    """Where a build's planned variants stand: the one count that its progress, its summary line
    and its ``--json`` show. ``present + built + unchanged`` are the plan's current variants (what
    ``b12x-registry ls`` lists of it) and ``rejected + failed`` its latest failures (what
    ``b12x-registry failures`` lists), rejections by the planner included. ``compiled`` of
    ``to_compile`` compile outcomes have landed."""

    present: int
    built: int
    unchanged: int  # compiled, but an identical variant was already current
    rejected: int
    failed: int
    compiled: int
    to_compile: int

    def text(self) -> str:
        return (
            f"{self.built} built, {self.unchanged} unchanged, {self.present} already present, "
            f"{self.rejected} rejected, {self.failed} failed"
        )

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class BuildSummary:
    build_id: int
    planned: dict[str, int]
    built: int = 0
    unchanged: int = 0  # compiled, but an identical variant was already current
    failed: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    compiled: int = 0  # compile outcomes landed

    @property
    def ok(self) -> bool:
        return not self.failed and not self.planned.get(State.FAILED, 0)

    def tally(self) -> Tally:
        return Tally(
            present=self.planned[State.PRESENT],
            built=self.built,
            unchanged=self.unchanged,
            rejected=len(self.rejected),
            failed=len(self.failed),
            compiled=self.compiled,
            to_compile=self.planned[State.NEW] + self.planned[State.STALE],
        )

    def to_json(self) -> dict[str, Any]:
        data = {**asdict(self), "seconds": round(self.seconds, 3), "ok": self.ok}
        del data["compiled"]
        return {**data, "counts": self.tally().to_json()}

    def record(self) -> dict[str, Any]:
        """What the registry keeps of the build: :meth:`to_json` without the id and the verdict,
        rejections counted rather than listed, and only the failures this build made (recorded
        ones are already stored)."""
        data = self.to_json()
        del data["build_id"], data["ok"]
        data["failed"] = [f for f in self.failed if not f["previous_build"]]
        data["rejected"] = len(self.rejected)
        return data


def _reported(variant: Variant, stage: str, reason: str, previous_build: bool) -> dict[str, Any]:
    """How a failed or rejected variant appears in the build summary."""
    return {
        "variant": variant.label,
        "key": variant.key,
        "stage": stage,
        "reason": reason,
        "previous_build": previous_build,
    }


def _settled(plan: Plan, writer: RegistryWriter, build_id: int, summary: BuildSummary) -> None:
    """Count the variants the plan already failed or rejected, and record each planner rejection
    the registry does not hold yet, so ``b12x-registry failures`` lists every rejection the
    summary counts (and a rejected key stops being served, as after a compile's rejection)."""
    for item in plan.items:
        if item.state not in (State.FAILED, State.REJECTED):
            continue
        if item.state == State.REJECTED and not item.recorded:
            v = item.variant
            writer.record_failure(
                build_id,
                FailureRecord(
                    v.id, plan.provenance_of(v), Status.REJECTED, item.stage, item.reason, item.reason
                ),
            )
        bucket = summary.failed if item.state == State.FAILED else summary.rejected
        bucket.append(_reported(item.variant, item.stage, item.reason, item.recorded))


class Progress(Protocol):
    """Shows a build's :class:`Tally` as it changes (on a terminal,
    :class:`~._progress.BuildProgress`)."""

    def __enter__(self) -> object: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def update(self, tally: Tally) -> None: ...


def run_build(
    plan: Plan,
    store: RegistryStore,
    *,
    executor: Executor,
    timeout: float | None,
    command: str,
    progress: Callable[[int], Progress] | None = None,
    warn: Callable[[str], None] = lambda message: None,
) -> BuildSummary:
    """Compile the plan's new and stale variants on ``executor`` and record every outcome.

    This process is the only one that writes ``store``: the executor's workers only compile and
    return outcomes. First the executor must judge the plan as any other executor would
    (:func:`_check_executor`): a refusal raises :class:`ToolchainError` before anything is
    recorded or shown, and its warning goes to ``warn``. Only then is ``progress`` made, for the
    number of variants to compile, and entered to show every tally until the build ends.
    """
    if (warning := _check_executor(plan, executor)) is not None:
        warn(warning)
    if progress is None:
        return _run(plan, store, executor, timeout, command, lambda tally: None)
    shown = progress(len(plan.to_compile()))
    with shown:
        return _run(plan, store, executor, timeout, command, shown.update)


def _check_executor(plan: Plan, executor: Executor) -> str | None:
    """Refuse ``executor`` unless it judges ``plan`` as any other executor would: every process
    that may compile its jobs shares this toolchain (:meth:`Executor.check`), and those without
    nvdisasm are ones the plan accepts (:meth:`Plan.check_nvdisasm`). Raises
    :class:`ToolchainError`; returns the plan's warning, else None."""
    if not plan.to_compile():
        return None
    executor.check(plan)
    return plan.check_nvdisasm(executor.without_nvdisasm())


def _run(
    plan: Plan,
    store: RegistryStore,
    executor: Executor,
    timeout: float | None,
    command: str,
    on_progress: Callable[[Tally], None],
) -> BuildSummary:
    """Begin the build's row, record what the plan settled, compile the rest, finish the row."""
    todo = {item.variant.key: item for item in plan.to_compile()}
    start = time.monotonic()
    writer = RegistryWriter(store)
    shard = f"{plan.shard[0]}/{plan.shard[1]}" if plan.shard else None
    build_id = writer.begin_build(plan.toolchain, command, shard)
    summary = BuildSummary(build_id, plan.counts())
    _settled(plan, writer, build_id, summary)
    on_progress(summary.tally())

    def record(outcome: CompileOutcome) -> None:
        v = todo[outcome.variant.key].variant
        if outcome.status == Status.OK:
            assert outcome.cubin is not None and outcome.resources is not None and outcome.launch is not None
            rec = VariantRecord(
                variant=v.id,
                provenance=plan.provenance_of(v),
                artifact=outcome.cubin,
                args=tuple(a.to_json() for a in v.args),
                launch=outcome.launch.launch,
                dynamic_smem_bytes=outcome.launch.static.smem or 0,
                resources=outcome.resources,
                ptxas_version=outcome.ptxas_version,
                ptxas_flags=outcome.ptxas_flags,
                sass=outcome.sass,
                compile_seconds=round(outcome.seconds, 3),
            )
            if writer.record_variant(build_id, rec):
                summary.built += 1
            else:
                summary.unchanged += 1
        else:
            kind = outcome.status  # failed, timeout, transient or rejected
            writer.record_failure(
                build_id,
                FailureRecord(
                    variant=v.id,
                    provenance=plan.provenance_of(v),
                    kind=kind,
                    stage=outcome.stage,
                    reason=outcome.reason,
                    log=outcome.log,
                ),
            )
            bucket = summary.rejected if kind == Status.REJECTED else summary.failed
            bucket.append(_reported(v, outcome.stage, outcome.reason, False))
        summary.compiled += 1
        on_progress(summary.tally())

    try:
        executor.run_jobs([CompileJob.of(i.variant) for i in todo.values()], record, timeout=timeout)
    except BaseException:
        # Stopped before the plan ran out (Ctrl-C, SIGTERM, a store that failed mid-build): the
        # build row says so. The original error says more than a second one from a store that
        # just failed, so finishing here is best effort.
        summary.seconds = time.monotonic() - start
        with contextlib.suppress(Exception):
            writer.finish_build(build_id, "interrupted", summary.record())
        raise
    summary.seconds = time.monotonic() - start
    writer.finish_build(build_id, "ok" if summary.ok else "failed", summary.record())
    return summary
