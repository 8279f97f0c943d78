"""The run report's figures, per class: CDFs, the ITL histogram, tokens per chunk, where
TTFT went (when the server said), the window timeline, and per kind the hop durations
(agent) or batch progress (summarization).

Each is drawn by `render.plots` from the class's records; percentiles are nearest rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from loadgen.analysis.split import PART_COLUMNS, SOURCE, ttft_split
from loadgen.analysis.windows import WINDOWED, percentile_column
from loadgen.measures import ITL, TPOT, TTFT, Measure
from loadgen.render import plots, split_plot
from loadgen.results.records import Outcome
from loadgen.results.summary import Check
from loadgen.workload.spec import SloTargets


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassView:
    """One class's slice of a run, as the figures and details need it."""

    name: str
    kind: str  # the workload class kind (chat, summarization, agent); "chat" for old runs
    frame: pl.DataFrame  # its records
    rows: pl.DataFrame  # its `slo.per_request` rows
    itl_ms: pl.Series  # gaps of its ok requests, sorted
    windows: pl.DataFrame  # its `time_windows` rows
    targets: SloTargets
    step_s: float
    budget_s: float | None = None  # agent: the trajectory budget
    deadline_s: float | None = None  # summarization: the batch deadline
    schedule_end_s: float | None = None  # when the run's arrivals ended (`windows`)
    x_end_s: float | None = None  # every timeline's time axis ends here (`plots.run_time_axis`)
    checks: tuple[Check, ...] = ()  # its SLO checks: their bounds are drawn on the CDFs


def class_figures(view: ClassView) -> dict[str, tuple[str, bytes]]:
    """A class's figures: kind -> (caption, PNG).

    Every kind gets the latency figures; agent classes add per-hop duration boxplots and
    summarization classes the batch's progress against its deadline.
    """
    figures = _latency_figures(view)
    if view.kind == "agent":
        figures["hop_durations"] = (f"{view.name}: duration by hop", _hop_figure(view))
    elif view.kind == "summarization":
        figures["batch_progress"] = (f"{view.name}: batch progress", _batch_figure(view))
    return figures


def _hop_figure(view: ClassView) -> bytes:
    ok = view.frame.filter(pl.col("outcome") == Outcome.OK.value)
    durations: dict[int, list[float]] = {}
    for (hop,), group in ok.group_by("turn", maintain_order=True):
        values = ((group["end_ns"] - group["intended_ns"]) / 1e6).to_list()
        durations[int(hop) if hop is not None else 0] = values
    return plots.hop_boxplot_png(durations, title=f"{view.name}: duration of each hop (ok hops)",
                                 budget_s=view.budget_s)  # fmt: skip


def _batch_figure(view: ClassView) -> bytes:
    frame = view.frame
    start = frame["intended_ns"].min() if frame.height else 0
    ok = frame.filter(pl.col("outcome") == Outcome.OK.value)
    ends = ((ok["end_ns"] - start) / 1e9).to_list() if ok.height else []
    title = f"{view.name}: documents completed over time"
    return plots.batch_progress_png(
        ends, documents=frame.height, deadline_s=view.deadline_s, title=title
    )


def _bounds(checks: tuple[Check, ...], metric: str) -> plots.Bounds | None:
    """A check's one-sided bounds as the CDF draws them (None: no check of that metric, or
    one judged by its point estimate)."""
    for check in checks:
        if check.metric == metric and check.confidence is not None:
            return plots.Bounds(low_ms=check.low_ms, high_ms=check.high_ms,
                                confidence=check.confidence)  # fmt: skip
    return None


# The per-request measures the report draws as CDFs (failures ranked worst past the curve),
# each with what its title says it spans.
CDFS: dict[Measure, str] = {TTFT: "intended send → first token", TPOT: "per request, N > 1"}


