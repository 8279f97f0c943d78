"""Plots for people: PNG bytes from plain arrays, one figure per function.

Last stage, beside `loadgen.render.report`, which computes every input from the records (so each
figure is recomputable) and embeds the PNGs (`report.figures` picks each class's). These
functions only draw: they take values already in ms (or counts) and return PNG bytes
(`figure_png`, which the knee plot uses too), and never touch files. Matplotlib runs on
the Agg backend and every figure is closed after it is saved.

Conventions: times in ms on the x axis; a log x axis when the values span more than two
decades; the x axis fits the data (`fit_x`), and an SLO target is drawn as a dashed line
with its value in the label when it lies near them, else named in a note as off-scale
(a 20 s target beside 15 ms values would squeeze every value into one vertical line);
every percentile drawn is nearest rank (`loadgen.percentiles`), and its label says so.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: must precede the pyplot import

import matplotlib.pyplot as plt  # after matplotlib.use: the backend is fixed
import numpy as np
import numpy.typing as npt
from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from loadgen.measures import BY_NAME, ITL, TPOT, TTFT
from loadgen.percentiles import nearest_rank
from loadgen.render.terminal import with_unit

# Every text drawn as written: a class name or server text with `$...$` is no mathtext
# (an unknown `\q` in it made the whole report fail).
matplotlib.rcParams["text.parse_math"] = False

FloatArray = npt.NDArray[np.float64]

DPI = 100
SIZE_IN = (8.0, 4.5)
MAX_CDF_POINTS = 4000  # a CDF drawn through more points looks the same and renders slower
LOG_SPAN = 100.0  # max/min above this (two decades) switches an axis to log scale
# An SLO line is drawn on the axis when showing it keeps the data on at least a third of
# the width (linear), or within one decade of the data (log); else it is noted off-scale.
SLO_SPAN_LINEAR = 3.0
SLO_SPAN_LOG = 10.0
TIMELINE_LOG_SPAN = 10.0  # a timeline panel's values and SLO: log past one decade
# Fixed margins, not constrained layout: the labels are known and layout solving would
# double the time per figure (a report draws five per class).
MARGINS = {"left": 0.1, "right": 0.97, "bottom": 0.12, "top": 0.92}
NOTE_BOX = {"facecolor": "white", "alpha": 0.85, "edgecolor": "none"}
METRIC_COLOURS = {TTFT.name: "tab:blue", TPOT.name: "tab:orange", ITL.name: "tab:green"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """A percentile check's one-sided bounds at `confidence` each (None: open, the sample
    too small to bound that side; +inf: the bound falls on a failed request)."""

    low_ms: float | None
    high_ms: float | None
    confidence: float


def cdf_png(
    values_ms: Sequence[float] | FloatArray,
    *,
    failures: int,
    title: str,
    metric: str,
    target_ms: float | None,
    percentile: float,
    bounds: Bounds | None = None,
) -> bytes:
    """Empirical CDF of completed requests' values with failures ranked worst.

    y = rank / (values + failures), so with failures the curve stops short of 1 by their
    share (noted "n failed"). The SLO target is a vertical line, the SLO percentile a
    horizontal one; where they cross is the pass/fail point. `bounds`, when given, is drawn
    as a bar on the percentile's line from the lower to the upper bound (an open side runs
    to the axis' edge, with an arrow): the check is met when the bar ends left of the
    target, missed when it starts right of it. Notes (an off-scale SLO, the failures, a
    percentile on a failure) stand under the title, above the plot (`title_with_notes`).
    """
    return figure_png(
        cdf_figure(
            values_ms,
            failures=failures,
            title=title,
            metric=metric,
            target_ms=target_ms,
            percentile=percentile,
            bounds=bounds,
        )
    )


def cdf_figure(
    values_ms: Sequence[float] | FloatArray,
    *,
    failures: int,
    title: str,
    metric: str,
    target_ms: float | None,
    percentile: float,
    bounds: Bounds | None = None,
) -> Figure:
    """`cdf_png`'s figure, not yet drawn into bytes (closed by `figure_png`)."""
    values = np.sort(np.asarray(values_ms, dtype=np.float64))
    n = values.size + failures
    fig, ax = _figure()
    if values.size:
        ranks = np.arange(1, values.size + 1, dtype=np.float64)
        keep = _thin(values.size)
        x = np.concatenate(([values[0]], values[keep]))  # the curve rises from 0
        y = np.concatenate(([0.0], ranks[keep] / n))
        ax.step(x, y, where="post", color="tab:blue", label="CDF")
        _maybe_log_x(ax, values)
    else:
        ax.text(0.5, 0.5, "no completed values", transform=ax.transAxes, ha="center")
    ax.axhline(percentile / 100, color="grey", linestyle=":", label=f"p{percentile:g}")
    notes = [_slo_line(ax, values, target_ms)]
    if n:
        notes.append(_mark_percentile(ax, values, n, percentile))
    if bounds is not None and values.size:
        _mark_bounds(ax, values, percentile, bounds)
    if failures:
        share = failures / n
        ax.axhline(1 - share, color="tab:red", linewidth=0.8, alpha=0.5)
        notes.append(f"{failures} failed ({share:.1%}): the curve stops at {1 - share:.1%}")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{metric} (ms)")
    ax.set_ylabel("share of requests ≤ x")
    title_with_notes(fig, ax, title, notes)
    ax.legend(loc="lower right")
    return fig


