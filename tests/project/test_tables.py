"""The docs' list of record columns is the column table's own: generated from it, checked here."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from loadgen.results.records import COLUMNS, Column

ROOT = Path(__file__).resolve().parents[2]
METRICS_DOC = ROOT / "docs" / "metrics.md"
COLUMNS_BLOCK = "the record's columns"


def type_text(dtype: pl.DataType, *, time: bool = False) -> str:
    """A column's type as the docs give it: `int64`, `list of int64`, `int64 ns since t0`."""
    if isinstance(dtype, pl.List):
        return f"list of {type_text(dtype.inner, time=time)}"
    if isinstance(dtype, pl.Struct):
        groups: dict[str, list[str]] = {}
        for f in dtype.fields:
            groups.setdefault(type_text(f.dtype), []).append(f"`{f.name}`")
        return "struct: " + "; ".join(f"{', '.join(n)} {t}" for t, n in groups.items())
    name = {pl.Boolean: "bool"}.get(type(dtype), str(dtype).lower())
    return f"{name} ns since t0" if time else name


def column_rows(columns: tuple[Column, ...] = COLUMNS) -> list[str]:
    """The docs' table of the record's columns, in the file's order."""
    rows = ["| column | type | what it holds |", "|---|---|---|"]
    rows += [f"| `{c.name}` | {type_text(c.dtype, time=c.time)} | {c.doc} |" for c in columns]
    return rows


def generated_block(page: Path, name: str) -> list[str]:
    """The lines of `page` between `<!-- begin: NAME -->` and `<!-- end: NAME -->`."""
    text = page.read_text(encoding="utf-8")
    found = re.search(rf"<!-- begin: {name} [^>]*-->\n(.*?)\n<!-- end: {name} -->", text, re.S)
    assert found, f"{page.name} has no block <!-- begin: {name} ... --> ... <!-- end: {name} -->"
    return found.group(1).splitlines()


def test_the_docs_list_every_record_column_as_the_table_declares_it() -> None:
    """docs/metrics.md's column list is the table rendered: a column added, renamed or
    redocumented in `RequestRecord` shows there (or this fails, printing the block to paste)."""
    expected = column_rows()
    assert generated_block(METRICS_DOC, COLUMNS_BLOCK) == expected, (
        f"docs/metrics.md's {COLUMNS_BLOCK} differ from the column table; paste:\n"
        + "\n".join(expected)
    )


def test_the_docs_check_fails_on_a_column_the_docs_miss() -> None:
    """The check above can fail: with a column more than the docs hold, the block differs."""
    extra = Column(name="first_body_ns", attribute="first_body_ns", dtype=pl.Int64(),
                   doc="its first body byte", time=True)  # fmt: skip
    assert generated_block(METRICS_DOC, COLUMNS_BLOCK) != column_rows((*COLUMNS, extra))
    assert "| `first_body_ns` | int64 ns since t0 | its first body byte |" in column_rows(
        (*COLUMNS, extra)
    )
