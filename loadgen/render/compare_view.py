"""`loadgen compare` for people: the terminal table with its notes and verdict, and the
Markdown table for a CI job summary (`junit` writes the same checks as JUnit XML).

Pure functions of a `analysis.compare.Comparison`; percentiles are nearest rank, with
order-statistic intervals (see `analysis.compare`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from loadgen.analysis.compare import (
    Check,
    CheckResult,
    Comparison,
    Tolerance,
    Verdict,
)
from loadgen.analysis.confidence import Estimate, min_samples
from loadgen.analysis.server import ServerDelta, ServerThreshold
from loadgen.render.cost_view import money
from loadgen.render.split_view import cause_text, moved_part, moved_text
from loadgen.render.terminal import fmt_ms, fmt_num


def format_value(check: Check, value: float | None) -> str:
    """A value in the check's unit: ms as `fmt_ms`, shares as %, rates per second."""
    if value is None:
        return "—"
    if math.isinf(value):
        return "fail"
    if check.kind == "latency":
        return fmt_ms(value)
    if check.kind == "share":
        return f"{value * 100:.1f}%"
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def format_estimate(check: Check, e: Estimate) -> str:
    """`value [low, high]`; an open side shows the sample's extreme with `<` or `>`."""
    if e.value is None:
        return "—"
    low = ("<" if e.low_open else "") + format_value(check, e.low)
    high = (">" if e.high_open else "") + format_value(check, e.high)
    if check.kind == "share":  # one % sign for the three numbers keeps the column narrow
        low, high = low.removesuffix("%"), high.removesuffix("%")
    return f"{format_value(check, e.value)} [{low}, {high}]"


def format_change(result: CheckResult) -> str:
    """Relative change in % (shares: in percentage points); "fail" when a side is a failure."""
    change = result.change
    if change is None:
        return "—"
    if math.isinf(change):
        return "+fail" if change > 0 else "-fail"
    if result.check.kind == "share":
        return fmt_num(change * 100, 1, sign=True) + " pp"
    relative = result.change_relative
    if relative is None:
        return f"{change:+g}"
    return fmt_num(relative, 1, sign=True, percent=True)


def format_tolerance(check: Check, tolerance: Tolerance) -> str:
    """The limits a change must exceed, signed in the worse direction: `+10% and +2 ms`."""
    sign = "+" if check.higher_is_worse else "-"
    parts = []
    if tolerance.relative is not None:
        parts.append(f"{sign}{tolerance.relative * 100:g}%")
    if tolerance.absolute is not None:
        unit = " pp" if check.kind == "share" else " ms"
        scale = 100 if check.kind == "share" else 1
        parts.append(f"{sign}{tolerance.absolute * scale:g}{unit}")
    return " and ".join(parts) or "any"


def row_cells(result: CheckResult) -> tuple[str, ...]:
    """One check's row, as `HEADERS` names its cells."""
    check = result.check
    return (
        result.class_name,
        check.label,
        f"{result.baseline.n}/{result.current.n}",
        format_estimate(check, result.baseline),
        format_estimate(check, result.current),
        format_change(result),
        format_tolerance(check, result.tolerance),
        str(result.verdict),
    )


HEADERS = (
    "class",
    "metric",
    "n base/cur",
    "baseline [CI]",
    "current [CI]",
    "change",
    "tolerance",
    "verdict",
)
_STYLE = {
    Verdict.OK: "green",
    Verdict.IMPROVED: "bold green",
    Verdict.REGRESSED: "bold red",
    Verdict.NO_DATA: "yellow",
}


def verdict_line(comparison: Comparison) -> str:
    """`no regression (exit 0)` or `REGRESSED: chat TTFT p50, ... (exit 2)`."""
    bad = comparison.regressions
    if not bad:
        return f"verdict: no regression (exit {comparison.exit_code})"
    names = ", ".join(f"{r.class_name} {r.check.label}" for r in bad)
    return f"verdict: REGRESSED: {names} (exit {comparison.exit_code})"