NOTE_LINE_PT = 12.0  # one note line (fontsize 9) above the plot area


def title_with_notes(fig: Figure, ax: Axes, title: str, notes: Sequence[str | None]) -> None:
    """The title, and under it each note in red, above the plot area: a note never lies over
    the curve, the percentile's bar or its arrow (inside the axes, any place can hold them
    for some data). The plot area shrinks by the notes' height."""
    shown = [note for note in notes if note]
    for index, note in enumerate(reversed(shown)):
        ax.annotate(note, xy=(0.5, 1.0), xycoords="axes fraction", ha="center", va="bottom",
                    xytext=(0, 3 + index * NOTE_LINE_PT), textcoords="offset points",
                    color="tab:red", fontsize=9)  # fmt: skip
    ax.set_title(title, pad=6 + len(shown) * NOTE_LINE_PT)
    if shown:
        height_pt = fig.get_figheight() * 72
        fig.subplots_adjust(top=MARGINS["top"] - len(shown) * NOTE_LINE_PT / height_pt)


def itl_histogram_png(
    gaps_ms: Sequence[float] | FloatArray, *, title: str, target_ms: float | None
) -> bytes:
    """Histogram of individual inter-chunk gaps: log y (the tail is a few gaps), x in ms."""
    gaps = np.asarray(gaps_ms, dtype=np.float64)
    fig, ax = _figure()
    if gaps.size:
        low, high = float(gaps.min()), float(gaps.max())
        if _spans_decades(gaps):
            bins = np.geomspace(max(low, 1e-3), high, 60)
            log_scale(ax, "x")
        else:
            bins = np.linspace(low, high if high > low else low + 1.0, 60)
        counts, edges = np.histogram(np.clip(gaps, bins[0], None), bins=bins)
        # one stairs artist instead of a patch per bar; its floor sits below the 1-gap level
        ax.stairs(counts, edges, fill=True, baseline=0.7, color="tab:green", label="gaps")
        log_scale(ax, "y")
        ax.set_ylim(bottom=0.7)
    else:
        ax.text(0.5, 0.5, "no gaps (no ok request had two chunks)", transform=ax.transAxes)
    note = _slo_line(ax, gaps, target_ms)
    ax.set_xlabel("inter-chunk gap (ms)")
    ax.set_ylabel("gaps (log scale)")
    title_with_notes(fig, ax, title, [note])
    if gaps.size or target_ms is not None:
        ax.legend(loc="upper right")
    return figure_png(fig)


