"""Spec tables: named sets of param tuples that a spec's constraints test membership in, read
from a tile table file, so that a family's tiles are declared once, in the file its op reads.

A spec's ``tables:`` maps a name to ``{file, columns}``. ``file`` (relative to the spec) is a
YAML mapping: ``params`` names a row's values in order, and ``tiles`` maps names to lists of
rows, where a list of rows inside a list (a YAML alias of another list) stands for its rows.
The file's other keys belong to its other reader (the op) and are not read here. The table is
the distinct rows' values of ``columns``, in the order first seen, as a tuple of tuples; a
constraint names it where it would write that literal: ``(block_m, tile_n) in tiles``. Every
value a row gives a param must be among the spec's values of it, or the row could never be
built: a fault, as is a row of the wrong length or a column the file does not name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from b12x_aot.contract import Expr, ExpressionError, short_repr

from ._spec_yaml import Faults, compose, read_text
from .errors import SpecError

__all__ = ["read_tables", "table_constraint"]

_SCALARS = (int, str, bool)


class _TableFault(Exception):
    """A problem in a table file, at its line."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(line, message)
        self.line, self.message = line, message


def read_tables(
    spec_path: Path,
    tables: Mapping[str, tuple[str, Sequence[str]]],
    params: Mapping[str, Sequence[Any]],
    reserved: Sequence[str],
    faults: Faults,
) -> dict[str, Expr]:
    """Each of ``tables`` (name -> (file, columns)) as the expression of its tuple literal; a
    table that cannot be read is a fault at its entry and is left out. ``reserved`` are the
    other names constraints read (the arch), which no table may take."""
    out: dict[str, Expr] = {}
    for name, (file, columns) in tables.items():
        where = ("tables", name)
        if not name.isidentifier() or "__" in name or name in params or name in reserved:
            faults.add(where, f"must be an identifier without '__' that names no param (got {name!r})")
            continue
        if len(set(columns)) != len(columns):
            faults.add((*where, "columns"), f"lists a param twice: {list(columns)}")
            continue
        path = spec_path.parent / file
        try:
            rows = _read_rows(path, columns, params)
            literal = Expr.parse(repr(tuple(dict.fromkeys(rows))))
        except _TableFault as exc:
            faults.add(
                (*where, "file"),
                f"{file}:{exc.line}: {exc.message}" if exc.line else f"{file}: {exc.message}",
            )
            continue
        except SpecError as exc:  # the file cannot be read, or is not YAML
            faults.add((*where, "file"), "; ".join(f"{file}:{f.line}: {f.message}" for f in exc.faults))
            continue
        except ExpressionError as exc:
            faults.add(where, f"is too large for a constraint to read: {exc.reason}")
            continue
        out[name] = literal
    return out


def table_constraint(
    faults: Faults, where: tuple[Any, ...], source: str, names: Sequence[str], tables: Mapping[str, Expr]
) -> Expr | None:
    """The constraint ``source`` over ``names`` and the tables, each table it names replaced by
    its tuple literal; a fault at ``where`` (and None) when it cannot be."""
    expr = faults.expr(where, source, [*names, *tables])
    if expr is None:
        return None
    try:
        return expr.substitute(tables)
    except ExpressionError as exc:
        faults.add(where, f"with its tables substituted: {exc.reason}")
        return None


def _read_rows(
    path: Path, columns: Sequence[str], params: Mapping[str, Sequence[Any]]
) -> list[tuple[Any, ...]]:
    """The values of ``columns`` in every row of the table file at ``path``, checked."""
    data, lines = compose(read_text(path), path)
    if not isinstance(data, dict) or not isinstance(data.get("tiles"), dict) or not data["tiles"]:
        raise _TableFault(
            1, "must be a mapping with params (a list of names) and tiles (named lists of rows)"
        )
    names = data.get("params")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _TableFault(
            lines.get(("params",), 1),
            f"params must list the names of a row's values (got {short_repr(names)})",
        )
    unknown = [n for n in (*names, *columns) if n not in params]
    if unknown:
        raise _TableFault(
            lines.get(("params",), 1),
            f"names {', '.join(dict.fromkeys(unknown))}, which this spec has no param of",
        )
    missing = [c for c in columns if c not in names]
    if missing:
        raise _TableFault(
            lines.get(("params",), 1), f"its params do not name the column(s) {', '.join(missing)}"
        )
    allowed = {n: {(type(v), v) for v in params[n]} for n in names}
    picked = [names.index(c) for c in columns]
    rows = []
    for line, row in _rows(data["tiles"], ("tiles",), lines):
        if len(row) != len(names):
            raise _TableFault(line, f"row {short_repr(row)} has {len(row)} values; params names {len(names)}")
        for name, value in zip(names, row, strict=True):
            if (type(value), value) not in allowed[name]:
                raise _TableFault(
                    line,
                    f"row {short_repr(row)} has {name}={value!r}, which the spec's params.{name} does not "
                    "list: it could never be built",
                )
        rows.append(tuple(row[i] for i in picked))
    return rows


def _rows(
    items: Any, where: tuple[Any, ...], lines: Mapping[tuple[Any, ...], int]
) -> Iterator[tuple[int, list[Any]]]:
    """``(line, row)`` of every row under ``items``; a list of lists is spliced in."""
    if isinstance(items, dict):
        for key, value in items.items():
            yield from _rows(value, (*where, key), lines)
        return
    if not isinstance(items, list) or not items:
        raise _TableFault(lines.get(where, 1), f"{_dotted(where)} must be a non-empty list of rows")
    for i, item in enumerate(items):
        if isinstance(item, list) and item and all(isinstance(v, list) for v in item):
            yield from _rows(item, (*where, i), lines)
        elif isinstance(item, list) and all(isinstance(v, _SCALARS) for v in item):
            yield lines.get((*where, i), 1), item
        else:
            raise _TableFault(
                lines.get((*where, i), 1),
                f"{_dotted((*where, i))} must be a row of values or a list of rows (got {short_repr(item)})",
            )


def _dotted(where: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(where))
