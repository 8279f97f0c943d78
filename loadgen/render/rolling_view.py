"""The rolling-window views: `loadgen report STORE` as a terminal table and as plots.

The windows themselves are computed by `loadgen.analysis.rolling`; this module only draws
them (p99 and attainment per class against the SLO, each run marked). Percentiles are
nearest rank (`analysis.histograms` over the runs' per-minute histograms, or exact).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import polars as pl
from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from loadgen.analysis.minutes import (
    METRICS,
)
from loadgen.analysis.rolling import WITH_FAILURES, to_json
from loadgen.render.cost_view import money
from loadgen.render.terminal import fmt_ms
from loadgen.results.runfolder import ROLLING_FILE, rolling_plot_file
from loadgen.results.store import RunEntry
from loadgen.workload.spec import SloTargets


def render_rolling_table(frame: pl.DataFrame) -> RenderableType:
    """One row per window and class: latencies in ms; "p99·all" ranks failures worst, beside
    its 95 % one-sided bounds from the window's merged histograms."""
    table = Table(
        title=_title(frame),
        title_justify="left",
        caption=_fallback_note(frame),
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("window end", no_wrap=True)
    table.add_column("workload", no_wrap=True)
    table.add_column("class", no_wrap=True)
    for header in ("runs", "reqs", "failed"):
        table.add_column(header, justify="right", no_wrap=True)
    for header in ("TTFT\np50/p99", "TTFT\np99·all", "95% bounds\nof p99·all", "TPOT\np50/p99",
                   "ITL\np99", "E2E\np99"):  # fmt: skip
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("attain", justify="right", no_wrap=True)
    if "max_rel_diff" in frame.columns:
        table.add_column("Δ exact", justify="right", no_wrap=True)
    priced = _has_cost(frame)
    if priced:
        table.add_column("cost/M\ngood tok", justify="right", no_wrap=True)
    for row in frame.iter_rows(named=True):
        cells = _table_row(row)
        if priced:
            cells.append(money(row.get("cost_per_million_good_output_tokens")))
        table.add_row(*cells)
    return table


def _has_cost(frame: pl.DataFrame) -> bool:
    """Some window's runs had a price (`run --price-per-hour`): the cost column is shown."""
    column = "cost_per_million_good_output_tokens"
    return column in frame.columns and frame.get_column(column).drop_nulls().len() > 0


def _title(frame: pl.DataFrame) -> str:
    if frame.height == 0:
        return "rolling windows: none"
    first = frame.row(0, named=True)
    span = first["window_end"] - first["window_start"]
    return f"trailing {_fmt_span(span)} windows · latencies in ms"


def _fmt_span(span: timedelta) -> str:
    minutes = int(span.total_seconds() // 60)
    for unit, size in (("d", 1440), ("h", 60)):
        if minutes % size == 0:
            return f"{minutes // size}{unit}"
    return f"{minutes}m"


def _fallback_note(frame: pl.DataFrame) -> str | None:
    if frame.height == 0:
        return None
    runs = sorted(set(frame.get_column("fallback_runs").explode().drop_nulls().to_list()))
    return f"read from records (no histograms.parquet): {', '.join(runs)}" if runs else None


def _table_row(row: Mapping[str, Any]) -> list[RenderableType]:
    end: datetime = row["window_end"]
    failed = row["failures"]
    cells: list[RenderableType] = [
        end.strftime("%Y-%m-%d") if end.hour == end.minute == 0 else end.strftime("%Y-%m-%d %H:%M"),
        row["workload"],
        row["class"],
        str(row["runs"]),
        str(row["requests"]),
        Text(str(failed), style="red" if failed else ""),
        f"{_ms(row['ttft_ms_p50'])}/{_ms(row['ttft_ms_p99'])}",
        _ms_or_fail(row["ttft_ms_with_failures_p99"], row["requests"]),
        _bounds(row, "ttft_ms_with_failures_p99"),
        f"{_ms(row['tpot_ms_p50'])}/{_ms(row['tpot_ms_p99'])}",
        _ms(row["itl_ms_p99"]),
        _ms(row["e2e_ms_p99"]),
        f"{row['attainment'] * 100:.1f}%" if row["attainment"] is not None else "—",
    ]
    if "max_rel_diff" in row:
        diff = row["max_rel_diff"]
        cells.append(f"{diff * 100:.3f}%" if diff is not None else "—")
    return cells


def _ms(value: float | None) -> str:
    return fmt_ms(value if value is not None and math.isfinite(value) else None)


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


def _ms_or_fail(value: float | None, requests: int) -> Text:
    if not requests:
        return Text("—")
    if value is not None and math.isinf(value):
        return Text("fail", style="bold red")
    return Text(_ms(value))


def left_out_line(stopped: Sequence[RunEntry]) -> str:
    """The runs a window left out because they stopped before their end."""
    return "left out, stopped before their end (--include-incomplete pools them): " + ", ".join(
        f"{r.run_id} ({r.stopped})" for r in stopped
    )


def rolling_files(frame: pl.DataFrame, slos: Mapping[Any, SloTargets]) -> dict[str, bytes]:
    """rolling-ttft.png, rolling-tpot.png and rolling.json, in that order, for the command
    to write (`results.write.write_files`; `slos` as `rolling_plot` takes them)."""
    files = {
        rolling_plot_file(metric): rolling_plot(frame, slo_ms=slos, metric=metric)
        for metric in ("ttft", "tpot")
    }
    files[ROLLING_FILE] = (json.dumps(to_json(frame), indent=2) + "\n").encode("utf-8")
    return files


def rolling_plot(
    frame: pl.DataFrame, *, slo_ms: Mapping[Any, SloTargets], metric: str = "ttft"
) -> bytes:
    """PNG: the windowed percentile of `metric` (top) and attainment (bottom) against the
    window end, each workload's class with its SLO threshold (`slo_ms` keyed by
    (workload key, class), or by class name), and a tick per run at its t0. A line is
    labelled by its class, and by its workload too when the frame holds several.

    The percentile is the class's SLO percentile when the frame has it (else p99), with
    failures ranked worst where the metric allows it (ITL does not); a window whose
    percentile falls on a failure is a red triangle at the top edge.
    """
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
        slo = slo_ms.get((str(workload), str(cls)), slo_ms.get(str(cls)))
        label = f"{cls} · {workload}" if several else str(cls)
        plotted += _plot_class(top, bottom, label, part, slo, metric, f"C{index}")
    for axis in (top, bottom):
        _rug(axis, frame)
        axis.grid(True, alpha=0.3)
        axis.legend(loc="upper left", fontsize=8)
    top.set_ylabel(f"{metric.upper()} percentile (ms, nearest rank)")
    _scale_latency_axis(top, plotted)
    bottom.set_ylabel("attainment (%)")
    bottom.set_xlabel("window end (UTC); | = a run")
    figure.suptitle(
        f"{metric.upper()} over {_title(frame)}, every run's requests pooled; "
        "(all) ranks failures worst"
    )
    figure.autofmt_xdate()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def _plot_class(
    top: Any,
    bottom: Any,
    cls: str,
    part: pl.DataFrame,
    slo: SloTargets | None,
    metric: str,
    color: str,
) -> list[float]:
    """One class: its windowed percentile (failures worst, and over completed requests
    dotted), failures as triangles, its SLO threshold; attainment below. Returns the
    latencies drawn (for the axis scale)."""
    ends = part.get_column("window_end").to_list()
    p = slo.percentile if slo is not None and f"ttft_ms_p{slo.percentile:g}" in part else 99.0
    completed = part.get_column(f"{metric}_ms_p{p:g}").to_list()
    if metric in WITH_FAILURES:
        values = part.get_column(f"{metric}_ms_with_failures_p{p:g}").to_list()
        top.plot(ends, _finite(values), color=color, marker=".", label=f"{cls} p{p:g} (all)")
        top.plot(ends, _finite(completed), color=color, linestyle=":", label=f"{cls} p{p:g} (ok)")
    else:
        values = completed
        top.plot(ends, _finite(values), color=color, marker=".", label=f"{cls} p{p:g} (gaps)")
    failed = [e for e, v in zip(ends, values, strict=True) if v is not None and math.isinf(v)]
    if failed:
        top.plot(
            failed,
            [1.0] * len(failed),
            "v",
            color="red",
            clip_on=False,
            transform=top.get_xaxis_transform(),
            label=f"{cls} p{p:g} falls on a failure",
        )
    limit = slo.thresholds_ms().get(f"{metric}_ms") if slo is not None else None
    if limit is not None:
        top.axhline(limit, color=color, linestyle="--", label=f"{cls} SLO {limit:g} ms")
    attainment = [a * 100 if a is not None else math.nan for a in part["attainment"].to_list()]
    bottom.plot(ends, attainment, color=color, marker=".", label=f"{cls} attainment")
    if slo is not None and slo.thresholds_ms():
        bottom.axhline(slo.percentile, color=color, linestyle="--", label=f"{cls} {p:g} %")
    return [*_finite(values), *_finite(completed), *([limit] if limit is not None else [])]


def _scale_latency_axis(axis: Any, values_ms: Sequence[float]) -> None:
    """Linear from 0, or logarithmic when the SLO line and the data are > 10x apart (a 9 ms
    p99 under a 1 s SLO would otherwise sit flat on the floor)."""
    ys = [y for y in values_ms if math.isfinite(y) and y > 0]
    if ys and max(ys) / min(ys) > 10:
        axis.set_yscale("log")
    else:
        axis.set_ylim(bottom=0)


def _finite(values: Sequence[float | None]) -> list[float]:
    """None and ±inf as NaN: matplotlib leaves a gap."""
    return [v if v is not None and math.isfinite(v) else math.nan for v in values]


def _rug(axis: Any, frame: pl.DataFrame) -> None:
    """A tick at the bottom edge of the axis at every run's t0."""
    started = _unique(frame.get_column("run_started").explode().drop_nulls().to_list())
    axis.plot(
        started,
        [0.0] * len(started),
        "|",
        color="black",
        markersize=12,
        transform=axis.get_xaxis_transform(),
    )


def _unique(values: Iterable[Any]) -> list[Any]:
    return sorted(set(values))
