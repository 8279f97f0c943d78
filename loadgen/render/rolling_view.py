"""The rolling-window views: `loadgen report STORE` as a terminal table, plots and a page.

The windows and the runs' own rows are computed by `loadgen.analysis.rolling`; this module
only draws them. The table, the plots and the page show one percentile per class, the
same everywhere: its SLO percentile (p99 for a class without one, or with a percentile the
windows do not keep), over completed requests (ok) and with every failure ranked worst
(all); the plots draw each window as a line and each run as a point of its own. Percentiles
are nearest rank (`analysis.histograms` over the runs' per-minute histograms, or exact).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import polars as pl
from rich import box
from rich.table import Table
from rich.text import Text

from loadgen.analysis.minutes import METRICS
from loadgen.analysis.rolling import WINDOW_CONFIDENCE, WITH_FAILURES, RollingView, to_json
from loadgen.measures import BY_NAME, E2E, ITL, TPOT, TTFT
from loadgen.render import plots
from loadgen.render.cost_view import money
from loadgen.render.report import blocks
from loadgen.render.report.html import page_html
from loadgen.render.report.markdown import page_markdown
from loadgen.render.terminal import fmt_ms
from loadgen.results.runfolder import ROLLING_FILE, ROLLING_HTML, ROLLING_MD, rolling_plot_file
from loadgen.results.store import RunEntry
from loadgen.workload.spec import SloTargets

# The SLOs of a store's classes, keyed by (workload key, class), or by class name alone.
Slos = Mapping[Any, SloTargets]
PLOTTED = (TTFT.name, TPOT.name)  # one PNG each


def shown_percentile(slo: SloTargets | None, columns: Collection[str]) -> float:
    """The percentile shown for a class: its SLO's, where the windows keep it, else 99."""
    p = slo.percentile if slo is not None else 99.0
    return p if f"{TTFT.column}_p{p:g}" in columns else 99.0


def slo_of(slos: Slos, workload: str, cls: str) -> SloTargets | None:
    """A class's SLO: its workload's, else the first of that class name."""
    return slos.get((workload, cls), slos.get(cls))


