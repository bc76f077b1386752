"""Build progress: a rich progress bar on a terminal, plain periodic lines in CI logs."""

from __future__ import annotations

import time
from collections import Counter
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["BuildProgress"]

_PLAIN_EVERY_S = 10.0


class BuildProgress:
    """Counts outcomes (done, failed, rejected) and shows them with an ETA."""

    def __init__(self, total: int, console: Console, *, plain: bool | None = None) -> None:
        self.total = total
        self.console = console
        self.counts: Counter[str] = Counter()
        self.plain = (not console.is_terminal) if plain is None else plain
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
                TextColumn(
                    "[green]{task.fields[ok]} ok[/] [red]{task.fields[failed]} failed[/] "
                    "[yellow]{task.fields[rejected]} rejected[/]"
                ),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("compile", total=self.total, ok=0, failed=0, rejected=0)
        elif self.total:
            self.console.print(f"compiling {self.total} variant(s)")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(exc_type, exc, tb)
        elif self.total:
            self._line(final=True)

    @property
    def done(self) -> int:
        return sum(self.counts.values())

    def update(self, status: str) -> None:
        """Count one finished variant: ok, failed, timeout, transient or rejected."""
        self.counts["failed" if status in ("timeout", "transient") else status] += 1
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task,
                advance=1,
                ok=self.counts["ok"],
                failed=self.counts["failed"],
                rejected=self.counts["rejected"],
            )
        elif time.monotonic() - self._last_line >= _PLAIN_EVERY_S:
            self._line()

    def _line(self, final: bool = False) -> None:
        self._last_line = now = time.monotonic()
        elapsed = now - self._start
        done = self.done
        eta = ""
        if done and not final and done < self.total:
            eta = f", eta {elapsed / done * (self.total - done):.0f}s"
        self.console.print(
            f"compiled {done}/{self.total} (ok {self.counts['ok']}, failed {self.counts['failed']}, "
            f"rejected {self.counts['rejected']}) in {elapsed:.1f}s{eta}",
            highlight=False,
        )
