"""Build progress: a rich progress bar on a terminal, plain periodic lines in CI logs."""

from __future__ import annotations

import time
from types import TracebackType

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from b12x_aot.registry import Output

from ._build import Tally

__all__ = ["BuildProgress"]

_PLAIN_EVERY_S = 10.0


class BuildProgress:
    """Shows the build's :class:`Tally` as it changes, with an ETA: the counts its summary line
    ends with, so the two never disagree."""

    def __init__(self, total: int, out: Output, *, plain: bool | None = None) -> None:
        self.total = total
        self.out = out
        self.tally: Tally | None = None
        self.plain = (not out.terminal) if plain is None else plain
        self._start = time.monotonic()
        self._last_line = 0.0
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> BuildProgress:
        if not self.plain and self.total:
            self._progress = Progress(
                TextColumn("[bold]compiling"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[counts]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.out.console,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("compile", total=self.total, counts="")
        elif self.total:
            self.out.line(f"compiling {self.total} variant(s)")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)
        elif self.total and self.tally is not None:
            self._line(self.tally, final=True)

    def update(self, tally: Tally) -> None:
        """Show ``tally``, the build's counts after its latest outcome."""
        first = self.tally is None
        self.tally = tally
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=tally.compiled, counts=tally.text())
        elif self.total and not first and time.monotonic() - self._last_line >= _PLAIN_EVERY_S:
            self._line(tally)

    def _line(self, tally: Tally, final: bool = False) -> None:
        self._last_line = now = time.monotonic()
        elapsed = now - self._start
        done = tally.compiled
        eta = ""
        if done and not final and done < self.total:
            eta = f", eta {elapsed / done * (self.total - done):.0f}s"
        self.out.line(f"compiled {done}/{self.total}: {tally.text()} in {elapsed:.1f}s{eta}")
