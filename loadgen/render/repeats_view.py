"""`run --repeats K` and `compare` of two repeats folders, for people: the between-run
spread of each headline figure (`analysis.repeats`), and two spreads side by side."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from rich import box
from rich.table import Table
from rich.text import Text

from loadgen.analysis.repeats import (
    IMPROVED,
    REGRESSED,
    REPEATS_FILE,
    Change,
    Repeats,
    Spread,
    to_json,
)
from loadgen.render.compare_view import md_cell
from loadgen.render.terminal import fmt_num


def _figure(value: float | None, figure: str) -> str:
    if value is None or not math.isfinite(value):
        return "fail"
    if figure == "attainment":
        return f"{value:.1%}"
    return fmt_num(value, 1 if abs(value) < 1000 else 0)


def _interval(s: Spread, figure: str) -> str:
    if s.low is None or s.high is None:
        return "—"
    return f"{_figure(s.low, figure)}–{_figure(s.high, figure)}"


def spread_table(repeats: Repeats) -> Table:
    """Per class and figure: each run's value, the mean, its t-interval, min–max."""
    runs = len(repeats.run_ids)
    title = (f"between-run spread of {runs} repeats (mean, two-sided t-interval at "
             f"{repeats.level:.0%}, min–max; latencies in ms, failures worst)")  # fmt: skip
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left")
    for header in SPREAD_HEADERS:
        table.add_column(header, justify="left" if header in ("class", "figure") else "right")
    for row in _spread_rows(repeats):
        table.add_row(*row)
    return table


SPREAD_HEADERS = ("class", "figure", "per run", "mean", "interval", "min–max")


def _spread_rows(repeats: Repeats) -> list[tuple[str, ...]]:
    """Per class and figure: each run's value, the mean, its t-interval, min–max."""
    rows: list[tuple[str, ...]] = []
    for name, figures in repeats.figures.items():
        for figure, s in figures.items():
            values = " ".join(_figure(v, figure) for v in s.values)
            spread_text = "—" if s.min is None else (
                f"{_figure(s.min, figure)}–{_figure(s.max, figure)}")  # fmt: skip
            rows.append((name, figure, values, _figure(s.mean, figure), _interval(s, figure),
                         spread_text))  # fmt: skip
    return rows


def spread_markdown(repeats: Repeats) -> list[str]:
    """`spread_table` as Markdown lines (for `run --repeats --markdown`)."""
    runs = len(repeats.run_ids)
    lines = [
        f"**between-run spread of {runs} repeats** (mean, two-sided t-interval at "
        f"{repeats.level:.0%}, min–max; latencies in ms, failures worst)",
        "",
        "| " + " | ".join(SPREAD_HEADERS) + " |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += ["| " + " | ".join(map(md_cell, row)) + " |" for row in _spread_rows(repeats)]
    return lines


def repeats_file(repeats: Repeats) -> dict[str, bytes]:
    """repeats.json, for the command to write (`results.write.write_files`)."""
    return {REPEATS_FILE: (json.dumps(to_json(repeats), indent=2) + "\n").encode("utf-8")}


def changes_table(changes: Sequence[Change], level: float) -> Table:
    """BASELINE repeats against CURRENT repeats: each side's mean and interval, the change
    of means with its Welch interval, and the status."""
    table = Table(box=box.SIMPLE_HEAD, title_justify="left", title=(
        f"repeats compared: means of the runs with their t-intervals at {level:.0%}; the "
        "change with Welch's interval"))  # fmt: skip
    for header in ("class", "figure", "baseline", "current", "change", "interval", "status"):
        table.add_column(header, justify="left" if header in ("class", "figure") else "right")
    for c in changes:
        colour = {REGRESSED: "bold red", IMPROVED: "green"}.get(c.status, "")
        change = "—" if c.change is None else _signed(c.change, c.figure)
        interval = "—" if c.low is None or c.high is None else (
            f"{_signed(c.low, c.figure)}…{_signed(c.high, c.figure)}")  # fmt: skip
        table.add_row(c.class_name, c.figure,
                      f"{_figure(c.baseline.mean, c.figure)} ({_interval(c.baseline, c.figure)})",
                      f"{_figure(c.current.mean, c.figure)} ({_interval(c.current, c.figure)})",
                      change, interval, Text(c.status, style=colour))  # fmt: skip
    return table


def _signed(value: float, figure: str) -> str:
    if figure == "attainment":
        return fmt_num(value * 100, 1, sign=True) + "pp"
    return fmt_num(value, 1, sign=True)
