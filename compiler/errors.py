"""Errors raised by the compiler. The CLI maps each class to an exit code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from b12x_aot.contract import B12xError

__all__ = [
    "ClosureError",
    "CompilerError",
    "ContractError",
    "EntryError",
    "ExecutorError",
    "SpecError",
    "SpecFault",
    "ToolchainError",
]


class CompilerError(B12xError):
    """Base class of compiler errors."""


@dataclass(frozen=True, slots=True)
class SpecFault:
    """One problem in a spec file: where it is and what is wrong."""

    line: int
    field: str
    message: str


class SpecError(CompilerError):
    """A spec file is not valid. Lists every fault as ``file:line: field: message``."""

    exit_code = 2

    def __init__(self, path: Path, faults: Sequence[SpecFault]) -> None:
        super().__init__(path, tuple(faults))
        self.path, self.faults = path, tuple(faults)

    def format_message(self) -> str:
        if not self.faults:
            return f"{self.path}: invalid spec"
        rows = []
        for f in self.faults:
            where = f"{self.path}:{f.line}" if f.line else str(self.path)
            rows.append(f"{where}: {f.field}: {f.message}" if f.field else f"{where}: {f.message}")
        return "\n".join(rows)


class ClosureError(CompilerError):
    """A module in a kernel's source closure cannot be found or read; its hash would lie."""

    exit_code = 2


class ToolchainError(CompilerError):
    """The CuTe DSL toolchain is not installed or cannot be identified."""

    exit_code = 2


class ContractError(CompilerError):
    """A compiled cubin breaks the AOT launch contract its spec declares."""


class EntryError(CompilerError):
    """A spec's kernel entry cannot serve it: not importable, not a ``@cute.jit`` function or a
    class with a jit ``__call__``, or built or called with arguments it does not take."""

    exit_code = 2


class ExecutorError(CompilerError):
    """An executor cannot be chosen, reached or used: a bad ``--executor`` value, the [dask]
    extra missing, a scheduler that does not answer, or a cluster with no workers."""

    exit_code = 2