def tokens_per_chunk_png(chunks_by_tokens: Mapping[int, int], *, title: str) -> bytes:
    """Bar chart: how many chunks carried 1, 2, ... tokens (all 1 = ITL is per token)."""
    fig, ax = _figure()
    if chunks_by_tokens:
        sizes = sorted(chunks_by_tokens)
        counts = [chunks_by_tokens[k] for k in sizes]
        bars = ax.bar([str(k) for k in sizes], counts, color="tab:purple")
        ax.bar_label(bars, labels=[f"{c:,}" for c in counts])
        ax.margins(y=0.15)
    else:
        ax.text(0.5, 0.5, "no chunks from ok requests", transform=ax.transAxes, ha="center")
    ax.set_xlabel("tokens in the chunk")
    ax.set_ylabel("chunks")
    ax.set_title(title)
    return figure_png(fig)


def timeline_png(
    *,
    window_mid_s: Sequence[float] | FloatArray,
    step_s: float,
    p99_ms: Mapping[str, Sequence[float | None]],
    targets_ms: Mapping[str, float | None],
    arrival_rate_per_s: Sequence[float | None],
    failed: Sequence[int],
    title: str,
    partial: Sequence[bool] = (),
    schedule_end_s: float | None = None,
    x_end_s: float | None = None,
) -> bytes:
    """Per-window p99 of each metric (ms) in a panel of its own with its own SLO line, the
    arrival rate (req/s, right) on the first, failed requests per window as bars in a panel
    below, all on one time axis.

    One panel per metric because the metrics are judged apart: ITL p99 is over single gaps,
    the TPOT SLO over request averages, so an ITL line above the TPOT SLO is no breach and
    must not be drawn against it; a metric without a target says so in its panel.
    `p99_ms` and `targets_ms` are keyed by metric (`ttft`, `tpot`, `itl`); None marks a
    window without values (drawn as a gap in the line). The arrival rate is over the part
    of each window the schedule covered (`analysis.windows`): None (too little covered) is
    a gap, a `partial` window's rate is a hollow marker, and `schedule_end_s` a dotted line
    labelled "arrivals end", so the rate's end reads as the schedule's, not as a dip.
    `x_end_s`: the time axis runs from t0 to it (`run_time_axis`), as the server timeline's.
    """
    x = np.asarray(window_mid_s, dtype=np.float64)
    metrics = list(p99_ms) or [TTFT.name]
    fig, axes = plt.subplots(
        len(metrics) + 1,
        1,
        figsize=(SIZE_IN[0], timeline_height_in(len(metrics))),
        sharex=True,
        height_ratios=(*([2.0] * len(metrics)), 1.0),
    )
    fig.subplots_adjust(left=0.1, right=0.9, bottom=0.08, top=0.9, hspace=0.12)
    panels, bottom = list(axes[:-1]), axes[-1]
    for ax, metric in zip(panels, metrics, strict=True):
        _metric_panel(ax, x, metric, p99_ms.get(metric, []), targets_ms.get(metric))
    top = panels[0]
    fig.suptitle(title)
    rate_axis = top.twinx()
    rates = np.array([math.nan if r is None else r for r in arrival_rate_per_s], dtype=np.float64)
    rate_axis.plot(x, rates, color="grey", alpha=0.6, linewidth=1, label="arrivals")
    cut = np.array([bool(p) for p in partial] or [False] * len(x), dtype=bool) & np.isfinite(rates)
    if cut.any():
        rate_axis.plot(x[cut], rates[cut], linestyle="none", marker="o", markersize=5,
                       markerfacecolor="white", color="grey",
                       label="arrivals (window partly run)")  # fmt: skip
    mark_arrivals_end((rate_axis, *panels[1:], bottom), schedule_end_s)
    rate_axis.set_ylabel("arrivals (req/s)", color="grey")
    finite = rates[np.isfinite(rates)].tolist()
    rate_axis.set_ylim(0, max([1.0, *finite]) * 1.3)  # headroom: clear of SLO labels
    lines, labels = top.get_legend_handles_labels()
    more_lines, more_labels = rate_axis.get_legend_handles_labels()
    top.legend(
        lines + more_lines,
        labels + more_labels,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncol=4,
        fontsize=8,
        frameon=False,
    )
    bottom.bar(x, failed, width=step_s * 0.8, color="tab:red")
    if not any(failed):
        bottom.text(0.5, 0.5, "no failed requests", transform=bottom.transAxes, ha="center")
    bottom.set_ylabel("failed\nrequests")
    bottom.set_xlabel("time since run start (s), by intended send time")
    bottom.set_ylim(0, max([1, *failed]) * 1.15)
    bottom.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    run_time_axis(bottom, x_end_s)
    return figure_png(fig)


