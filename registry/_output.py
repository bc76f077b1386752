"""The human output of ``b12x-registry`` and ``b12x-compile``: rich on a terminal, lines when piped.

On a terminal a table is a rich table and long cells fold. Piped or redirected, stdout holds only
the rows, each one line of tab-separated fields with nothing cut, folded or wrapped (a key is
whole, a tab or newline inside a field becomes a space), so ``grep -c`` counts rows and ``cut -f``
takes columns; a table's title and header, and notes, go to stderr there. ``--json`` is the
format for programs; this is the one for ``grep`` and people.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "Output"]

_SPACE = re.compile(r"[\t\r\n]+")
_FOLDED = 12  # the narrowest a folding column gets before the table outgrows the terminal


@dataclass(frozen=True, slots=True)
class Column:
    """A table column. ``numeric`` ones are right-aligned, ``fold`` ones wrap on a terminal (the
    others never do), and a terminal shows only the first ``width`` characters (a key's 12)."""

    name: str
    numeric: bool = False
    fold: bool = False
    width: int | None = None

    def __post_init__(self) -> None:
        if self.width is not None and self.width < 1:
            raise ValueError(f"Column {self.name!r}: width must be positive (got {self.width})")


class Output:
    """Where one command's human output goes: stdout, or stderr with ``stderr=True`` (when
    stdout carries ``--json``). ``terminal`` overrides rich's own test (a TTY, or
    ``FORCE_COLOR``/``TTY_COMPATIBLE``)."""

    def __init__(self, *, stderr: bool = False, terminal: bool | None = None) -> None:
        self.console = Console(stderr=stderr)
        self.terminal = self.console.is_terminal if terminal is None else terminal

    def _write(self, text: str, *, note: bool = False) -> None:
        """One line as it is: rich would wrap it at 80 columns and expand its tabs."""
        stream = sys.stderr if note else self.console.file
        stream.write(text + "\n")
        stream.flush()

    def line(self, text: str) -> None:
        """A result (``exported 3 variant(s)``): on the output stream, never wrapped when piped."""
        if self.terminal:
            self.console.print(Text(text), highlight=False)
        else:
            self._write(text)

    def note(self, text: str) -> None:
        """Context around rows (a count, a hint): stdout on a terminal, stderr when piped."""
        if self.terminal:
            self.console.print(Text(text), highlight=False)
        else:
            self._write(text, note=True)

    def table(
        self,
        title: str,
        columns: Sequence[Column],
        rows: Iterable[Sequence[object]],
        *,
        header: bool = True,
        limit: int | None = None,
        tag: str | None = None,
    ) -> None:
        """Print ``rows`` (one value per column; ``None`` prints empty). On a terminal at most
        ``limit`` rows, saying how many more there are; piped, every row, each led by ``tag``
        when given (``added``, ``removed``) so that rows of several tables stay apart."""
        cells = [["" if v is None else str(v) for v in row] for row in rows]
        if not self.terminal:
            self.note(title)
            if header:
                self.note("\t".join(c.name for c in columns))
            for row in cells:
                fields = [_SPACE.sub(" ", v) for v in row]
                self._write("\t".join([tag, *fields] if tag else fields))
            return
        shown = cells if limit is None else cells[:limit]
        more = f" (first {len(shown)} shown)" if len(shown) < len(cells) else ""
        texts = [[v[: c.width] if c.width else v for c, v in zip(columns, row, strict=True)] for row in shown]
        table = Table(title=title + more, show_header=header)
        need = 1  # the left border; each column adds its padding and right border
        for n, c in enumerate(columns):
            widest = max([len(c.name) if header else 1, *(len(row[n]) for row in texts)])
            # Unfolded columns keep every character: a clipped key or number reads as another value.
            width = min(widest, _FOLDED) if c.fold else widest
            need += width + 3
            table.add_column(
                c.name,
                justify="right" if c.numeric else "left",
                overflow="fold",
                no_wrap=not c.fold,
                min_width=None if c.fold else widest,
            )
        for row in texts:
            table.add_row(*(Text(v) for v in row))
        console = self.console if need <= self.console.width else Console(width=need, file=self.console.file)
        console.print(table)