def render_rolling_table(frame: pl.DataFrame, slos: Slos | None = None) -> Table:
    """One row per window and class, at the class's SLO percentile (column p): latencies in
    ms over ok requests / with failures ranked worst, the TTFT's 95 % one-sided bounds from
    the window's merged histograms, and attainment."""
    slos = slos or {}
    table = Table(
        title=_title(frame),
        title_justify="left",
        caption=_caption(frame),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("window end", no_wrap=True)
    table.add_column("workload", no_wrap=True)
    table.add_column("class", no_wrap=True)
    for header in ("runs", "reqs", "failed", "p", *FIGURE_HEADERS):
        table.add_column(header, justify="right", no_wrap=True)
    if "max_rel_diff" in frame.columns:
        table.add_column("Δ exact", justify="right", no_wrap=True)
    priced = _has_cost(frame)
    if priced:
        table.add_column("cost/M\ngood tok", justify="right", no_wrap=True)
    for row in frame.iter_rows(named=True):
        p = shown_percentile(slo_of(slos, row["workload"], row["class"]), frame.columns)
        cells: list[str | Text] = [_window_end(row["window_end"]), row["workload"], row["class"],
                                   str(row["runs"]), *_figure_cells(row, p)]  # fmt: skip
        if "max_rel_diff" in row:
            diff = row["max_rel_diff"]
            cells.append(f"{diff * 100:.3f}%" if diff is not None else "—")
        if priced:
            cells.append(money(row.get("cost_per_million_good_output_tokens")))
        table.add_row(*cells)
    return table


FIGURE_HEADERS = (f"{TTFT.label}\nok/all", f"{WINDOW_CONFIDENCE:.0%} bounds\n{TTFT.label} all",
                  f"{TPOT.label}\nok/all", f"{ITL.label}\n(gaps)", f"{E2E.label}\nall",
                  "attain")  # fmt: skip


def _figure_cells(row: Mapping[str, Any], p: float) -> list[str | Text]:
    """reqs, failed, p, then FIGURE_HEADERS' cells of a window's (or a run's) row."""
    failed = row["failures"]
    return [
        str(row["requests"]),
        Text(str(failed), style="red" if failed else ""),
        f"p{p:g}",
        _ok_and_all(row, TTFT.name, p),
        _bounds(row, f"{TTFT.with_failures}_p{p:g}"),
        _ok_and_all(row, TPOT.name, p),
        _ms(row[f"{ITL.column}_p{p:g}"]),
        _all(row, E2E.name, p),
        f"{row['attainment'] * 100:.1f}%" if row["attainment"] is not None else "—",
    ]


def _has_cost(frame: pl.DataFrame) -> bool:
    """Some window's runs had a price (`run --price-per-hour`): the cost column is shown."""
    column = "cost_per_million_good_output_tokens"
    return column in frame.columns and frame.get_column(column).drop_nulls().len() > 0


def _title(frame: pl.DataFrame) -> str:
    if frame.height == 0:
        return "rolling windows: none"
    first = frame.row(0, named=True)
    span = first["window_end"] - first["window_start"]
    return (
        f"trailing {_fmt_span(span)} windows · each class at its SLO percentile p · latencies in ms"
    )


READING = (
    "p: the class's SLO percentile (p99 without one), nearest rank; ok: over completed "
    "requests; all: every failure ranked worst (fail: the percentile falls on one)"
)


def _fmt_span(span: timedelta) -> str:
    minutes = int(span.total_seconds() // 60)
    for unit, size in (("d", 1440), ("h", 60)):
        if minutes % size == 0:
            return f"{minutes // size}{unit}"
    return f"{minutes}m"


def _caption(frame: pl.DataFrame) -> str | None:
    """How to read the table, and the runs read from their records."""
    if frame.height == 0:
        return None
    runs = sorted(set(frame.get_column("fallback_runs").explode().drop_nulls().to_list()))
    fallback = f"\nread from records (no histograms.parquet): {', '.join(runs)}" if runs else ""
    return READING + fallback


def _window_end(end: datetime) -> str:
    return (
        end.strftime("%Y-%m-%d") if end.hour == end.minute == 0 else end.strftime("%Y-%m-%d %H:%M")
    )


def _ms(value: float | None) -> str:
    return fmt_ms(value if value is not None and math.isfinite(value) else None)


def _all(row: Mapping[str, Any], metric: str, p: float) -> Text:
    """The percentile with failures ranked worst: `fail` in red where it falls on one."""
    value = row[f"{metric}_ms_with_failures_p{p:g}"]
    if not row["requests"]:
        return Text("—")
    if value is not None and math.isinf(value):
        return Text("fail", style="bold red")
    return Text(_ms(value))


def _ok_and_all(row: Mapping[str, Any], metric: str, p: float) -> Text:
    """`ok/all`: the percentile over completed requests, then with failures ranked worst."""
    return Text.assemble(_ms(row[f"{metric}_ms_p{p:g}"]), "/", _all(row, metric, p))


def _bounds(row: Mapping[str, Any], figure: str) -> str:
    """`79.2–92.6`, `79.2–open` (too few requests for an upper bound), `79.2–fail`: the
    bounds of `figure` (`{figure}_low`, `_high`; "—" for a window without requests or a
    frame written without bounds)."""
    low, high = row.get(f"{figure}_low"), row.get(f"{figure}_high")
    if not row["requests"] or f"{figure}_low" not in row:
        return "—"

    def side(value: float | None) -> str:
        return "open" if value is None else "fail" if math.isinf(value) else _ms(value)

    return f"{side(low)}–{side(high)}"


def left_out_line(invalid: Sequence[RunEntry]) -> str:
    """The runs the windows left out, each with why it is no measure of the server."""
    return "left out, no measure of the server (--include-incomplete pools them): " + "; ".join(
        f"{r.run_id} ({r.invalid})" for r in invalid
    )


def rolling_files(view: RollingView, slos: Slos, notes: Sequence[str] = ()) -> dict[str, bytes]:
    """rolling-ttft.png, rolling-tpot.png, rolling.json, rolling.md and rolling.html, in that
    order, for the command to write (`results.write.write_files`); `notes` (what was left
    out) head the pages."""
    pngs = {metric: rolling_plot(view.windows, slo_ms=slos, metric=metric, runs=view.runs)
            for metric in PLOTTED}  # fmt: skip
    files = {rolling_plot_file(metric): png for metric, png in pngs.items()}
    files[ROLLING_FILE] = (json.dumps(to_json(view.windows), indent=2) + "\n").encode("utf-8")
    page = rolling_page(view, slos, notes)
    files[ROLLING_MD] = page_markdown(page).encode("utf-8")
    figures = {rolling_plot_file(m).removesuffix(".png"): png for m, png in pngs.items()}
    files[ROLLING_HTML] = page_html("loadgen rolling view", page, figures).encode("utf-8")
    return files


def rolling_page(view: RollingView, slos: Slos, notes: Sequence[str] = ()) -> list[blocks.Block]:
    """The rolling view as report blocks: what it pools, the windows table, both plots, and
    every run's own row (each a point on the plots)."""
    windows, runs = view.windows, view.runs
    columns = windows.columns
    window_rows = [
        (_window_end(r["window_end"]), r["workload"], r["class"], str(r["runs"]),
         *_plain(_figure_cells(r, _p(slos, r, columns))))
        for r in windows.iter_rows(named=True)
    ]  # fmt: skip
    run_rows = [
        (_when(r["run_started"]), r["workload"], r["class"], r["run_id"],
         *_plain(_figure_cells(r, _p(slos, r, columns))))
        for r in runs.iter_rows(named=True)
    ]  # fmt: skip
    started = sorted(runs.get_column("run_started").to_list())
    pooled = (
        f"{len(set(runs.get_column('run_id'))):,} runs, started {_when(started[0])} to "
        f"{_when(started[-1])}" if started else "no runs"
    )  # fmt: skip
    intro = f"{_title(windows)}. {READING}. Pooled: {pooled}; two workloads are never pooled."
    page: list[blocks.Block] = [
        blocks.Heading(1, "loadgen rolling view"),
        blocks.Para(intro),
        *(blocks.Para(note, tone="warn") for note in notes),
        blocks.Table("Windows", _page_headers("window end"), window_rows),
    ]
    for metric in PLOTTED:
        caption = (f"{metric.upper()} over the windows (lines) and each run (points), at "
                   "each class's SLO percentile")  # fmt: skip
        page.append(blocks.Figure(rolling_plot_file(metric).removesuffix(".png"), caption))
    page.append(blocks.Table("Runs (each a point on the plots)", _page_headers("run started"),
                             run_rows))  # fmt: skip
    return page


def _page_headers(first: str) -> tuple[str, ...]:
    fourth = "runs" if first == "window end" else "run"
    return (first, "workload", "class", fourth, "reqs", "failed", "p",
            *(h.replace("\n", " ") for h in FIGURE_HEADERS))  # fmt: skip


def _p(slos: Slos, row: Mapping[str, Any], columns: Collection[str]) -> float:
    return shown_percentile(slo_of(slos, row["workload"], row["class"]), columns)


def _plain(cells: Sequence[str | Text]) -> list[str]:
    return [c.plain if isinstance(c, Text) else c for c in cells]


def _when(value: datetime | None) -> str:
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M UTC")


def rolling_plot(
    frame: pl.DataFrame,
    *,
    slo_ms: Slos,
    metric: str = TTFT.name,
    runs: pl.DataFrame | None = None,
) -> bytes:
    """PNG: the windowed percentile of `metric` (top) and attainment (bottom) against the
    window end (lines), each run's own (points, at its start), each workload's class with
    its SLO threshold (`slo_ms` keyed by (workload key, class), or by class name). A line is
    labelled by its class, and by its workload too when the frame holds several.

    The percentile is the class's SLO percentile (`shown_percentile`, as the table shows),
    with failures ranked worst where the metric allows it (ITL does not); a window or run
    whose percentile falls on a failure is a red triangle at the top edge.
    """
    figure = rolling_figure(frame, slo_ms=slo_ms, metric=metric, runs=runs)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def rolling_figure(
    frame: pl.DataFrame,
    *,
    slo_ms: Slos,
    metric: str = TTFT.name,
    runs: pl.DataFrame | None = None,
) -> Any:
    """`rolling_plot`'s matplotlib figure (a bare `Figure`: nothing global to close)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)} (got {metric!r})")
    figure = Figure(figsize=(10, 6.5), layout="constrained")
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    plotted: list[float] = []
    series = frame.partition_by("workload", "class", as_dict=True, maintain_order=True)
    several = frame.get_column("workload").n_unique() > 1
    for index, ((workload, cls), part) in enumerate(series.items()):
        slo = slo_of(slo_ms, str(workload), str(cls))
        label = f"{cls} · {workload}" if several else str(cls)
        p = shown_percentile(slo, frame.columns)
        points = None
        if runs is not None and runs.height:
            points = runs.filter((pl.col("workload") == workload) & (pl.col("class") == cls))
        axes = (top, bottom)
        plotted += _plot_class(axes, label, part, points, slo, metric, p, f"C{index}")
    for axis in (top, bottom):
        axis.grid(True, alpha=0.3)  # the legend beside the plot, never over a point
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    top.set_ylabel(f"{BY_NAME[metric].label} at the SLO percentile (ms, nearest rank)")
    _scale_latency_axis(top, plotted)
    bottom.set_ylabel("attainment (%)")
    bottom.set_xlabel("window end (lines) · run start (points), UTC")
    figure.suptitle(
        f"{BY_NAME[metric].label} over trailing {_span_text(frame)} windows and each run; "
        "(all) ranks failures worst"
    )
    figure.autofmt_xdate()
    return figure


def _span_text(frame: pl.DataFrame) -> str:
    if frame.height == 0:
        return "no"
    first = frame.row(0, named=True)
    return _fmt_span(first["window_end"] - first["window_start"])


def _plot_class(
    axes: tuple[Any, Any],
    cls: str,
    part: pl.DataFrame,
    points: pl.DataFrame | None,
    slo: SloTargets | None,
    metric: str,
    p: float,
    color: str,
) -> list[float]:
    """One class: its windowed percentile (failures worst, and over completed requests
    dotted) as lines, each run's as points, failures as triangles, its SLO threshold;
    attainment below. Returns the latencies drawn (for the axis scale)."""
    top, bottom = axes
    column = f"{metric}_ms_with_failures_p{p:g}" if metric in WITH_FAILURES else None
    shown = column or f"{metric}_ms_p{p:g}"
    tag = "(all)" if column else "(gaps)"
    ends = part.get_column("window_end").to_list()
    values = part.get_column(shown).to_list()
    top.plot(ends, _finite(values), color=color, marker=".", label=f"{cls} p{p:g} {tag}, windows")
    drawn = _finite(values)
    if column:
        completed = part.get_column(f"{metric}_ms_p{p:g}").to_list()
        top.plot(ends, _finite(completed), color=color, linestyle=":",
                 label=f"{cls} p{p:g} (ok), windows")  # fmt: skip
        drawn += _finite(completed)
    failed = [e for e, v in zip(ends, values, strict=True) if v is not None and math.isinf(v)]
    attainment = [_share(a) for a in part["attainment"].to_list()]
    bottom.plot(ends, attainment, color=color, marker=".", label=f"{cls} attainment, windows")
    if points is not None and points.height:
        started = points.get_column("run_started").to_list()
        own = points.get_column(shown).to_list()
        top.plot(started, _finite(own), "o", color=color, markerfacecolor="none",
                 label=f"{cls} p{p:g} {tag}, each run")  # fmt: skip
        shares = [_share(a) for a in points["attainment"].to_list()]
        bottom.plot(started, shares, "o", color=color, markerfacecolor="none",
                    label=f"{cls} attainment, each run")  # fmt: skip
        failed += [s for s, v in zip(started, own, strict=True) if v is not None and math.isinf(v)]
        drawn += _finite(own)
    if failed:
        top.plot(failed, [1.0] * len(failed), "v", color="red", clip_on=False,
                 transform=top.get_xaxis_transform(),
                 label=f"{cls} p{p:g} falls on a failure")  # fmt: skip
    limit = slo.thresholds_ms().get(f"{metric}_ms") if slo is not None else None
    if limit is not None:
        at = f"p{slo.percentile:g}" if slo is not None else ""
        top.axhline(limit, color=color, linestyle="--", label=f"{cls} SLO {limit:g} ms at {at}")
        drawn.append(limit)
    if slo is not None and slo.thresholds_ms():
        bottom.axhline(slo.percentile, color=color, linestyle="--", label=f"{cls} {p:g} %")
    return drawn


def _share(value: float | None) -> float:
    return value * 100 if value is not None else math.nan


def _scale_latency_axis(axis: Any, values_ms: Sequence[float]) -> None:
    """Linear from 0, or logarithmic when the SLO line and the data are > 10x apart (a 9 ms
    p99 under a 1 s SLO would otherwise sit flat on the floor)."""
    ys = [y for y in values_ms if math.isfinite(y) and y > 0]
    if ys and max(ys) / min(ys) > 10:
        plots.log_scale(axis, "y")
    else:
        axis.set_ylim(bottom=0)


def _finite(values: Sequence[float | None]) -> list[float]:
    """None and ±inf as NaN: matplotlib leaves a gap."""
    return [v if v is not None and math.isfinite(v) else math.nan for v in values]