def timeline_height_in(metrics: int) -> float:
    """The class timeline's height: 1.9 in per metric panel plus 1.9 in for the failures
    panel, the title and the axis label (three metrics: 7.6 in, 760 px)."""
    return 1.9 * (metrics + 1)


NO_SLO_NOTES = {ITL.name: "no ITL SLO: ITL p99 is over single gaps; the TPOT SLO judges request "
                       "averages, not these"}  # fmt: skip


def _metric_panel(
    ax: Axes, x: FloatArray, metric: str, series: Sequence[float | None], target: float | None
) -> None:
    """One metric's p99 per window, its own SLO as a dashed line, or a note saying it has none."""
    y = np.array([math.nan if v is None else v for v in series], dtype=np.float64)
    colour = METRIC_COLOURS.get(metric, "black")
    name = BY_NAME[metric].label if metric in BY_NAME else metric.upper()
    ax.plot(x[: y.size], y, marker=".", color=colour, label=f"{name} p99")
    present = y[np.isfinite(y)].tolist()
    if target is not None:
        ax.axhline(target, color=colour, linestyle="--", linewidth=1)
        present.append(target)
        ax.annotate(f"{name} SLO {_ms(target)}", (0.99, target),
                    xycoords=("axes fraction", "data"), ha="right", va="bottom", color=colour,
                    fontsize=8)  # fmt: skip
    else:
        note = NO_SLO_NOTES.get(metric, f"no {name} SLO")
        ax.text(0.99, 0.95, note, transform=ax.transAxes, ha="right", va="top", color=colour,
                fontsize=8, bbox=NOTE_BOX)  # fmt: skip
    positive = [v for v in present if v > 0]
    if positive and _spans_decades(np.asarray(positive), TIMELINE_LOG_SPAN):
        log_scale(ax, "y")
        ax.set_ylim(min(positive) / 1.3, max(positive) * 1.6)  # room for the SLO's label
    elif present:
        ax.set_ylim(0, max([*present, 1e-3]) * 1.25)
    ax.set_ylabel(f"{name} p99 (ms)", color=colour)
    ax.grid(True, alpha=0.3)


def run_time_axis(ax: Axes, x_end_s: float | None) -> None:
    """A time axis from t0 to `x_end_s` (the report's one span for every timeline, the
    last window's end or the last scrape), so that the class timelines and the server
    timeline put the same second at the same place; matplotlib's own limits when None."""
    if x_end_s is not None and x_end_s > 0:
        ax.set_xlim(0, x_end_s)


ARRIVALS_END = "arrivals end"


def mark_arrivals_end(axes: Sequence[Axes], schedule_end_s: float | None) -> None:
    """A dotted grey line at `schedule_end_s` (when the run's arrival schedule ended,
    `analysis.windows.schedule_end_ns`) across every panel, labelled on the first: the
    client timeline and the server timeline mark the same moment the same way."""
    if schedule_end_s is None:
        return
    for ax in axes:
        ax.axvline(schedule_end_s, color="grey", linestyle=":", linewidth=1)
    axes[0].annotate(ARRIVALS_END, (schedule_end_s, 0.02), xycoords=("data", "axes fraction"),
                     rotation=90, ha="right", va="bottom", color="grey", fontsize=8)  # fmt: skip


def _mark_bounds(ax: Axes, values: FloatArray, percentile: float, bounds: Bounds) -> None:
    """The percentile's bounds as a bar on its line; an open or infinite side ends in an
    arrow at the drawn range's edge (the sample does not bound it there)."""
    y = percentile / 100
    left_edge, right_edge = float(values[0]), float(values[-1])
    low = bounds.low_ms if bounds.low_ms is not None and math.isfinite(bounds.low_ms) else None
    high = bounds.high_ms if bounds.high_ms is not None and math.isfinite(bounds.high_ms) else None
    start, end = low if low is not None else left_edge, high if high is not None else right_edge
    label = f"{bounds.confidence:.0%} bounds each side"
    ax.plot([start, end], [y, y], color="tab:purple", linewidth=4, alpha=0.45, label=label,
            solid_capstyle="butt")  # fmt: skip
    for side, edge, marker in ((low, start, "<"), (high, end, ">")):
        if side is None:
            ax.plot([edge], [y], marker=marker, color="tab:purple", markersize=8)


