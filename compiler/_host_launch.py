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

Memory the host function writes is followed only through its own ``alloca`` s: a value that
cannot be traced back to an argument or a constant (a load of memory it did not write, a
value merged from branches) is refused with a message naming the parameter, never guessed.
A value loaded back from memory the function filled word by word (a TMA descriptor: sixteen
``i64`` slots, zeroed, then set) takes, per word, the last store before the load in the same
block; a word no store reaches is left unset (``None``), for the caller to judge.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._llvm_layout import TypeLayout, type_layout
from ._terms import Term, call, cmp, const, is_const, leaf, logic, render, select
from ._terms import op as binary
from .errors import ContractError

__all__ = ["HostInput", "HostLaunch", "LaunchParam", "read_host_launch"]

_LAUNCH = "_cudaLaunchKernelEx"
_CONFIG_FIELDS = {"grid": 0, "block": 1, "smem": 2, "attrs": 4}  # cudaLaunchConfig_t members
_DYNAMIC_INDEX = -(1 << 31)  # a GEP index held in an operand
# cudaLaunchAttributeID values the DSL sets; anything else is refused
_COOPERATIVE, _CLUSTER, _PROGRAMMATIC_SERIALIZATION = 2, 4, 6

_ICMP = {0: "==", 1: "!=", 2: "<", 3: "<=", 4: ">", 5: ">=", 6: "<", 7: "<=", 8: ">", 9: ">="}
_BINARY = {
    "llvm.add": "+",
    "llvm.sub": "-",
    "llvm.mul": "*",
    "llvm.sdiv": "tdiv",
    "llvm.srem": "tmod",
    "llvm.udiv": "//",
    "llvm.urem": "%",
    "llvm.shl": "<<",
    "llvm.lshr": ">>",
    "llvm.ashr": ">>",
    "llvm.and": "&",
    "llvm.or": "|",
    "llvm.xor": "^",
}
_CALLS = {"llvm.intr.smin": "min", "llvm.intr.umin": "min", "llvm.intr.smax": "max", "llvm.intr.umax": "max"}
_SAME_VALUE = ("llvm.zext", "llvm.sext", "llvm.trunc", "llvm.bitcast", "llvm.freeze", "llvm.addrspacecast")


@dataclass(frozen=True, slots=True)
class HostInput:
    """One argument of the host function: the loader's name for each leaf word of its LLVM
    type, in order, and whether that word is known non-negative (sizes, strides, addresses)."""

    names: tuple[str, ...]
    nonneg: tuple[bool, ...]


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


def _ops(op: Any) -> Iterator[Any]:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from _ops(inner)


def _placed(op: Any) -> Iterator[tuple[Any, int]]:
    """The ops under ``op`` in program order, each with a key of the block that holds it."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner, hash(block)
                yield from _placed(inner)


def _callee(op: Any) -> str | None:
    if op.name != "llvm.call" or "callee" not in op.attributes:
        return None
    return str(op.attributes["callee"]).lstrip("@")


def _key(value: Any) -> int:
    """A value's identity. MLIR's Python wrappers are made anew on each access, and the DSL
    overloads ``==`` on them to build comparison ops, so values are keyed by their handle's hash."""
    return hash(value)


def _is_type(part: Any) -> bool:
    return isinstance(part, tuple) and part[0] == "type"


def _owner(value: Any) -> Any:
    """The op defining ``value``, or None for a block argument."""
    owner = value.owner
    return owner if hasattr(owner, "name") else None


def _int_attr(attr: Any) -> int:
    text = str(attr).split(":")[0].strip()
    if text in ("true", "false"):
        return int(text == "true")
    return int(text)


class _Unresolved(Exception):
    """An address through a pointer whose store is not indexed (yet)."""


