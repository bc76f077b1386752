"""Errors raised by the torch ops beyond the loader's own (a launch's are the loader's)."""

from __future__ import annotations

from b12x_aot.contract import B12xError

__all__ = ["OpsError", "TileTableError"]


class OpsError(B12xError):
    """Base class of every error the ops package raises."""


class TileTableError(OpsError, ValueError):
    """A tile table that does not have the shape its op reads."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(source, problem)
        self.source, self.problem = source, problem

    def format_message(self) -> str:
        return f"tile table {self.source}: {self.problem}"