def _mark_percentile(ax: Axes, values: FloatArray, n: int, percentile: float) -> str | None:
    """A dot where the nearest-rank percentile (failures worst) lies, with its value; the
    note to show instead when it falls on a failed request."""
    rank = nearest_rank(percentile, n)
    label = f"p{percentile:g}"
    if rank > values.size:
        return f"{label} falls on a failed request"
    value = float(values[rank - 1])
    ax.plot([value], [rank / n], "o", color="black", zorder=4,  # over the bounds' bar
            label=f"{label} = {_ms(value)} (nearest rank)")  # fmt: skip
    return None


def hop_boxplot_png(
    durations_ms: Mapping[int, Sequence[float]], *, title: str, budget_s: float | None = None
) -> bytes:
    """Per-hop duration (intended send → end of ok hops) as boxplots, one box per hop index.

    Boxes from the 25th to the 75th percentile around the median, whiskers at the 1st and
    99th, the hops beyond them as points: all nearest rank (`_box`, not matplotlib's
    interpolated quartiles). The trajectory budget divided by the number of hops is drawn
    as a reference (the equal split the seed warns against planning by).
    """
    fig, ax = _figure()
    hops = sorted(h for h, values in durations_ms.items() if len(values))
    if hops:
        ax.bxp([_box(durations_ms[h]) for h in hops], showfliers=True)
        ax.set_xticks(range(1, len(hops) + 1), [str(h) for h in hops])
        if budget_s:
            share = budget_s * 1000 / len(hops)
            ax.axhline(share, color="tab:red", linestyle="--",
                       label=f"budget / hops = {share:,.0f} ms")  # fmt: skip
            ax.legend(loc="upper left")
    else:
        ax.text(0.5, 0.5, "no ok hops", transform=ax.transAxes, ha="center")
    ax.set_xlabel(
        "hop (0 = first call of the trajectory); boxes p25–p75 around the median, "
        "whiskers p1–p99 (nearest rank)"
    )
    ax.set_ylabel("hop duration (ms)")
    ax.set_title(title)
    return figure_png(fig)


def _box(values: Sequence[float]) -> dict[str, Any]:
    """One box of `Axes.bxp`: nearest-rank p25, p50, p75, whiskers at p1 and p99, and the
    values beyond the whiskers."""
    ordered = sorted(values)

    def at(percentile: float) -> float:
        return ordered[nearest_rank(percentile, len(ordered)) - 1]

    low, high = at(1.0), at(99.0)
    fliers = [v for v in ordered if v < low or v > high]
    return {"med": at(50.0), "q1": at(25.0), "q3": at(75.0), "whislo": low, "whishi": high,
            "fliers": fliers}  # fmt: skip


def batch_progress_png(
    end_s: Sequence[float], *, documents: int, title: str, deadline_s: float | None = None
) -> bytes:
    """Documents completed over time since the batch started, with the deadline marked."""
    fig, ax = _figure()
    ends = sorted(end_s)
    if ends:
        ax.step([0.0, *ends], list(range(len(ends) + 1)), where="post", color="tab:blue",
                label=f"{len(ends)} of {documents} documents ok")  # fmt: skip
    ax.axhline(documents, color="grey", linestyle=":", label=f"batch: {documents} documents")
    if deadline_s:
        ax.axvline(deadline_s, color="tab:red", linestyle="--", label=f"deadline {deadline_s:g} s")
    ax.set_xlabel("time since the batch's first send (s)")
    ax.set_ylabel("documents completed ok")
    ax.set_title(title)
    ax.legend(loc="lower right")
    return figure_png(fig)


