"""The AOT launch contract, checked on every compiled cubin before it is recorded.

The cubin's own parameter table (``EIATTR_KPARAM_INFO``: ordinal, offset, size, pointee
alignment) must equal the C struct that the spec's arguments form, its arch must be the
variant's, its required thread count the spec's block, and its shared memory must fit the
arch. A mismatch fails the variant with a message that names the argument and both sides.
"""

from __future__ import annotations

from collections.abc import Sequence

from b12x_aot.loader import Arg, ParamLayout, StaticGeometry
from b12x_aot.registry import SassHistogram

from ._arch import ARCHS
from ._cubin import CubinInfo, KernelResources
from ._spec import Limits
from .errors import ContractError

__all__ = ["check_contract", "check_limits", "undecided_limits"]


def check_contract(
    info: CubinInfo, symbol: str, arch: str, args: Sequence[Arg], static: StaticGeometry
) -> KernelResources:
    """Check a cubin against the spec; return its kernel's resources or raise ContractError."""
    limits = ARCHS[arch]
    if info.sm != limits.sm:
        raise ContractError(f"cubin is for SM {info.sm}, but the variant's arch is {arch} (SM {limits.sm})")
    kernel = info.kernel(symbol)
    layout = ParamLayout.of(args)
    table = {p.ordinal: p for p in kernel.params}
    problems: list[str] = []
    if len(kernel.params) != len(args):
        names = ", ".join(a.name for a in args)
        problems.append(
            f"the spec declares {len(args)} arguments ({names}); the cubin has {len(kernel.params)} parameters"
        )
    for ordinal, arg in enumerate(args):
        got = table.get(ordinal)
        want_offset, want_size = layout.offsets[ordinal], layout.sizes[ordinal]
        if got is None:
            problems.append(f"argument {ordinal} {arg.name!r}: not in the cubin's parameter table")
            continue
        if (got.offset, got.size) != (want_offset, want_size):
            problems.append(
                f"argument {ordinal} {arg.name!r} ({arg.kind}): spec wants offset {want_offset} size {want_size}, "
                f"cubin has offset {got.offset} size {got.size}"
            )
        elif arg.is_pointer and got.log_align and (1 << got.log_align) != arg.align:
            problems.append(
                f"argument {ordinal} {arg.name!r}: spec declares align {arg.align}, kernel assumes {1 << got.log_align}"
            )
    if kernel.param_bytes is not None and not problems and kernel.param_bytes != layout.size:
        problems.append(f"parameter bytes: spec packs {layout.size}, cubin reads {kernel.param_bytes}")
    if kernel.max_threads is not None and kernel.max_threads != static.threads:
        problems.append(
            f"kernel requires {kernel.max_threads} threads per block; the spec's block has {static.threads}"
        )
    smem = kernel.static_smem_bytes + static.smem
    if smem > limits.max_smem_optin:
        problems.append(
            f"static {kernel.static_smem_bytes} B + dynamic {static.smem} B shared memory exceeds the "
            f"{arch} limit of {limits.max_smem_optin} B"
        )
    if problems:
        raise ContractError("launch contract broken:\n  " + "\n  ".join(problems))
    return kernel


def check_limits(limits: Limits, kernel: KernelResources, sass: SassHistogram | None) -> str | None:
    """Why the compiled kernel is over a spec bound, or None when it is within all of them.

    Spill bytes come from SASS; when SASS is unknown a stack frame within the bound still proves
    it (spills live in the frame). ``async_wgmma`` needs SASS: ptxas serializing wgmmas shows as
    a ``WARPGROUP.DEPBAR`` wait after every ``HGMMA``. A bound only SASS can decide is not judged
    without it (a rejection is kept for these inputs forever): :func:`undecided_limits` names it.
    """
    over: list[str] = []
    if limits.max_registers is not None and (kernel.registers or 0) > limits.max_registers:
        over.append(f"registers {kernel.registers} > max_registers {limits.max_registers}")
    spill = sass.spill_store_bytes if sass is not None else None
    if limits.max_spill_bytes is not None and spill is not None and spill > limits.max_spill_bytes:
        over.append(f"spill bytes {spill} > max_spill_bytes {limits.max_spill_bytes}")
    if limits.max_stack_bytes is not None and kernel.frame_bytes > limits.max_stack_bytes:
        over.append(f"stack frame {kernel.frame_bytes} B > max_stack_bytes {limits.max_stack_bytes}")
    if limits.async_wgmma and sass is not None:
        wgmmas, waits = sass.count("HGMMA"), sass.count("WARPGROUP.DEPBAR")
        if wgmmas and waits >= wgmmas:
            over.append(
                f"{waits} wgmma waits for {wgmmas} wgmmas: ptxas serialized them (async_wgmma); "
                "no register that a wgmma in flight reads may be written before its wait_group"
            )
    return "; ".join(over) or None


def undecided_limits(limits: Limits, kernel: KernelResources, sass: SassHistogram | None) -> str | None:
    """The bounds that only SASS can decide for this kernel, when ``sass`` is unknown; else None."""
    if sass is not None:
        return None
    undecided: list[str] = []
    if limits.max_spill_bytes is not None and kernel.frame_bytes > limits.max_spill_bytes:
        undecided.append(
            f"max_spill_bytes {limits.max_spill_bytes} (stack frame {kernel.frame_bytes} B; only SASS counts spills)"
        )
    if limits.async_wgmma:
        undecided.append("async_wgmma")
    return ", ".join(undecided) or None
