"""Per-arch facts the planner checks variants against, before any compile."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ARCHS", "ArchLimits"]


@dataclass(frozen=True, slots=True)
class ArchLimits:
    """What one CTA may use on an arch (CUDA programming guide, compute capabilities table)."""

    name: str
    sm: int  # the SM number the cubin's ELF header carries
    max_smem_optin: int  # bytes of shared memory per block after opting in
    max_threads: int = 1024
    max_registers: int = 255


ARCHS: Mapping[str, ArchLimits] = {
    a.name: a
    for a in (
        ArchLimits("sm_90a", 90, 227 * 1024),
        ArchLimits("sm_100a", 100, 227 * 1024),
        ArchLimits("sm_120a", 120, 101_376),
    )
}
