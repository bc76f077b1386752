"""A compiled host function read as data: its SSA values as terms over its input words, and
the memory it writes, indexed by address.

Memory is followed only through the function's own ``alloca`` s. A value loaded back from
memory the function filled word by word (a TMA descriptor: sixteen ``i64`` slots, zeroed,
then set) takes, per word, the last store before the load in the same block; a word no store
reaches is left out, for the caller to judge. Anything that cannot be traced back to an
argument or a constant is refused with a :class:`ContractError`, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ._llvm_layout import type_layout
from ._terms import Term, call, cmp, const, is_const, leaf, logic, render, select
from ._terms import op as binary
from .errors import ContractError

__all__ = ["Frame", "HostInput", "Unresolved", "callee", "is_type", "ops", "owner"]

_DYNAMIC_INDEX = -(1 << 31)  # a GEP index held in an operand
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


def ops(op: Any) -> Iterator[Any]:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from ops(inner)


def _placed(op: Any) -> Iterator[tuple[Any, int]]:
    """The ops under ``op`` in program order, each with a key of the block that holds it."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner, hash(block)
                yield from _placed(inner)


def callee(op: Any) -> str | None:
    if op.name != "llvm.call" or "callee" not in op.attributes:
        return None
    return str(op.attributes["callee"]).lstrip("@")


def _key(value: Any) -> int:
    """A value's identity. MLIR's Python wrappers are made anew on each access, and the DSL
    overloads ``==`` on them to build comparison ops, so values are keyed by their handle's hash."""
    return hash(value)


def is_type(part: Any) -> bool:
    return isinstance(part, tuple) and part[0] == "type"


def owner(value: Any) -> Any:
    """The op defining ``value``, or None for a block argument."""
    owner = value.owner
    return owner if hasattr(owner, "name") else None


def _int_attr(attr: Any) -> int:
    text = str(attr).split(":")[0].strip()
    if text in ("true", "false"):
        return int(text == "true")
    return int(text)


class Unresolved(Exception):
    """An address through a pointer whose store is not indexed (yet)."""


class Frame:
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
                except Unresolved:
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
            self.plain.setdefault(tuple(k for k in key if not is_type(k)), []).append(key)

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
        op = owner(pointer)
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
            source = owner(op.operands[0])
            if source is not None and source.name == "llvm.ptrtoint":  # a round trip through an int
                return self.address(source.operands[0])
        if op is not None and op.name == "llvm.load":
            slot = self.address(op.operands[0])
            values = self.stores.get(slot, [])
            if len(values) != 1:
                raise Unresolved
            self.loaded.add(slot)
            return self.address(values[0])
        self.roots[_key(pointer)] = pointer
        return (("value", _key(pointer)),)

    def stored(self, pointer: Any, what: str = "a value") -> Any:
        """The one value the function stores where ``pointer`` points."""
        try:
            values = self.stores.get(self.address(pointer), [])
        except Unresolved:
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
        op = owner(value)
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
        except Unresolved:
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
        if not is_type(path[i]):
            return None
        indices = []
        i += 1
        while i < len(path) and not is_type(path[i]):
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
