"""YAML read with bounded work: spec and manifest files, refused before anything is built.

PyYAML composes an alias as a second reference to its anchor's node, and every consumer that
walks the result (the spec loader's line map, pydantic, an error message's ``repr``) then
expands it: nine levels of nine aliases are 387 million values. :class:`BoundedLoader` counts
what each node would expand to while the document is composed, aliases at their full size,
and refuses a document past :data:`MAX_NODES` or nested past :data:`MAX_DEPTH`; the file
itself is read only up to :data:`MAX_BYTES`. Every refusal is a :class:`YamlLimitError`, a
``yaml.YAMLError`` (and a ``B12xError``) with the line, so callers report it as they report a
syntax error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from b12x_aot.contract import B12xError

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "BoundedLoader",
    "YamlLimitError",
    "read_yaml",
    "yaml_fault",
]

MAX_BYTES = 1 << 20  # the largest shipped spec is under 10 KiB
MAX_NODES = 100_000  # values after alias expansion; a spec has a few thousand
MAX_DEPTH = 64


class YamlLimitError(B12xError, yaml.YAMLError):
    """A YAML file past one of this module's bounds. ``line`` is 1-based, 0 for the file."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(line, problem)
        self.line, self.problem = line, problem

    def format_message(self) -> str:
        return self.problem


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a document expanding past :data:`MAX_NODES` values or
    nesting past :data:`MAX_DEPTH`, while composing: before any alias is expanded."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> the values it expands to
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlLimitError(mark.line + 1, f"values nest deeper than {MAX_DEPTH} levels")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if id(node) not in self._sizes:  # an alias's node was sized where its anchor was
            size = 1
            if isinstance(node, yaml.SequenceNode):
                size += sum(self._sizes[id(item)] for item in node.value)
            elif isinstance(node, yaml.MappingNode):
                size += sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
            if size > MAX_NODES:
                raise YamlLimitError(
                    node.start_mark.line + 1,
                    f"this value expands to {size:,} values (aliases counted at their full size); "
                    f"at most {MAX_NODES:,} are read: write the values out, or use fewer aliases",
                )
            self._sizes[id(node)] = size
        return node


def read_yaml(path: Path) -> bytes:
    """The bytes of ``path``; raises :class:`YamlLimitError` past :data:`MAX_BYTES` (reading
    no more than that), ``OSError`` when it cannot be read."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YamlLimitError(
            0, f"the file is larger than {MAX_BYTES // 1024} KiB, the most a YAML input may be"
        )
    return data


def yaml_fault(exc: yaml.YAMLError) -> tuple[int, str]:
    """``(line, reason)`` of any PyYAML error: 1-based, 0 where no line is known."""
    if isinstance(exc, YamlLimitError):
        return exc.line, exc.problem
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if isinstance(exc, yaml.constructor.ConstructorError):
        problem = f"{problem}; remove the tag: only YAML's standard tags are read"
    return (mark.line + 1 if mark else 0), problem
