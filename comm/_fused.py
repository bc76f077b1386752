"""The fused all-reduce + residual add + RMSNorm launches of a communicator.

``comm.allreduce_rmsnorm`` variants are optional: a communicator loads every one the registry
holds for its world, dtypes and arch, and keeps one per (dtype, hidden). A variant runs one
CTA per row, and every rank's CTA ``b`` spins at a barrier until CTA ``b`` of every other rank
arrives, so all ranks' rows must be resident at once: :func:`choose_fused` keeps, per
(dtype, hidden), the variant that fits the most rows on the GPU (ties: fewer packs per thread,
the wider CTA) and records that many rows (at most the window's 64 flag rows) as its limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from b12x_aot.loader import Kernel, PreparedLaunch, Registry

from ._policy import ABI, DTYPE_BYTES, Settings
from .errors import CapacityError, CommArgumentError
from .layout import MAX_BLOCKS

__all__ = ["FUSED_FAMILY", "FusedLaunch", "FusedVariant", "check_rows", "choose_fused", "load_fused"]

FUSED_FAMILY = "comm.allreduce_rmsnorm"


class FusedVariant(NamedTuple):
    """One ``comm.allreduce_rmsnorm`` variant's params (without ``world``)."""

    dtype: str
    hidden: int
    packs_per_thread: int

    def params(self, world: int) -> dict[str, Any]:
        return {**self._asdict(), "world": world}


class FusedLaunch(NamedTuple):
    """The prepared launch chosen for one (dtype, hidden) and the most rows one call may have."""

    variant: FusedVariant
    launch: PreparedLaunch
    max_rows: int


def built_fused(
    built: Iterable[Mapping[str, Any]], *, world: int, dtypes: Iterable[str]
) -> list[FusedVariant]:
    """The variants among ``built`` (registry params) for ``world`` and ``dtypes``, sorted."""
    wanted = set(dtypes)
    found = set()
    for params in built:
        try:
            if params["world"] == world and params["dtype"] in wanted:
                found.add(
                    FusedVariant(params["dtype"], int(params["hidden"]), int(params["packs_per_thread"]))
                )
        except KeyError:
            continue  # another shape of this family: not one this runtime launches
    return sorted(found)


def load_fused(
    registry: Registry, device: int, settings: Settings, stream: Any
) -> dict[FusedVariant, Kernel]:
    """Load every built variant this communicator may launch, before any capture."""
    arch = registry.arch(device)
    built = [
        e.params for e in registry.entries() if e.family == FUSED_FAMILY and e.abi == ABI and e.arch == arch
    ]
    return {
        v: registry.kernel(FUSED_FAMILY, ABI, device=device, stream=stream, **v.params(settings.world))
        for v in built_fused(built, world=settings.world, dtypes=settings.dtypes)
    }


def choose_fused(
    launches: Mapping[FusedVariant, PreparedLaunch],
    per_sm: Mapping[FusedVariant, int],
    sms: int,
    sharing: int,
) -> dict[tuple[str, int], FusedLaunch]:
    """Per (dtype, hidden), the variant that fits the most rows with ``sharing`` ranks on one
    GPU of ``sms`` SMs, each SM holding ``per_sm[v]`` CTAs; variants that fit no row are left out."""
    best: dict[tuple[str, int], FusedLaunch] = {}
    for v in sorted(launches):
        rows = min(MAX_BLOCKS, per_sm[v] * sms // sharing)
        key = (v.dtype, v.hidden)
        if rows > 0 and (key not in best or rows > best[key].max_rows):
            best[key] = FusedLaunch(v, launches[v], rows)
    return best


def check_rows(
    rank: int, fused: FusedLaunch | None, dtype: str, rows: int, hidden: int, slot_bytes: int
) -> None:
    """Raise unless a call of ``rows`` rows of ``hidden`` elements can launch."""
    if fused is None:
        raise CommArgumentError(
            "all_reduce_rmsnorm hidden size",
            f"has no {FUSED_FAMILY} variant for {dtype} in the registry for this world size",
            hidden,
            "Build it with b12x-compile specs/comm_allreduce_rmsnorm.yaml",
        )
    if rows > fused.max_rows:
        raise CommArgumentError(
            "all_reduce_rmsnorm rows",
            f"must be at most {fused.max_rows} (one CTA per row, all ranks' CTAs resident at once, "
            f"at most {MAX_BLOCKS})",
            rows,
            "Split the call into chunks of rows",
        )
    nbytes = rows * hidden * DTYPE_BYTES[dtype]
    if nbytes > slot_bytes:
        raise CapacityError(rank, nbytes, slot_bytes)


def _span(t: Any) -> tuple[int, int]:
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


def _check_like(name: str, t: Any, shape: tuple[int, ...], like: Any) -> None:
    """``t`` must be a contiguous tensor of ``shape`` with ``like``'s dtype and device, 16-byte aligned."""
    what = f"all_reduce_rmsnorm {name}"
    if getattr(t, "dtype", None) != like.dtype:
        raise CommArgumentError(
            what, f"must have inp's dtype {like.dtype}", getattr(t, "dtype", type(t).__name__)
        )
    if tuple(t.shape) != shape:
        raise CommArgumentError(what, f"must have shape {shape}", tuple(t.shape))
    if t.device != like.device:
        raise CommArgumentError(what, f"must be on inp's device {like.device}", t.device)
    if not t.is_contiguous():
        raise CommArgumentError(what, "must be contiguous", f"strides {tuple(t.stride())}")
    if t.data_ptr() & 15:
        raise CommArgumentError(what, "must be 16-byte aligned", f"{t.data_ptr():#x}")


def check_operands(inp: Any, residual: Any, gamma: Any, out: Any, residual_out: Any) -> tuple[int, int]:
    """``(rows, hidden)`` of a call whose tensors are consistent (``inp`` itself already checked
    for dtype, device and contiguity). Each output is an input itself or overlaps nothing else:
    a thread reads each of its packs before it writes that pack."""
    if inp.dim() < 1:
        raise CommArgumentError("all_reduce_rmsnorm inp", "must have a hidden dimension", tuple(inp.shape))
    hidden = int(inp.shape[-1])
    rows = inp.numel() // hidden if hidden else 0
    _check_like("inp", inp, tuple(inp.shape), inp)
    for name, t in (("residual", residual), ("out", out), ("residual_out", residual_out)):
        _check_like(name, t, tuple(inp.shape), inp)
    _check_like("gamma", gamma, (hidden,), inp)
    spans = {"inp": _span(inp), "residual": _span(residual), "gamma": _span(gamma)}
    for name, t in (("out", out), ("residual_out", residual_out)):
        mine = _span(t)
        for other, span in spans.items():
            exact = mine == span and other in ("inp", "residual")
            if not exact and mine[0] < span[1] and span[0] < mine[1] and mine[0] != mine[1]:
                raise CommArgumentError(
                    f"all_reduce_rmsnorm {name}",
                    f"must be inp or residual itself, or overlap none of the other tensors (it overlaps {other})",
                    f"{mine[0]:#x}",
                )
        spans[name] = mine
    return rows, hidden