def _figure() -> tuple[Figure, Axes]:
    fig, ax = plt.subplots(figsize=SIZE_IN)
    fig.subplots_adjust(**MARGINS)
    ax.grid(True, alpha=0.3)
    return fig, ax


def figure_png(fig: Figure) -> bytes:
    """The figure as PNG bytes at the house DPI; the figure is closed whatever happens (a
    pyplot figure or a bare `Figure`, as `knee_plot` draws)."""
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI)
        return buf.getvalue()
    finally:
        plt.close(fig)


def fit_x(values: FloatArray, target_ms: float | None, *, log: bool) -> tuple[float, float, bool]:
    """The x range that fits `values` (> 0 on a log axis), and whether the SLO target is in it.

    The target is included when the data still fill at least 1/SLO_SPAN_LINEAR of the
    axis (linear) or it lies within SLO_SPAN_LOG of the data (log); else it is off-scale.
    """
    data = values[values > 0] if log else values
    if not data.size:
        data = values if values.size else np.asarray([target_ms or 1.0])
    low, high = float(data.min()), float(data.max())
    if log:
        shown = (
            target_ms is not None
            and target_ms > 0
            and (low / SLO_SPAN_LOG <= target_ms <= high * SLO_SPAN_LOG)
        )
        if shown and target_ms is not None:
            low, high = min(low, target_ms), max(high, target_ms)
        return low / 1.15, high * 1.15, shown
    span = max(high - low, 0.25 * abs(high), 1e-3)  # one value: a quarter of it either side
    shown = target_ms is not None and (
        max(high, target_ms) - min(low, target_ms) <= SLO_SPAN_LINEAR * span
    )
    if shown and target_ms is not None:
        low, high = min(low, target_ms), max(high, target_ms)
    pad = 0.05 * max(high - low, span)
    if 0 <= low <= high - low:  # the data start near 0: show the axis from 0
        return 0.0, high + pad, shown
    return low - pad, high + pad, shown


def _slo_line(ax: Axes, values: FloatArray, target_ms: float | None) -> str | None:
    """Fit the x axis to `values`; draw the SLO line there, or return the note saying it is
    off-scale (for `title_with_notes`)."""
    if not values.size:
        if target_ms is not None:
            ax.axvline(target_ms, color="tab:red", linestyle="--", label=f"SLO {_ms(target_ms)}")
        return None
    left, right, shown = fit_x(values, target_ms, log=ax.get_xscale() == "log")
    ax.set_xlim(left, right)
    if target_ms is None:
        return None
    if shown:
        ax.axvline(target_ms, color="tab:red", linestyle="--", label=f"SLO {_ms(target_ms)}")
        return None
    side, where = ("right", "below") if target_ms > right else ("left", "above")
    return f"SLO {_ms(target_ms)} off-scale ({side}): every value shown is {where} it"


def _thin(n: int) -> npt.NDArray[np.intp]:
    """Indices of at most MAX_CDF_POINTS evenly spaced ranks, always keeping both ends."""
    if n <= MAX_CDF_POINTS:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, MAX_CDF_POINTS).round().astype(np.intp))


def _spans_decades(values: FloatArray, span: float = LOG_SPAN) -> bool:
    positive = values[values > 0]
    return positive.size > 0 and float(positive.max()) / float(positive.min()) > span


def _maybe_log_x(ax: Axes, values: FloatArray) -> None:
    if _spans_decades(values):
        log_scale(ax, "x")


