"""The one output helper: rich tables on a terminal, one tab-separated line per row when piped."""

from __future__ import annotations

import pytest

from b12x_aot.registry import Column, Output

KEY = "ab" * 32
COLUMNS = (Column("key", width=12), Column("params", fold=True), Column("regs", numeric=True))
ROWS = [(KEY, "topk=8,hidden=7168\tand\nmore", 32), ("cd" * 32, "topk=2", None)]


def test_piped_rows_are_whole_lines_and_titles_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    Output(terminal=False).table("2 variant(s)", COLUMNS, ROWS, limit=1)
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{KEY}\ttopk=8,hidden=7168 and more\t32", f"{'cd' * 32}\ttopk=2\t"]
    assert err.splitlines() == ["2 variant(s)", "key\tparams\tregs"]  # every row: no limit piped


def test_a_terminal_gets_a_rich_table_with_short_keys(capsys: pytest.CaptureFixture[str]) -> None:
    Output(terminal=True).table("2 variant(s)", COLUMNS, ROWS, limit=1)
    out, _ = capsys.readouterr()
    assert "┃ key " in out and KEY[:12] in out and KEY[:13] not in out
    assert "2 variant(s) (first 1 shown)" in out and "cd" * 6 not in out


def test_a_long_piped_line_is_never_wrapped(capsys: pytest.CaptureFixture[str]) -> None:
    text = "would delete: " + "x" * 300
    Output(terminal=False).line(text)
    assert capsys.readouterr().out == text + "\n"
