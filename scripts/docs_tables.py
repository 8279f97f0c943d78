"""Write docs/metrics.md's tables of the record's columns and of the measures from the code.

    python scripts/docs_tables.py           # rewrite the generated blocks
    python scripts/docs_tables.py --check   # exit 1 when a block differs

The columns come from `RequestRecord`'s fields (`loadgen.results.records.COLUMNS`), the
measures from `loadgen.measures.MEASURES`. Each table sits between `<!-- begin: NAME ... -->`
and `<!-- end: NAME -->`; everything else on the page is written by hand.
`tests/project/test_tables.py` fails when a block differs from what this would write.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path

import polars as pl

from loadgen.measures import GAP, MEASURES, Measure
from loadgen.results.records import COLUMNS, Column

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "metrics.md"


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
    """The table of the record's columns, in the file's order."""
    rows = ["| column | type | what it holds |", "|---|---|---|"]
    rows += [f"| `{c.name}` | {type_text(c.dtype, time=c.time)} | {c.doc} |" for c in columns]
    return rows


def _spans(m: Measure) -> str:
    if m.per == GAP:
        return f"successive `{m.end}`"
    end = f"`{m.end}`" + (f" (else `{m.end_if_none}`, ok)" if m.end_if_none else "")
    return f"`{m.start}` → {end}"


def measure_rows(measures: tuple[Measure, ...] = MEASURES) -> list[str]:
    """The table of the measures, in the table's order."""
    per = {"request": "request", "token": "token (N > 1)", "gap": "gap"}
    rows = [
        "| measure | key | from → to | per | failures ranked worst | can carry an SLO "
        "| what it is |",
        "|---|---|---|---|---|---|---|",
    ]
    rows += [
        f"| {m.label} (`{m.name}`) | `{m.column}` | {_spans(m)} | {per[m.per]} | "
        f"{'yes' if m.failures_worst else 'no'} | {'yes' if m.slo else 'no'} | {m.about} |"
        for m in measures
    ]
    return rows


BLOCKS: dict[str, Callable[[], list[str]]] = {
    "the record's columns": column_rows,
    "the measures": measure_rows,
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- begin: {re.escape(name)} [^>]*-->\n)(.*?)(\n<!-- end: {re.escape(name)} -->)", re.S
    )


def block_of(text: str, name: str) -> list[str] | None:
    """The lines of block `name` in a page's text (None: the page has no such block)."""
    found = _block(name).search(text)
    return found.group(2).splitlines() if found else None


def regenerated(text: str) -> str:
    """The page's text with every block written from the code."""
    for name, rows in BLOCKS.items():
        if block_of(text, name) is None:
            raise SystemExit(
                f"{PAGE.name} has no block <!-- begin: {name} ... --> ... <!-- end: {name} -->"
            )
        body = "\n".join(rows())
        text = _block(name).sub(lambda m, body=body: m.group(1) + body + m.group(3), text)
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when stale")
    args = parser.parse_args()
    text = PAGE.read_text(encoding="utf-8")
    written = regenerated(text)
    if written == text:
        return 0
    if args.check:
        print(f"{PAGE.relative_to(ROOT)}: differs from the column and measure tables")
        return 1
    PAGE.write_text(written, encoding="utf-8")
    print(f"{PAGE.relative_to(ROOT)}: written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