def log_scale(ax: Axes, which: str) -> None:
    """Log scale on the x or y axis, with plain-number ticks at 1, 2, 5 per decade (text is
    drawn as written here, no mathtext: matplotlib's own log ticks would read
    `$\\mathdefault{10^{2}}$`)."""
    if which == "x":
        ax.set_xscale("log")
    else:
        ax.set_yscale("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def _ms(value: float) -> str:
    """A latency for a label, as the terminal table shows it ("84.7 ms", "1000 ms", "24.0s")."""
    return with_unit(value)


CLASS_COLOURS = ("tab:blue", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")


def server_timeline_png(
    *,
    client: Mapping[str, tuple[Sequence[float], Sequence[float | None], Sequence[float]]],
    server_t_s: Sequence[float],
    server: Mapping[str, Sequence[float | None]],
    title: str,
    schedule_end_s: float | None = None,
    x_end_s: float | None = None,
) -> bytes:
    """The client's and the server's view of the same seconds, on one time axis (s since t0).

    Top: each class's per-window TTFT p99 (ms, nearest rank; left) and arrival rate (req/s,
    dotted, right), `client[class] = (window mids, p99s, rates)`. Middle: the server's queue
    depth and running requests at each scrape. Bottom: its KV-cache usage (0–1). Panels the
    server does not expose say so. `schedule_end_s`: the "arrivals end" line of
    `timeline_png`, across the three panels (what the server did after it is the drain);
    `x_end_s` that figure's time axis too (a scrape before t0 is cut at t0).
    """
    fig, (top, middle, bottom) = plt.subplots(
        3, 1, figsize=(SIZE_IN[0], 7.0), sharex=True, height_ratios=(3, 2, 1.3)
    )
    fig.subplots_adjust(left=0.1, right=0.9, bottom=0.08, top=0.88, hspace=0.1)
    rate_axis = top.twinx()
    present: list[float] = []
    for i, (name, (mids, p99, rates)) in enumerate(client.items()):
        colour = CLASS_COLOURS[i % len(CLASS_COLOURS)]
        y = np.array([math.nan if v is None else v for v in p99], dtype=np.float64)
        top.plot(mids, y, marker=".", color=colour, label=f"{name} TTFT p99")
        present.extend(y[np.isfinite(y)].tolist())
        rate_axis.plot(mids, rates, color=colour, linestyle=":", linewidth=1,
                       label=f"{name} arrivals")  # fmt: skip
    if present and _spans_decades(np.asarray(present), TIMELINE_LOG_SPAN):
        log_scale(top, "y")
    top.set_ylabel("TTFT p99 per window (ms)")
    rate_axis.set_ylabel("arrival rate (req/s)", color="grey")
    rate_axis.set_ylim(0, None)
    lines, labels = top.get_legend_handles_labels()
    more_lines, more_labels = rate_axis.get_legend_handles_labels()
    top.legend(lines + more_lines, labels + more_labels, loc="lower left",
               bbox_to_anchor=(0.0, 1.0), ncol=4, fontsize=8, frameon=False)  # fmt: skip
    fig.suptitle(title)
    x = np.asarray(server_t_s, dtype=np.float64)
    _server_panel(middle, x, server, ("queue_depth", "running"), "requests")
    _server_panel(bottom, x, server, ("kv_usage",), "KV usage")
    if "kv_usage" in server:
        bottom.set_ylim(0, max(1.0, *(v for v in server["kv_usage"] if v is not None)) * 1.05)
    mark_arrivals_end((rate_axis, middle, bottom), schedule_end_s)
    bottom.set_xlabel("time since run start (s): client windows by intended send, server by scrape")
    run_time_axis(bottom, x_end_s)
    return figure_png(fig)


SERVER_LABELS = {"queue_depth": "server queue (waiting)", "running": "server running",
                 "kv_usage": "server KV-cache usage"}  # fmt: skip
SERVER_COLOURS = {"queue_depth": "tab:red", "running": "tab:green", "kv_usage": "tab:orange"}


def _server_panel(
    ax: Axes, x: FloatArray, server: Mapping[str, Sequence[float | None]],
    figures: Sequence[str], ylabel: str,
) -> None:  # fmt: skip
    drawn = False
    for name in figures:
        if name not in server:
            continue
        y = np.array([math.nan if v is None else v for v in server[name]], dtype=np.float64)
        ax.step(x, y, where="post", color=SERVER_COLOURS[name], label=SERVER_LABELS[name])
        drawn = True
    if drawn:
        ax.legend(loc="upper left", fontsize=8, frameon=False)
        ax.set_ylim(bottom=0)
    else:
        names = " / ".join(SERVER_LABELS[n] for n in figures)
        ax.text(0.5, 0.5, f"{names}: not exposed by this server", transform=ax.transAxes,
                ha="center")  # fmt: skip
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