def _notes(comparison: Comparison) -> list[str]:
    notes = []
    if comparison.forced:
        differ = "; ".join(comparison.workload_differences)
        notes.append(
            f"FORCED: different workloads ({comparison.baseline_workload} vs "
            f"{comparison.current_workload}{': ' + differ if differ else ''}); a change may "
            "be the workload's, not the server's"
        )
    if comparison.left_out:
        notes.append("left out of the baseline window (another workload, stopped early, or "
                     f"damaged): {', '.join(comparison.left_out)}")  # fmt: skip
    if comparison.incomplete:
        notes.append(f"includes runs that stopped early (partial figures): "
                     f"{', '.join(comparison.incomplete)}")  # fmt: skip
    if comparison.only_in_baseline:
        notes.append(f"only in baseline, not compared: {', '.join(comparison.only_in_baseline)}")
    if comparison.only_in_current:
        notes.append(f"only in current, not compared: {', '.join(comparison.only_in_current)}")
    notes.extend(cost_notes(comparison))
    notes.extend(split_notes(comparison))
    no_data = sum(r.verdict is Verdict.NO_DATA for r in comparison.results)
    if no_data:
        need = min_samples(0.99, comparison.confidence)[1]
        notes.append(
            f"{no_data} checks: not enough data (an interval the test needs reaches beyond the "
            f"sample: at {comparison.confidence:.0%} a p99 needs >= {need} baseline values)"
        )
    return notes


def cost_notes(comparison: Comparison) -> list[str]:
    """One line per class (and `all`): cost per M good and per M output tokens, both sides."""
    lines = []
    for c in comparison.cost:
        change = c.change_relative
        moved = "" if change is None else f" ({fmt_num(change, 1, sign=True, percent=True)})"
        lines.append(
            f"cost {c.class_name}: {money(c.baseline_per_million_good)} → "
            f"{money(c.current_per_million_good)} per M good output tokens{moved}; "
            f"{money(c.baseline_per_million)} → {money(c.current_per_million)} per M output tokens"
        )
    if lines:
        lines.append("cost is information, not a check: at one price it moves with goodput, "
                     "whose check judges it")  # fmt: skip
    return lines


def split_notes(comparison: Comparison) -> list[str]:
    """Per class whose server said, where its TTFT went on each side and which part moved:
    `where chat's TTFT p90 went, baseline → current: queue 20 → 900 (+880), …; queue moved
    most → queueing: …`; a side whose server said nothing is named."""
    lines = []
    for c in comparison.splits:
        head = f"where {c.class_name}'s TTFT p{c.percentile:g} went, baseline → current"
        if c.baseline is None or c.current is None:
            silent = "baseline" if c.baseline is None else "current"
            lines.append(f"{head}: the {silent} server said no request's queue and prefill")
            continue
        moved = replace(c.current, cause=moved_part(c.baseline, c.current))
        counts = f"{c.baseline_requests:,} → {c.current_requests:,} requests split"
        lines.append(f"{head} ({counts}): {moved_text(c.baseline, c.current)} → "
                     f"{cause_text(moved)}")  # fmt: skip
    return lines


def _title(comparison: Comparison) -> str:
    workload = (
        f"FORCED across workloads {comparison.baseline_workload} → {comparison.current_workload}"
        if comparison.forced
        else f"workload {comparison.current_workload}"
    )
    return (
        f"compare {comparison.baseline} → {comparison.current} · {workload} · "
        f"{comparison.confidence:.0%} intervals · latencies in ms"
    )


