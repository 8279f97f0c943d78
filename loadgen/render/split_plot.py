"""The report's TTFT-split figure: where TTFT went, as stacked bars (`analysis.split`).

Two panels on one TTFT axis (ms). Left, the split at p50, p90 and p99 of the class's split
requests (each bar the band's means: `analysis.split`). Right, the requests over the TTFT
threshold, each a bar stacked from its parts in the order a request meets them (before
send, outside the engine, intake, queue, prefill: queue and prefill nearest the axis),
sorted by TTFT; past `MAX_BARS` of them, each bar is the mean of an equal share of them in
that order (the title says so). The threshold is a dashed line across both. Draws only:
every input is computed from the records by `render.report.figures`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from loadgen.render.plots import DPI, figure_png
from loadgen.render.split_view import LABELS, SHOWN
from loadgen.results.summary import TTFT_PARTS

MAX_BARS = 100  # more breaching requests than this are drawn as the means of equal groups
STACK = SHOWN  # bottom to top: the server's parts first, so that queue and prefill start at 0
COLOURS = {
    "queue_ms": "tab:red",
    "prefill_ms": "tab:blue",
    "intake_ms": "tab:purple",
    "outside_ms": "tab:gray",
    "send_lag_ms": "tab:olive",
}
assert set(STACK) == set(COLOURS) == set(TTFT_PARTS)
SIZE_IN = (10.0, 4.8)


def grouped(parts: npt.NDArray[np.float64], max_bars: int = MAX_BARS) -> npt.NDArray[np.float64]:
    """`parts` (rows sorted by TTFT, a column per part) as at most `max_bars` rows: each the
    mean of a run of consecutive rows, the runs as equal as the count allows."""
    if len(parts) <= max_bars:
        return parts
    return np.array([chunk.mean(axis=0) for chunk in np.array_split(parts, max_bars)])


def ttft_split_png(
    points: Mapping[str, Mapping[str, float]],
    breaching: npt.NDArray[np.float64],
    *,
    threshold_ms: float | None,
    title: str,
) -> bytes:
    """The figure: `points` (a label such as `p90` → ms by part name), `breaching` (one row
    per request over the threshold, sorted by TTFT, a column per part in `TTFT_PARTS`
    order), the TTFT threshold (None: no TTFT target)."""
    fig = Figure(figsize=SIZE_IN, dpi=DPI)
    left, right = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [1, 3]})
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.18, top=0.86, wspace=0.05)
    labels = list(points)
    left_parts = np.array([[points[k][p] for p in TTFT_PARTS] for k in labels])
    _stack(left, left_parts, labels)
    left.set_title("all split requests", fontsize=9)
    left.set_ylabel("TTFT (ms)")
    drawn = grouped(breaching)
    if len(drawn):
        _stack(right, drawn, [""] * len(drawn))
        per = len(breaching) / len(drawn)
        right.set_title(
            f"{len(breaching):,} requests over the TTFT target, by TTFT"
            + (f" (each bar the mean of ~{per:.0f})" if per > 1 else ""),
            fontsize=9,
        )
        right.set_xlabel("requests over the target, slowest right")
    else:
        right.set_title("no split request over the TTFT target", fontsize=9)
    right.set_xticks([])
    for ax in (left, right):
        ax.grid(True, axis="y", alpha=0.3)
        if threshold_ms is not None:
            ax.axhline(threshold_ms, color="black", linestyle="--", linewidth=1)
    if threshold_ms is not None:  # at the right end, clear of the percentile bars
        right.annotate(f"target {threshold_ms:,.0f} ms", (1, threshold_ms), fontsize=8,
                       xycoords=("axes fraction", "data"), xytext=(-2, 2),
                       textcoords="offset points", ha="right")  # fmt: skip
    every = np.vstack([left_parts, drawn]) if len(drawn) else left_parts
    said = [p for p in STACK if np.any(np.abs(every[:, TTFT_PARTS.index(p)]) >= 0.05)]
    handles = [Patch(color=COLOURS[p], label=LABELS[p]) for p in said]
    fig.legend(handles=handles, loc="lower center", ncol=len(STACK), fontsize=8, frameon=False)
    top = max(float(np.clip(every, 0, None).sum(axis=1).max()), threshold_ms or 0.0)
    left.set_ylim(top=top * 1.05)
    fig.suptitle(title, fontsize=11)
    return figure_png(fig)


def _stack(ax: Axes, parts: npt.NDArray[np.float64], labels: Sequence[str]) -> None:
    """Bars of `parts` (rows; columns in `TTFT_PARTS` order) stacked in `STACK` order; a
    negative part (a clock's rounding) is drawn below the axis, never hidden."""
    x = np.arange(len(parts))
    width = 0.8 if len(parts) < 10 else 1.0
    up, down = np.zeros(len(parts)), np.zeros(len(parts))
    for part in STACK:
        values = parts[:, TTFT_PARTS.index(part)]
        base = np.where(values >= 0, up, down)
        ax.bar(x, values, width, bottom=base, color=COLOURS[part], linewidth=0)
        up = np.where(values >= 0, up + values, up)
        down = np.where(values < 0, down + values, down)
    ax.set_xticks(x, labels)
