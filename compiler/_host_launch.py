"""The kernel launch a compiled host function issues, read from its final LLVM IR.

``cute.compile`` lowers a ``@cute.jit`` host function to LLVM: it computes each kernel
parameter from its own arguments (a tensor passed on, or a tiled view of it with derived
shape and stride words), fills a ``cudaLaunchConfig_t`` (grid, block, dynamic shared memory,
stream, launch attributes such as the cluster size) and calls ``_cudaLaunchKernelEx``. That
call is where the DSL's own decisions are final, so the compiler reads the launch there:

- each kernel parameter's LLVM type (its byte layout) and, word by word, the term that
  computes it from the host function's input words (``_terms``);
- the grid, as terms (the loader evaluates them, or checks a spec's grid against them);
- the block, the dynamic shared memory and the cluster, which must be constants.

How the function's values and memory are read (and what is refused) is ``_host_frame``'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._host_frame import Frame, HostInput, Unresolved, callee, is_type, ops, owner
from ._llvm_layout import TypeLayout, type_layout
from ._terms import Term
from .errors import ContractError

__all__ = ["HostLaunch", "LaunchParam", "read_host_launch"]

_LAUNCH = "_cudaLaunchKernelEx"
_CONFIG_FIELDS = {"grid": 0, "block": 1, "smem": 2, "attrs": 4}  # cudaLaunchConfig_t members
# cudaLaunchAttributeID values the DSL sets; anything else is refused
_COOPERATIVE, _CLUSTER, _PROGRAMMATIC_SERIALIZATION = 2, 4, 6


@dataclass(frozen=True, slots=True)
class LaunchParam:
    """One kernel parameter: its LLVM type, byte layout, and a term per leaf word."""

    type: str
    layout: TypeLayout
    words: tuple[Term | None, ...]  # one per layout leaf; None where no store reaches it


@dataclass(frozen=True, slots=True)
class HostLaunch:
    global_name: str  # the host's handle to the kernel: "kernels_<symbol>"
    params: tuple[LaunchParam, ...]
    grid: tuple[Term, Term, Term]
    block: tuple[int, int, int]
    smem: int
    cluster: tuple[int, int, int] | None


def _resolved(frame: Frame, pointer: Any, what: str) -> tuple[Any, ...]:
    try:
        return frame.address(pointer)
    except Unresolved:
        raise ContractError(f"cannot find the {what} the host function passes to {_LAUNCH}") from None


def _launch_call(module: Any) -> tuple[Any, Any]:
    found = [
        (func, op)
        for func in ops(module.operation)
        if func.name == "llvm.func"
        for op in ops(func)
        if callee(op) == _LAUNCH
    ]
    if len(found) != 1:
        raise ContractError(
            f"a registry variant's host function must launch exactly one kernel; this one launches {len(found)}"
        )
    return found[0]


def _attributes(frame: Frame, root: tuple[Any, ...]) -> dict[int, list[int]]:
    """Launch attribute id -> its value words, from the stores into the attribute array."""
    entries: dict[tuple[Any, ...], dict[tuple[int, ...], Any]] = {}
    root = tuple(k for k in root if not is_type(k))
    depth = len(root) + 1  # the attribute array, then one (dynamic) entry index
    for address in frame.plain:
        if address[: len(root)] == root and len(address) > depth:
            entries.setdefault(address[:depth], {})[tuple(address[depth:])] = frame.slot(*address)
    out: dict[int, list[int]] = {}
    for fields in entries.values():
        ids = fields.get((0, 0), [])
        if len(ids) != 1:
            raise ContractError(
                f"cannot read a launch attribute's id from the host function ({len(ids)} stores)"
            )
        ident = frame.constant(ids[0], "launch attribute id")
        payload = sorted((path, vs) for path, vs in fields.items() if path[:2] == (0, 2))
        if any(len(vs) != 1 for _, vs in payload):
            raise ContractError(f"launch attribute {ident}'s value is stored more than once")
        out[ident] = [frame.constant(vs[0], f"launch attribute {ident}") for _, vs in payload]
    return out


# The DSL's own check, kept in the host code, that the launch's dynamic shared memory covers
# the kernel's shared storage; with both sizes constant, it survives only when it fails.
_SMEM_SHORT = "may exceed available memory set in kernel launch"


def _short_smem(module: Any, func: Any, frame: Frame) -> None:
    """Refuse a launch whose shared memory is smaller than the kernel's storage (the DSL would
    print a warning at every launch and the kernel would fault)."""
    texts = {
        str(op.attributes["sym_name"]).strip('"'): str(op.attributes["value"])
        for op in ops(module.operation)
        if op.name == "llvm.mlir.global" and "value" in op.attributes
    }
    for op in ops(func):
        if callee(op) != "printf" or len(op.operands) < 3:
            continue
        fmt = owner(op.operands[0])
        base = owner(fmt.operands[0]) if fmt is not None and fmt.operands else fmt
        if base is None or base.name != "llvm.mlir.addressof":
            continue
        if _SMEM_SHORT in texts.get(str(base.attributes["global_name"]).lstrip("@"), ""):
            given = frame.constant(op.operands[1], "dynamic shared memory size")
            used = frame.constant(op.operands[2], "shared storage size")
            raise ContractError(
                f"the kernel's shared storage takes {used} B, but its host function launches it with "
                f"{given} B of dynamic shared memory: pass smem={used} (or leave smem out) in .launch()"
            )


def read_host_launch(module: Any, inputs: Sequence[HostInput]) -> HostLaunch:
    """The one kernel launch of a compiled module's host function. Raises :class:`ContractError`
    for a launch the loader could not redo (what it cannot read is named)."""
    func, call = _launch_call(module)
    frame = Frame(func, inputs)
    _short_smem(module, func, frame)
    config_root = _resolved(frame, call.operands[0], "launch configuration")

    def field(name: str, index: int | None = None) -> Any:
        path = (*config_root, 0, _CONFIG_FIELDS[name], *(() if index is None else (index,)))
        values = frame.slot(*(k for k in path if not is_type(k)))
        if len(values) != 1:
            raise ContractError(f"cannot read the launch's {name} from the host function")
        return values[0]

    block = tuple(frame.constant(field("block", i), "block dimension") for i in range(3))
    smem = frame.constant(field("smem"), "dynamic shared memory size")
    grid: list[Term] = []
    for i in range(3):
        try:
            term = frame.value(field("grid", i))
        except ContractError as exc:
            raise ContractError(f"grid dimension {'xyz'[i]}: {exc}") from None
        grid.append(term)  # type: ignore[arg-type]

    attrs = _attributes(frame, _resolved(frame, field("attrs"), "launch attributes"))
    cluster = None
    for ident, values in sorted(attrs.items()):
        if ident == _CLUSTER:
            cluster = tuple(values) if tuple(values) != (1, 1, 1) else None
        elif ident in (_COOPERATIVE, _PROGRAMMATIC_SERIALIZATION):
            if any(values):
                raise ContractError(
                    f"the host function sets launch attribute {ident} (a cooperative or programmatic "
                    "dependent launch), which the loader does not issue"
                )
        else:
            raise ContractError(
                f"the host function sets launch attribute {ident}, which the loader does not issue"
            )

    kernel_ptr = owner(call.operands[1])
    handle = (
        owner(kernel_ptr.operands[0]) if kernel_ptr is not None and kernel_ptr.name == "llvm.load" else None
    )
    if handle is None or handle.name != "llvm.mlir.addressof":
        raise ContractError("cannot tell which kernel the host function launches")
    global_name = str(handle.attributes["global_name"]).lstrip("@")

    args_root = _resolved(frame, call.operands[2], "kernel argument array")
    alloca = owner(frame.roots[args_root[0][1]])
    if alloca is None or alloca.name != "llvm.alloca" or len(args_root) != 1:
        raise ContractError("cannot read the kernel's argument array from the host function")
    count = frame.constant(alloca.operands[0], "kernel argument count")
    params: list[LaunchParam] = []
    for i in range(count):
        slots = frame.slot(*(k for k in args_root if not is_type(k)), i)
        if len(slots) != 1:
            raise ContractError(f"cannot read kernel parameter {i} from the host function")
        value = frame.stored(slots[0], f"kernel parameter {i}")
        params.append(_param(frame, value, i))
    return HostLaunch(global_name, tuple(params), (grid[0], grid[1], grid[2]), block, smem, cluster)  # type: ignore[arg-type]


def _param(frame: Frame, value: Any, index: int) -> LaunchParam:
    type_text = str(value.type)
    layout = type_layout(type_text)
    try:
        terms = frame.value(value)
    except ContractError as exc:
        raise ContractError(f"kernel parameter {index} ({type_text}): {exc}") from None
    by_path = terms if isinstance(terms, dict) else {(): terms}
    return LaunchParam(type_text, layout, tuple(by_path.get(lf.path) for lf in layout.leaves))