class _Frame:
    """One host function: its stores indexed by address, and terms for its SSA values."""

    def __init__(self, func: Any, inputs: Sequence[HostInput]) -> None:
        self.func = func
        self.entry = func.regions[0].blocks[0]
        self.inputs = inputs
        self.memo: dict[int, Any] = {}
        self.loaded: set[tuple[Any, ...]] = set()  # slots a pointer was loaded back from
        self.roots: dict[int, Any] = {}  # the values that addresses start from, by key
        self.stores: dict[tuple[Any, ...], list[Any]] = {}
        self.places: dict[tuple[Any, ...], list[tuple[int, int]]] = {}  # (position, block) per store
        self.positions: dict[int, tuple[int, int]] = {}  # each load's
        # An address may go through a pointer the function stored and loaded back (the launch
        # config behind its array of one): index the stores whose addresses resolve, then again
        # those that needed them, until none is left or none resolves.
        pending = []
        for position, (op, block) in enumerate(_placed(func)):
            if op.name == "llvm.store":
                pending.append((op.operands[0], op.operands[1], (position, block)))
            elif op.name == "llvm.load":
                self.positions[hash(op.operation)] = (position, block)
        while pending:
            left = []
            for value, pointer, place in pending:
                try:
                    key = self.address(pointer)
                except _Unresolved:
                    left.append((value, pointer, place))
                    continue
                self.stores.setdefault(key, []).append(value)
                self.places.setdefault(key, []).append(place)
            if len(left) == len(pending):
                break  # what is left loads from memory nothing resolvable wrote; never read here
            pending = left
        # a pointer read back before all stores were indexed must still have had just one
        for key in self.loaded:
            if len(self.stores.get(key, [])) != 1:
                raise ContractError("the host function stores a pointer it loads back more than once")
        self.plain: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for key in self.stores:
            self.plain.setdefault(tuple(k for k in key if not _is_type(k)), []).append(key)

    def slot(self, *path: Any) -> list[Any]:
        """The values stored at ``path`` (an address without its GEP element types); refuses
        two slots that differ only in their types."""
        keys = self.plain.get(tuple(path), [])
        if len(keys) > 1:
            raise ContractError("the host function addresses one slot through two element types")
        return self.stores[keys[0]] if keys else []

    # --- memory -------------------------------------------------------------------------

    def address(self, pointer: Any) -> tuple[Any, ...]:
        """``(root, index, ...)``: the allocation a pointer points into and the GEP indices."""
        op = _owner(pointer)
        if op is not None and op.name == "llvm.getelementptr":
            dynamic = iter(op.operands[1:])
            indices: list[Any] = [("type", str(op.attributes["elem_type"]))]
            for raw in list(op.attributes["rawConstantIndices"]):
                if raw != _DYNAMIC_INDEX:
                    indices.append(int(raw))
                    continue
                index = next(dynamic)
                term = self._try_term(index)
                indices.append(term[1] if term is not None and is_const(term) else ("value", _key(index)))
            return (*self.address(op.operands[0]), *indices)
        if op is not None and op.name == "llvm.inttoptr":
            source = _owner(op.operands[0])
            if source is not None and source.name == "llvm.ptrtoint":  # a round trip through an int
                return self.address(source.operands[0])
        if op is not None and op.name == "llvm.load":
            slot = self.address(op.operands[0])
            values = self.stores.get(slot, [])
            if len(values) != 1:
                raise _Unresolved
            self.loaded.add(slot)
            return self.address(values[0])
        self.roots[_key(pointer)] = pointer
        return (("value", _key(pointer)),)

    def stored(self, pointer: Any, what: str = "a value") -> Any:
        """The one value the function stores where ``pointer`` points."""
        try:
            values = self.stores.get(self.address(pointer), [])
        except _Unresolved:
            values = []
        if len(values) != 1:
            raise ContractError(f"cannot read {what} from the host function: {len(values)} stores reach it")
        return values[0]

    # --- values -------------------------------------------------------------------------

    def _try_term(self, value: Any) -> Term | None:
        try:
            result = self.value(value)
        except ContractError:
            return None
        return result if isinstance(result, tuple) else None

    def value(self, value: Any) -> Term | dict[tuple[int, ...], Term]:
        """A term for a scalar SSA value, or ``{leaf path: term}`` for a struct."""
        key = _key(value)
        if key not in self.memo:
            self.memo[key] = self._value(value)
        return self.memo[key]

    def _input(self, value: Any) -> Term | dict[tuple[int, ...], Term]:
        from cutlass._mlir import ir

        argument = ir.BlockArgument(value)  # the DSL hands some back as its own Value subclasses
        if argument.owner != self.entry:
            raise ContractError("a value merged from branches of the host function (a block argument)")
        index = argument.arg_number
        if index >= len(self.inputs):
            raise ContractError(f"host function argument {index} is not one of the kernel's arguments")
        spec = self.inputs[index]
        layout = type_layout(str(value.type))
        if len(layout.leaves) != len(spec.names):
            raise ContractError(
                f"host function argument {index} has {len(layout.leaves)} words "
                f"({value.type}); the spec's argument has {len(spec.names)} ({', '.join(spec.names)})"
            )
        terms = {
            lf.path: leaf(n, nn) for lf, n, nn in zip(layout.leaves, spec.names, spec.nonneg, strict=True)
        }
        return terms[()] if list(terms) == [()] else terms

    def _value(self, value: Any) -> Term | dict[tuple[int, ...], Term]:
        op = _owner(value)
        if op is None:
            return self._input(value)
        name = op.name
        if name == "llvm.mlir.constant":
            attr = op.attributes["value"]
            if type(attr).__name__ == "FloatAttr":
                return const(float(str(attr).split(":")[0]))
            return const(_int_attr(attr))
        if name in ("llvm.mlir.poison", "llvm.mlir.undef"):
            return {}
        if name == "llvm.mlir.zero":
            layout = type_layout(str(value.type))
            zeros = {lf.path: const(0) for lf in layout.leaves}
            return zeros[()] if list(zeros) == [()] else zeros
        if name == "llvm.insertvalue":
            container = self.value(op.container)
            inserted = self.value(op.value)
            position = tuple(int(p) for p in op.attributes["position"])
            out = {p: v for p, v in container.items() if p[: len(position)] != position}  # type: ignore[union-attr]
            if isinstance(inserted, dict):
                out.update({(*position, *p): v for p, v in inserted.items()})
            else:
                out[position] = inserted
            return out
        if name == "llvm.extractvalue":
            container = self.value(op.container)
            position = tuple(int(p) for p in op.attributes["position"])
            if not isinstance(container, dict):
                raise ContractError("extractvalue from a scalar")
            inner = {p[len(position) :]: v for p, v in container.items() if p[: len(position)] == position}
            if () in inner:
                return inner[()]
            if not inner and not type_layout(str(value.type)).leaves:
                return {}
            if not inner:
                raise ContractError("a word the host function never set (poison)")
            return inner
        if name in _SAME_VALUE or name in ("llvm.ptrtoint", "llvm.inttoptr"):
            return self._scalar(op.operands[0], name)
        if name in _BINARY:
            a, b = (self._scalar(v, name) for v in op.operands)
            if str(value.type) == "i1" and name in ("llvm.and", "llvm.or"):
                return logic("and" if name == "llvm.and" else "or", a, b)
            if str(value.type) == "i1" and name == "llvm.xor" and b == const(1):
                return logic("not", a)
            return binary(_BINARY[name], a, b)
        if name == "llvm.icmp":
            a, b = (self._scalar(v, name) for v in op.operands)
            return cmp(_ICMP[_int_attr(op.attributes["predicate"])], a, b)
        if name == "llvm.select":
            c, a, b = (self._scalar(v, name) for v in op.operands)
            return select(c, a, b)
        if name in _CALLS:
            a, b = (self._scalar(v, name) for v in op.operands)
            return call(_CALLS[name], a, b)
        if name == "llvm.getelementptr":
            raise ContractError("a pointer offset computed by the host function (getelementptr)")
        if name == "llvm.load":
            return self._load(op, value)
        raise ContractError(f"a value the host function computes with {name}")

    def _load(self, op: Any, value: Any) -> Term | dict[tuple[int, ...], Term]:
        """A value read back from memory the function wrote: per word, the last store before
        the load, in its block. Words no store reaches are left out."""
        try:
            base = self.address(op.operands[0])
        except _Unresolved:
            raise ContractError("a load of memory the host function did not write") from None
        position, block = self.positions[hash(op.operation)]
        layout = type_layout(str(value.type))
        at: dict[int, list[tuple[int, Any]]] = {}
        for key, values in self.stores.items():
            if key[: len(base)] != base:
                continue
            offset = 0 if key == base else _byte_offset(key[len(base) :])
            if offset is None:
                continue
            for (where, in_block), stored in zip(self.places[key], values, strict=True):
                if in_block != block:
                    raise ContractError("a value the host function stores in one block and loads in another")
                if where < position:
                    at.setdefault(offset, []).append((where, stored))
        out: dict[tuple[int, ...], Term] = {}
        for lf in layout.leaves:
            if lf.offset in at:
                stored = max(at[lf.offset], key=lambda item: item[0])[1]
                if type_layout(str(stored.type)).size != lf.size:
                    raise ContractError("the host function writes a loaded word at another width")
                out[lf.path] = self._scalar(stored, "llvm.load")
        return out[()] if list(out) == [()] else out

    def _scalar(self, value: Any, user: str) -> Term:
        result = self.value(value)
        if isinstance(result, dict):
            raise ContractError(f"{user} of a struct value")
        return result

    def constant(self, value: Any, what: str) -> int:
        term = self.value(value)
        if not isinstance(term, tuple) or not is_const(term):
            rendered = render(term) if isinstance(term, tuple) else "a struct"
            raise ContractError(
                f"the host function launches with a {what} that depends on runtime values ({rendered}); "
                "the loader fixes it per variant, so it must be a compile-time constant"
            )
        return int(term[1])


