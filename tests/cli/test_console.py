"""The commands' console off a terminal (a CI log, a file): tables whole, $COLUMNS honoured."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Group
from rich.table import Table
from rich.text import Text

from loadgen.cli.options import PIPED_WIDTH, output_console


def wide_table(columns: int) -> Table:
    """A table of `columns` no-wrap columns of 12 characters: about 13 per column wide."""
    table = Table(title="wide")
    for index in range(columns):
        table.add_column(f"column {index:02d}", no_wrap=True)
    table.add_row(*(f"100.0% {index:05d}" for index in range(columns)))
    return table


def printed(monkeypatch: pytest.MonkeyPatch, *objects: object, columns: str | None) -> str:
    """What `output_console` prints with stdout a file (not a terminal)."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    output_console().print(*objects)
    return out.getvalue()


def test_a_table_wider_than_the_log_is_printed_whole_not_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 12-column table (~170 wide) piped to a file keeps every cell whole (it was cut to
    120 columns: `100.…`, `judg…`); text around it wraps at the table's width."""
    text = printed(monkeypatch, Group(wide_table(12), Text("x " * 100)), columns=None)
    assert "…" not in text
    assert all(f"100.0% {index:05d}" in text for index in range(12))
    widest = max(len(line.rstrip()) for line in text.splitlines())
    assert widest > PIPED_WIDTH


def test_columns_sets_the_width_of_text_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """$COLUMNS is the width text wraps at in a log (it was ignored for 120); a narrow
    table stays within it, a wider one is still printed whole."""
    text = printed(monkeypatch, Text("word " * 40), columns="60")
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 60
    assert "…" not in printed(monkeypatch, wide_table(8), columns="60")
    default = printed(monkeypatch, Text("word " * 40), columns=None)
    assert max(len(line.rstrip()) for line in default.splitlines()) == PIPED_WIDTH - 1
