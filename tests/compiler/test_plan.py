"""How the planner classifies one variant from its current row and its latest failure."""

from __future__ import annotations

import pytest

from b12x_aot.compiler._plan import _classify
from b12x_aot.registry import Provenance, SourceClosure, Toolchain
from b12x_aot.registry._queries import FailureState, VariantState

PROV = Provenance(
    module="kpkg.kern",
    source=SourceClosure((("kpkg.kern", "a" * 64),)),
    spec_path="specs/k.yaml",
    spec_contract={"args": []},
    toolchain=Toolchain((("nvidia-cutlass-dsl", "4.8.1"),), "--opt-level 3"),
)


class Variant:
    key = "k"  # all the planner reads of a variant here


VARIANT = Variant()


def state(build: int, source_hash: str = PROV.source_hash) -> VariantState:
    return VariantState("k", build, source_hash, PROV.spec_hash, PROV.toolchain_hash)


def failure(build: int, kind: str = "failed") -> FailureState:
    return FailureState(
        "k", build, kind, "worker", "lost", PROV.source_hash, PROV.spec_hash, PROV.toolchain_hash
    )


@pytest.mark.parametrize(
    ("current", "latest", "retry", "planned"),
    [
        (None, failure(3), False, "failed"),  # failed with these inputs: not retried unasked
        (None, failure(3), True, "new"),
        (state(4), failure(3), False, "present"),  # built after the failure
        # Another builder stored these very inputs, then this one's failure landed: still present.
        (state(4), failure(5), False, "present"),
        (state(4, source_hash="b" * 64), failure(5), False, "failed"),  # stale row, failed rebuild
        (state(4, source_hash="b" * 64), failure(5), True, "stale"),
        (None, failure(3, "rejected"), True, "rejected"),
    ],
)
def test_classify(current, latest, retry: bool, planned: str) -> None:
    states = {"k": current} if current else {}
    item = _classify(VARIANT, PROV, states, {"k": latest}, "rebuild", retry)  # type: ignore[arg-type]
    assert item.state == planned