def render_table(comparison: Comparison) -> RenderableType:
    """The terminal table, notes and the verdict line."""
    table = Table(
        title=_title(comparison),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    for header in HEADERS:
        right = header in ("n base/cur", "change")
        table.add_column(header, justify="right" if right else "left", no_wrap=True)
    for result in comparison.results:
        cells = row_cells(result)
        table.add_row(*cells[:-1], Text(cells[-1], style=_STYLE[result.verdict]))
    style = "bold red" if comparison.regressions else "bold green"
    parts: list[RenderableType] = [table, *(Text(n, style="dim") for n in _notes(comparison))]
    return Group(*parts, Text(verdict_line(comparison), style=style))


def render_markdown(comparison: Comparison) -> str:
    """A heading, the table (for a CI job summary) and the notes."""
    verdict = "REGRESSED" if comparison.regressions else "no regression"
    lines = [f"### loadgen compare: {verdict}", "", md_cell(_title(comparison)), ""]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append(
        "|" + "|".join("---:" if h in ("n base/cur", "change") else "---" for h in HEADERS) + "|"
    )
    for result in comparison.results:
        cells = [md_cell(c) for c in row_cells(result)]
        if result.verdict is Verdict.REGRESSED:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    lines.extend(
        [
            "",
            *(f"- {md_cell(n)}" for n in _notes(comparison)),
            "",
            md_cell(verdict_line(comparison)),
        ]
    )
    return "\n".join(lines) + "\n"


def render_not_compared_markdown(why: str, *, first_night: bool) -> str:
    """`compare --markdown` when nothing was compared: no baseline yet, or a side refused."""
    head = "no baseline yet" if first_night else "not compared"
    return f"### loadgen compare: {head}\n\n{md_cell(why)}\n"


# What Markdown reads as markup in a line of text: a backslash, code, emphasis (`_` only at
# a word's edge: `ttft_ms` is plain text), links and images (`[`, `]`), a table cell's end,
# strikethrough. Each is escaped with a backslash; `&` and `<` become entities (no HTML, no
# autolink; a lone `>` is plain text). `![x](http://…)` and `[click](javascript:…)` are then
# text, not markup.
_MARKUP = re.compile(r"[\\`*\[\]|~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def md_cell(text: str) -> str:
    """`text` (a server's included: finish reasons, error bodies) as Markdown shows it
    literally, in a table cell or a line: nothing in it is markup, and it is one line. The
    one escape of every Markdown file loadgen writes (report.md, --markdown, compare)."""
    entities = text.replace("&", "&amp;").replace("<", "&lt;")
    escaped = _MARKUP.sub(lambda m: "\\" + m.group(), entities)
    return escaped.replace("\r", " ").replace("\n", " ")


def render_server_table(deltas: Sequence[ServerDelta]) -> RenderableType:
    """The server's side of the comparison: each figure on both sides and its change;
    `informational` unless a --server-threshold was set for it."""
    table = Table(title="server (/metrics): informational unless --server-threshold",
                  title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1), collapse_padding=True)  # fmt: skip
    for header in ("figure", "baseline", "current", "change", "threshold", "verdict"):
        table.add_column(header, justify="left" if header == "figure" else "right")
    for d in deltas:
        verdict = "REGRESSED" if d.regressed else ("ok" if d.threshold else "info")
        style = "bold red" if d.regressed else ("green" if d.threshold else "dim")
        table.add_row(d.figure, _server_value(d.baseline), _server_value(d.current),
                      _server_value(d.change, signed=True), _threshold_text(d.threshold),
                      Text(verdict, style=style))  # fmt: skip
    return table


def _server_value(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def _threshold_text(threshold: ServerThreshold | None) -> str:
    if threshold is None:
        return ""
    if threshold.relative is not None:
        return f"+{threshold.relative:.0%}"
    return f"+{threshold.absolute:g}"


def server_json(deltas: Sequence[ServerDelta]) -> dict[str, Any]:
    """The server's side for `--format json`."""
    return {
        d.figure: {
            "baseline": d.baseline,
            "current": d.current,
            "change": d.change,
            "threshold": None
            if d.threshold is None
            else {"relative": d.threshold.relative, "absolute": d.threshold.absolute},
            "verdict": "regressed" if d.regressed else ("ok" if d.threshold else "info"),
        }
        for d in deltas
    }