def _latency_figures(view: ClassView) -> dict[str, tuple[str, bytes]]:
    """The CDFs (`CDFS`), the ITL histogram, tokens per chunk and the window timeline."""
    ok = view.rows.filter(pl.col("outcome") == Outcome.OK.value)
    failures = view.rows.height - ok.height
    p, name, targets = view.targets.percentile, view.name, view.targets
    limits = targets.thresholds_ms()
    mids = view.windows.select((pl.col("window_start_s") + pl.col("window_end_s")) / 2)
    figures = {
        f"{m.name}_cdf": (
            f"{name}: {m.label} CDF",
            plots.cdf_png(
                ok.get_column(m.column).drop_nulls().to_numpy(),
                failures=failures,
                title=f"{name}: {m.label} ({spans})",
                metric=m.label,
                target_ms=limits.get(m.column),
                percentile=p,
                bounds=_bounds(view.checks, m.column),
            ),
        )
        for m, spans in CDFS.items()
    }
    figures["itl_histogram"] = (
        f"{name}: ITL histogram",
        plots.itl_histogram_png(
            view.itl_ms.to_numpy(),
            title=f"{name}: inter-chunk gaps of ok requests",
            target_ms=limits.get(ITL.column),
        ),
    )
    figures["tokens_per_chunk"] = (
        f"{name}: tokens per chunk",
        plots.tokens_per_chunk_png(
            chunks_by_tokens(view.frame), title=f"{name}: tokens per chunk (ok requests)"
        ),
    )
    split = _split_figure(view)
    if split is not None:
        figures["ttft_split"] = (f"{name}: where TTFT went", split)
    figures["timeline"] = (
        f"{name}: per-window p99 and arrivals",
        plots.timeline_png(
            window_mid_s=mids.to_series().to_numpy(),
            step_s=view.step_s,
            p99_ms={
                m.name: view.windows.get_column(percentile_column(m, 99.0)).to_list()
                for m in WINDOWED
            },
            targets_ms={m.name: limits.get(m.column) for m in WINDOWED},
            arrival_rate_per_s=view.windows.get_column("arrival_rate_per_s").to_list(),
            failed=view.windows.get_column("failed").to_list(),
            title=f"{name}: p99 per window, arrival rate and failures",
            partial=_partly_covered(view.windows),
            schedule_end_s=view.schedule_end_s,
            x_end_s=view.x_end_s,
        ),
    )
    return figures


def _split_figure(view: ClassView) -> bytes | None:
    """Where TTFT went (`split_plot`): p50/p90/p99 of the split requests, and each one over
    the TTFT threshold; None when the server said no request's queue and prefill."""
    threshold = view.targets.ttft_ms
    split = ttft_split(view.rows, threshold_ms=threshold)
    if split.requests == 0:
        return None
    rows = view.rows.filter(pl.col(SOURCE).is_not_null())
    over = rows.filter(pl.col(TTFT.column) > threshold) if threshold is not None else rows.clear()
    parts = over.sort(TTFT.column).select(PART_COLUMNS).to_numpy().astype(np.float64)
    points = {key: point.parts() for key, point in split.points().items()}
    return split_plot.ttft_split_png(
        points, parts, threshold_ms=threshold,
        title=f"{view.name}: where TTFT went ({split.requests:,} of {split.ok:,} ok requests "
        "split by the server's account)",
    )  # fmt: skip


def _partly_covered(windows: pl.DataFrame) -> list[bool]:
    """Windows the arrival schedule covered only in part (their rate is over that part)."""
    span = windows["window_end_s"] - windows["window_start_s"]
    return ((windows["covered_s"] < span - 1e-6) & (windows["covered_s"] > 0)).to_list()


def chunks_by_tokens(frame: pl.DataFrame) -> dict[int, int]:
    counts = (
        frame.filter(pl.col("outcome") == Outcome.OK.value)
        .select(pl.col("chunk_tokens").explode().drop_nulls().value_counts(sort=True))
        .unnest("chunk_tokens")
    )
    return {int(k): int(n) for k, n in counts.iter_rows()}


def server_figure(
    windows: pl.DataFrame, timeline: pl.DataFrame, *, step_s: float,
    schedule_end_s: float | None = None, x_end_s: float | None = None,
) -> tuple[str, bytes]:  # fmt: skip
    """The run's server timeline: every class's per-window TTFT p99 and arrival rate above
    the server's queue, running requests and KV usage at each scrape, on one time axis, with
    the classes' timelines' "arrivals end" line (`schedule_end_s`)."""
    client = {}
    for (name,), rows in windows.sort("window_start_s").group_by("class", maintain_order=True):
        mids = ((rows["window_start_s"] + rows["window_end_s"]) / 2).to_list()
        rates = rows["arrival_rate_per_s"].fill_null(float("nan")).to_list()  # a gap: no rate
        client[str(name)] = (mids, rows[percentile_column(TTFT, 99.0)].to_list(), rates)
    server = {c: timeline[c].to_list() for c in timeline.columns if c != "t_s"}
    png = plots.server_timeline_png(
        client=client, server_t_s=timeline["t_s"].to_list(), server=server,
        title=f"client TTFT p99 ({step_s:g} s windows) and the server's state",
        schedule_end_s=schedule_end_s, x_end_s=x_end_s,
    )  # fmt: skip
    return "the server's queue, batch and KV cache beside the client's TTFT p99", png