def _byte_offset(path: tuple[Any, ...]) -> int | None:
    """The byte offset that GEP indices ``path`` (each GEP's element type, then its indices)
    reach from their base; None for a dynamic index or a path that is not a chain of GEPs."""
    offset, i = 0, 0
    while i < len(path):
        if not _is_type(path[i]):
            return None
        indices = []
        i += 1
        while i < len(path) and not _is_type(path[i]):
            if not isinstance(path[i], int):
                return None
            indices.append(path[i])
            i += 1
        if not indices:
            return None
        layout = type_layout(path[i - len(indices) - 1][1])
        offset += indices[0] * layout.size
        inner = tuple(indices[1:])
        if inner:
            starts = [lf.offset for lf in layout.leaves if lf.path[: len(inner)] == inner]
            if not starts:
                return None
            offset += min(starts)
    return offset


def _resolved(frame: _Frame, pointer: Any, what: str) -> tuple[Any, ...]:
    try:
        return frame.address(pointer)
    except _Unresolved:
        raise ContractError(f"cannot find the {what} the host function passes to {_LAUNCH}") from None


def _launch_call(module: Any) -> tuple[Any, Any]:
    found = [
        (func, op)
        for func in _ops(module.operation)
        if func.name == "llvm.func"
        for op in _ops(func)
        if _callee(op) == _LAUNCH
    ]
    if len(found) != 1:
        raise ContractError(
            f"a registry variant's host function must launch exactly one kernel; this one launches {len(found)}"
        )
    return found[0]


