"""Spec YAML composed with every value's line, and the faults found in it, located by them.

The YAML is composed into nodes first so that every value keeps its line; a fault then names
``file:line: field`` for the value it is about, pydantic's faults included.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from b12x_aot.contract import Expr, ExpressionError, short_repr
from b12x_aot.registry import BoundedLoader, YamlLimitError, read_yaml, yaml_fault

from .errors import SpecError, SpecFault

__all__ = ["Faults", "compose", "pydantic_faults", "read_text"]


def read_text(path: Path) -> str:
    """The spec file's text; a file that cannot be read, is too large or is not UTF-8 is a fault."""
    try:
        data = read_yaml(path)
    except OSError as exc:
        raise SpecError(path, [SpecFault(0, "", f"cannot read the file: {exc.strerror}")]) from None
    except YamlLimitError as exc:
        raise SpecError(path, [SpecFault(0, "", exc.problem)]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SpecError(
            path, [SpecFault(line, "", f"not UTF-8 text (byte {exc.start}: {exc.reason})")]
        ) from None


def compose(text: str, path: Path) -> tuple[Any, dict[tuple[Any, ...], int]]:
    """Parse YAML into plain objects plus a map from each value's path to its line.

    Composed by the registry's :class:`BoundedLoader`: an alias bomb or a deep nesting is
    refused before any value is built, and a tag outside YAML's standard ones is a fault.
    """
    try:
        root = yaml.compose(text, Loader=BoundedLoader)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    if root is None:
        raise SpecError(path, [SpecFault(1, "", "the file is empty")])
    lines: dict[tuple[Any, ...], int] = {}
    constructor = yaml.constructor.SafeConstructor()

    def build(node: yaml.Node, where: tuple[Any, ...]) -> Any:
        lines[where] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = constructor.construct_object(key_node, deep=True)
                if key in out:
                    raise SpecError(
                        path,
                        [SpecFault(key_node.start_mark.line + 1, _dotted((*where, key)), "duplicate key")],
                    )
                out[key] = build(value_node, (*where, key))
                lines[(*where, key)] = key_node.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            return [build(item, (*where, i)) for i, item in enumerate(node.value)]
        return constructor.construct_object(node, deep=True)

    try:
        return build(root, ()), lines
    except yaml.YAMLError as exc:  # a tag SafeConstructor does not know, a bad timestamp
        raise _yaml_error(path, exc) from None


def _yaml_error(path: Path, exc: yaml.YAMLError) -> SpecError:
    line, reason = yaml_fault(exc)
    if isinstance(exc, YamlLimitError):  # line 0: the file as a whole
        return SpecError(path, [SpecFault(line, "", reason)])
    return SpecError(path, [SpecFault(line or 1, "", f"invalid YAML: {reason}")])


def _dotted(where: Iterable[Any]) -> str:
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _line(lines: Mapping[tuple[Any, ...], int], where: tuple[Any, ...]) -> int:
    while where and where not in lines:
        where = where[:-1]
    return lines.get(where, 1)


class Faults:
    def __init__(self, lines: Mapping[tuple[Any, ...], int]) -> None:
        self.lines = lines
        self.items: list[SpecFault] = []

    def add(self, where: tuple[Any, ...], message: str) -> None:
        self.items.append(SpecFault(_line(self.lines, where), _dotted(where), message))

    def expr(self, where: tuple[Any, ...], source: str | int, allowed: Iterable[str]) -> Expr | None:
        try:
            expr = Expr.parse(source)
        except ExpressionError as exc:
            self.add(where, f"bad expression {short_repr(source)}: {exc.reason}")
            return None
        unknown = expr.names - set(allowed)
        if unknown:
            self.add(
                where,
                f"expression {short_repr(source)} reads {', '.join(sorted(unknown))}, which is not "
                f"among: {', '.join(sorted(allowed)) or '(nothing)'}",
            )
            return None
        return expr


def pydantic_faults(exc: ValidationError, faults: Faults) -> None:
    for err in exc.errors():
        where = tuple(
            p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "constrained-")))
        )
        # Unions report each branch's type name in loc; keep the path a user would write.
        where = tuple(p for p in where if p not in ("int", "str", "bool", "list[...]", "none"))
        got = err.get("input")
        suffix = "" if err["type"] == "missing" else f" (got {short_repr(got)})"
        faults.add(where, err["msg"] + suffix)
