"""The AOT launch contract, checked on every compiled cubin before it is recorded.

The cubin's own parameter table (``EIATTR_KPARAM_INFO``: ordinal, offset, size, pointee
alignment) must equal the C struct of the parameters the host function passes (read from its
IR, ``_host_launch``), its arch must be the variant's, its required thread count the launch's
block, and its shared memory must fit the arch. A mismatch fails the variant with a message
that names the parameter and both sides, and shows the whole table.
"""

from __future__ import annotations

from collections.abc import Sequence

from b12x_aot.contract import Arg, KernelParam, ParamLayout, StaticGeometry
from b12x_aot.registry import SassHistogram

from ._arch import ARCHS
from ._cubin import CubinInfo, KernelResources
from ._spec import Limits
from .errors import ContractError

__all__ = ["check_contract", "check_limits", "undecided_limits"]


def _table(kernel: KernelResources, params: Sequence[KernelParam], layout: ParamLayout) -> str:
    """The cubin's parameter table beside the parameters the host function passes."""
    rows = []
    for ordinal in range(max(len(kernel.params), len(params))):
        got = next((p for p in kernel.params if p.ordinal == ordinal), None)
        cubin = f"offset {got.offset} size {got.size}" if got is not None else "(none)"
        if ordinal < len(params):
            param = params[ordinal]
            words = (
                param.tmap.describe() if param.tmap else ", ".join(w.expr for w in param.words) or "no words"
            )
            host = f"offset {layout.offsets[ordinal]} size {params[ordinal].size}: {words}"
        else:
            host = "(none)"
        rows.append(f"    {ordinal}: cubin {cubin} | host function {host}")
    return "\n".join(rows)


def check_contract(
    info: CubinInfo,
    symbol: str,
    arch: str,
    params: Sequence[KernelParam],
    static: StaticGeometry,
    args: Sequence[Arg] = (),
) -> KernelResources:
    """Check a cubin against the kernel parameters its host function passes (``params``) and
    the launch's static geometry; return its kernel's resources or raise ContractError. With
    ``args``, a parameter that is one pointer argument is held to that argument's ``align``."""
    limits = ARCHS[arch]
    if info.sm != limits.sm:
        raise ContractError(f"cubin is for SM {info.sm}, but the variant's arch is {arch} (SM {limits.sm})")
    kernel = info.kernel(symbol)
    layout = ParamLayout.of(params, arch)
    table = {p.ordinal: p for p in kernel.params}
    aligns = {a.name: a.align for a in args if a.is_pointer}
    problems: list[str] = []
    if len(kernel.params) != len(params):
        problems.append(
            f"the host function passes {len(params)} parameters; the cubin has {len(kernel.params)}"
        )
    for ordinal, param in enumerate(params):
        got = table.get(ordinal)
        want_offset = layout.offsets[ordinal]
        if got is None:
            problems.append(f"parameter {ordinal}: not in the cubin's parameter table")
            continue
        if (got.offset, got.size) != (want_offset, param.size):
            problems.append(
                f"parameter {ordinal}: the host function packs offset {want_offset} size {param.size}, "
                f"the cubin has offset {got.offset} size {got.size}"
            )
        elif len(param.words) == 1 and param.words[0].expr in aligns and got.log_align:
            align = aligns[param.words[0].expr]
            if (1 << got.log_align) != align:
                problems.append(
                    f"parameter {ordinal} {param.words[0].expr!r}: spec declares align {align}, "
                    f"kernel assumes {1 << got.log_align}"
                )
    if kernel.param_bytes is not None and not problems and kernel.param_bytes != layout.size:
        problems.append(
            f"parameter bytes: the host function packs {layout.size}, cubin reads {kernel.param_bytes}"
        )
    if problems:
        problems.append("the parameter table:\n" + _table(kernel, params, layout))
    if kernel.max_threads is not None and kernel.max_threads != static.threads:
        problems.append(
            f"kernel requires {kernel.max_threads} threads per block; the launch's block has {static.threads}"
        )
    smem = kernel.static_smem_bytes + (static.smem or 0)
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