def _attributes(frame: _Frame, root: tuple[Any, ...]) -> dict[int, list[int]]:
    """Launch attribute id -> its value words, from the stores into the attribute array."""
    entries: dict[tuple[Any, ...], dict[tuple[int, ...], Any]] = {}
    root = tuple(k for k in root if not _is_type(k))
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


def _short_smem(module: Any, func: Any, frame: _Frame) -> None:
    """Refuse a launch whose shared memory is smaller than the kernel's storage (the DSL would
    print a warning at every launch and the kernel would fault)."""
    texts = {
        str(op.attributes["sym_name"]).strip('"'): str(op.attributes["value"])
        for op in _ops(module.operation)
        if op.name == "llvm.mlir.global" and "value" in op.attributes
    }
    for op in _ops(func):
        if _callee(op) != "printf" or len(op.operands) < 3:
            continue
        fmt = _owner(op.operands[0])
        base = _owner(fmt.operands[0]) if fmt is not None and fmt.operands else fmt
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
    frame = _Frame(func, inputs)
    _short_smem(module, func, frame)
    config_root = _resolved(frame, call.operands[0], "launch configuration")

    def field(name: str, index: int | None = None) -> Any:
        path = (*config_root, 0, _CONFIG_FIELDS[name], *(() if index is None else (index,)))
        values = frame.slot(*(k for k in path if not _is_type(k)))
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

    kernel_ptr = _owner(call.operands[1])
    handle = (
        _owner(kernel_ptr.operands[0]) if kernel_ptr is not None and kernel_ptr.name == "llvm.load" else None
    )
    if handle is None or handle.name != "llvm.mlir.addressof":
        raise ContractError("cannot tell which kernel the host function launches")
    global_name = str(handle.attributes["global_name"]).lstrip("@")

    args_root = _resolved(frame, call.operands[2], "kernel argument array")
    alloca = _owner(frame.roots[args_root[0][1]])
    if alloca is None or alloca.name != "llvm.alloca" or len(args_root) != 1:
        raise ContractError("cannot read the kernel's argument array from the host function")
    count = frame.constant(alloca.operands[0], "kernel argument count")
    params: list[LaunchParam] = []
    for i in range(count):
        slots = frame.slot(*(k for k in args_root if not _is_type(k)), i)
        if len(slots) != 1:
            raise ContractError(f"cannot read kernel parameter {i} from the host function")
        value = frame.stored(slots[0], f"kernel parameter {i}")
        params.append(_param(frame, value, i))
    return HostLaunch(global_name, tuple(params), (grid[0], grid[1], grid[2]), block, smem, cluster)  # type: ignore[arg-type]


def _param(frame: _Frame, value: Any, index: int) -> LaunchParam:
    type_text = str(value.type)
    layout = type_layout(type_text)
    try:
        terms = frame.value(value)
    except ContractError as exc:
        raise ContractError(f"kernel parameter {index} ({type_text}): {exc}") from None
    by_path = terms if isinstance(terms, dict) else {(): terms}
    return LaunchParam(type_text, layout, tuple(by_path.get(lf.path) for lf in layout.leaves))
