"""Time windows within one run: how load, latency and failures moved during the run.

Sits beside the SLO audit, after `analysis.metrics`: a pure function of the records frame that
the report (tables, timeline plot) reads. No I/O.

Windows are anchored at the run's t0: window k covers [k·step, k·step + window) ns since
t0 (the report's default size: `default_window_s`). Tumbling (step = window) puts every
event in exactly one window; sliding (step < window) puts it in every window that covers
it. Windows run from t0 to the run's last moment, so the drain after the last arrival shows
too; every class gets every window.

Per class and window:

- requests, outcomes, attainment, TTFT and TPOT percentiles: requests assigned by their
  *intended* time (when the user pressed enter), so a window describes what the users who
  arrived in it felt. TTFT/TPOT percentiles are over that window's ok requests (TPOT: N > 1),
  nearest rank, like the summary; failures show in the outcome counts.
- ITL percentiles: over individual gaps of ok requests, each assigned by the arrival time
  of the chunk that ends it.
- covered_s: how much of the window the run's arrival schedule covered: the part of
  [start, end) inside [t0, schedule end), where the schedule end is estimated from the
  records as the latest, over classes, of a class's last intended time plus its mean gap
  between intended times ((last - first) / (n - 1)): arrivals can fall only before the
  schedule ends, and the next arrival would have come about one gap after the last one (for
  constant arrivals at rate r over D s this is D exactly; for Poisson arrivals right on
  average: the expected time from the last arrival to the end is one mean gap). The same
  rule for tumbling and sliding windows: a tumbling run has at most one partly covered
  window (the one holding the schedule's end), a sliding one every window that straddles
  it; windows wholly after it (the drain) have covered_s 0. A class whose own
  arrivals stopped earlier is still covered until the run's schedule end: its zero is real.
- arrival_rate_per_s = requests / covered_s: the rate over the part of the window the run
  covered, so a window cut off by the run's end reads its true rate, not a dip. Null when
  covered_s < MIN_COVERAGE of the window (too little of it ran to estimate a rate): the
  drain's windows and a last window the schedule barely entered.
- in_flight: requests sent at or before the window's end and not yet ended at it
  (sent_ns <= t < end, where a record without end_ns ends at its latest known moment).
- attainment = requests meeting every threshold of the class (`slo.per_request`) /
  requests; null for a window with no requests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

import polars as pl

from loadgen.analysis import slo
from loadgen.measures import GAP, ITL, TPOT, TTFT, Measure
from loadgen.results.records import OUTCOMES, Outcome
from loadgen.units import NS_PER_S
from loadgen.workload.spec import SloTargets

WINDOW_PERCENTILES: tuple[float, ...] = (50.0, 99.0)
FAILURE_OUTCOMES: tuple[str, ...] = tuple(o for o in OUTCOMES if o != Outcome.OK.value)
# A window whose covered part is under this share of its length has no arrival rate: a
# quarter of a window holds a quarter of its arrivals, too few to read as the window's rate.
MIN_COVERAGE = 0.25

# The measures a run's windows follow (the report's windows table and timeline panels): the
# first token, the pace per token and per gap (E2E, a whole answer, spans many windows).
WINDOWED: tuple[Measure, ...] = (TTFT, TPOT, ITL)


def percentile_column(measure: Measure, percentile: float) -> str:
    """A window's column of one measure's percentile: `ttft_p99_ms`."""
    return f"{measure.name}_p{percentile:g}_{measure.unit}"


_PERCENTILE_COLUMNS = [percentile_column(m, p) for m in WINDOWED for p in WINDOW_PERCENTILES]
_PER_REQUEST = tuple(m for m in WINDOWED if m.per != GAP)  # by the intended time
SCHEMA: dict[str, pl.DataType] = {
    "class": pl.String(),
    "window_start_s": pl.Float64(),
    "window_end_s": pl.Float64(),
    "requests": pl.Int64(),
    "arrival_rate_per_s": pl.Float64(),
    "in_flight": pl.Int64(),
    "ok": pl.Int64(),
    "failed": pl.Int64(),
    "met_slo": pl.Int64(),
    "attainment": pl.Float64(),
    **dict.fromkeys(_PERCENTILE_COLUMNS, pl.Float64()),
    "itl_gaps": pl.Int64(),
    **dict.fromkeys(FAILURE_OUTCOMES, pl.Int64()),
    "covered_s": pl.Float64(),
}


def time_windows(
    frame: pl.DataFrame,
    *,
    slos: Mapping[str, SloTargets] | None = None,
    window_s: float = 10.0,
    step_s: float | None = None,
) -> pl.DataFrame:
    """One row per class and window, columns `SCHEMA`, sorted by class then window start.

    `step_s` None gives tumbling windows; 0 < step_s <= window_s gives sliding ones.
    Raises WindowError for a non-positive window, a step outside (0, window_s], or a grid
    past the bounds (`check_grid`).
    """
    window_ns, step_ns = _grid_ns(window_s, step_s)
    if frame.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    last_ns = int(frame.select(pl.max_horizontal(_end_ns(), "intended_ns").max()).item())
    classes = sorted(frame.get_column("class").unique().to_list())
    count = check_grid(frame, last_ns, window_s, step_s)
    grid = pl.DataFrame({"class": classes}).join(
        pl.DataFrame({"window": pl.arange(0, count, eager=True)}), how="cross"
    )
    requests = _request_stats(frame, slos, window_ns, step_ns)
    gaps = _gap_stats(frame, window_ns, step_ns)
    flight = _in_flight(frame, grid, window_ns, step_ns)
    counts = ["requests", "ok", "met_slo", "itl_gaps", "in_flight", *FAILURE_OUTCOMES]
    joined = (
        grid.join(requests, on=["class", "window"], how="left")
        .join(gaps, on=["class", "window"], how="left")
        .join(flight, on=["class", "window"], how="left")
        .with_columns(pl.col(counts).fill_null(0))
    )
    start_ns = pl.col("window") * step_ns
    covered_ns = (pl.min_horizontal(start_ns + window_ns, schedule_end_ns(frame)) - start_ns).clip(
        lower_bound=0
    )
    covered_s = covered_ns / NS_PER_S
    return (
        joined.with_columns(
            (start_ns / NS_PER_S).alias("window_start_s"),
            ((start_ns + window_ns) / NS_PER_S).alias("window_end_s"),
            pl.when(covered_ns >= MIN_COVERAGE * window_ns)
            .then(pl.col("requests") / covered_s)
            .alias("arrival_rate_per_s"),
            covered_s.alias("covered_s"),
            (pl.col("requests") - pl.col("ok")).alias("failed"),
            pl.when(pl.col("requests") > 0)
            .then(pl.col("met_slo") / pl.col("requests"))
            .alias("attainment"),
        )
        .sort("class", "window")
        .select([pl.col(name).cast(dtype) for name, dtype in SCHEMA.items()])
    )


# The report's default window when none is given (`default_window_s`): round sizes, from the
# default scrape interval of the server's /metrics (1 s: a shorter window could hold no scrape).
WINDOW_LADDER_S: tuple[float, ...] = (
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400,
)  # fmt: skip
MAX_WINDOWS = 60
MIN_REQUESTS_PER_WINDOW = 5


def default_window_s(frame: pl.DataFrame) -> float:
    """The window a run's report uses unless told: the smallest of `WINDOW_LADDER_S` that
    (a) cuts the run (t0 to its last moment) into at most `MAX_WINDOWS` windows, and
    (b) gives its busiest class at least `MIN_REQUESTS_PER_WINDOW` requests per window on
    average over the arrival schedule (see `schedule_end_ns`).

    (a) with the ladder's steps of at most 2.5x gives 24-60 windows for a run long enough
    for (b); (b) keeps per-window percentiles and rates off one or two requests, so a sparse
    run gets fewer, wider windows (a window holds at most all of a class's requests). When
    no size meets (b) (a class of under 5 requests), one window over the whole run: the
    smallest size reaching its last moment.
    """
    if frame.height == 0:
        return float(WINDOW_LADDER_S[0])
    last_ns = int(frame.select(pl.max_horizontal(_end_ns(), "intended_ns").max()).item())
    span_s = schedule_end_ns(frame) / NS_PER_S
    busiest = int(frame.group_by("class").len().get_column("len").max())  # type: ignore[arg-type]
    for size in WINDOW_LADDER_S:
        per_window = busiest if size >= span_s else busiest * size / span_s
        if window_count(last_ns, size) <= MAX_WINDOWS and per_window >= MIN_REQUESTS_PER_WINDOW:
            return float(size)
    last_s = last_ns / NS_PER_S
    return float(next((s for s in WINDOW_LADDER_S if s > last_s), WINDOW_LADDER_S[-1]))


class WindowError(ValueError):
    """A window or step the report cannot use: not a positive length, a step longer than
    the window, or more windows (or window rows) than `check_grid` allows."""


# Bounds on what one run's windows may hold (`check_grid`): a 2.7-hour run in 1 s windows
# fits, and half a million requests and ITL gaps in sliding windows 20 steps wide; a step of
# 1e-9 s does not (10 billion windows for a 10 s run: 24 GiB and killed, before the bound).
MAX_WINDOWS_PER_CLASS = 10_000
# Rows the sliding grid builds, every request and every ITL gap once per window covering it:
# ~65 bytes each at the peak (benchmarks/memory_bounds.py), so ~650 MB at the bound.
MAX_WINDOW_ROWS = 10_000_000


def check_grid(frame: pl.DataFrame, last_ns: int, window_s: float, step_s: float | None) -> int:
    """The number of windows per class `time_windows` makes for `frame` (whose last moment is
    `last_ns`), or a WindowError saying the count it would make, the bound and the smallest
    step within it: at most `MAX_WINDOWS_PER_CLASS` windows per class, and at most
    `MAX_WINDOW_ROWS` (request or gap, window) rows, each request and each ITL gap counted
    once per window covering it (min(ceil(window / step), windows) of them)."""
    window_ns, step_ns = _grid_ns(window_s, step_s)
    count = last_ns // step_ns + 1
    what = _grid_text(window_s, step_s)
    if count > MAX_WINDOWS_PER_CLASS:
        # last_ns // step <= MAX - 1 once step >= last_ns / (MAX - 1)
        least_s = _round_up(-(-last_ns // (MAX_WINDOWS_PER_CLASS - 1)) / NS_PER_S)
        raise WindowError(
            f"{what} would cut this run (its last moment at {last_ns / NS_PER_S:.4g} s) into "
            f"{count:,} windows per class; the report makes at most {MAX_WINDOWS_PER_CLASS:,}: "
            f"use a {'step' if step_s is not None else 'window'} of at least {least_s:g} s"
        )
    covering = min(-(-window_ns // step_ns), count)
    if covering > 1:
        chunks = pl.col("chunk_ns").list.len().cast(pl.Int64)
        gaps = int(frame.select((chunks - 1).clip(lower_bound=0).sum()).item() or 0)
        events = frame.height + gaps
        if events * covering > MAX_WINDOW_ROWS:
            fits = max(MAX_WINDOW_ROWS // events, 1)
            raise WindowError(
                f"{what} puts each of this run's {frame.height:,} requests and {gaps:,} "
                f"ITL gaps in {covering:,} windows: {events * covering:,} rows, over the "
                f"{MAX_WINDOW_ROWS:,} the report holds: use a step of at least "
                f"{_round_up(window_s / fits):g} s (at most {fits:,} windows covering a "
                "moment), or tumbling windows"
            )
    return count


def _grid_text(window_s: float, step_s: float | None) -> str:
    if step_s is None:
        return f"tumbling windows of {window_s:g} s"
    return f"windows of {window_s:g} s every {step_s:g} s"


def _round_up(value_s: float) -> float:
    """`value_s` rounded up to 3 significant digits (a bound to quote that still holds)."""
    if value_s <= 0:
        return value_s
    scale = 10 ** (math.floor(math.log10(value_s)) - 2)
    return float(math.ceil(value_s / scale) * scale)


def window_count(last_ns: int, window_s: float, step_s: float | None = None) -> int:
    """How many windows `time_windows` makes per class for a run whose last moment is
    `last_ns`: windows 0 .. last_ns // step, so a last moment right on a window's edge opens
    one more window (a 60 s run in 1 s windows has 61: its last moment is in [60, 61))."""
    return last_ns // _grid_ns(window_s, step_s)[1] + 1


def schedule_end_ns(frame: pl.DataFrame) -> int:
    """When the run's arrival schedule ended, in ns since t0, estimated from intended times.

    Per class: its last intended time plus its mean gap, (last - first) / (n - 1) (0 for a
    class of one request); the run's is the latest of its classes'. See the module docstring.
    """
    if frame.height == 0:
        return 0
    per_class = frame.group_by("class").agg(
        pl.col("intended_ns").max().alias("last"),
        pl.col("intended_ns").min().alias("first"),
        pl.len().alias("n"),
    )
    gap = (
        pl.when(pl.col("n") > 1)
        .then((pl.col("last") - pl.col("first")) // (pl.col("n") - 1))
        .otherwise(0)
    )
    return int(per_class.select((pl.col("last") + gap).max()).item())


def _grid_ns(window_s: float, step_s: float | None) -> tuple[int, int]:
    if not (math.isfinite(window_s) and window_s > 0):
        raise WindowError(f"window must be a finite number of seconds > 0 (got {window_s})")
    window_ns = max(round(window_s * NS_PER_S), 1)
    if step_s is None:
        return window_ns, window_ns
    if not (math.isfinite(step_s) and 0 < step_s <= window_s):
        raise WindowError(f"window step must be in (0, window = {window_s:g} s] (got {step_s})")
    return window_ns, max(round(step_s * NS_PER_S), 1)


def _end_ns() -> pl.Expr:
    """When a request ended; its latest known moment when it has no end_ns (interrupted)."""
    return pl.coalesce("end_ns", "last_token_ns", "first_token_ns", "sent_ns", "intended_ns")


def _window_of(time_ns: pl.Expr, window_ns: int, step_ns: int) -> pl.Expr:
    """The window index (tumbling) or the list of indices (sliding) covering `time_ns`.

    t is in window k iff k·step <= t < k·step + window, i.e. (t - window)/step < k <= t/step.
    """
    last = time_ns // step_ns
    if window_ns == step_ns:
        return last
    first = ((time_ns - window_ns) // step_ns + 1).clip(lower_bound=0)
    return pl.int_ranges(first, last + 1)


def _assign(lazy: pl.LazyFrame, time_ns: pl.Expr, window_ns: int, step_ns: int) -> pl.LazyFrame:
    """Each row tagged with its `window` (repeated once per covering window when sliding)."""
    tagged = lazy.with_columns(_window_of(time_ns, window_ns, step_ns).alias("window"))
    return tagged if window_ns == step_ns else tagged.explode("window")


def _nearest_rank_of_sorted(values: pl.Expr, percentile: float) -> pl.Expr:
    """Nearest-rank percentile of a sorted list column, null when the list is empty.

    rank = ceil(p/100 · n) in integer arithmetic (p as an exact fraction), as
    `loadgen.percentiles.nearest_rank` does, so float noise cannot move a rank.
    """
    p = Fraction(str(percentile)) / 100
    n = values.list.len()
    rank = ((n * p.numerator + p.denominator - 1) // p.denominator).clip(lower_bound=1)
    return values.list.get(rank - 1, null_on_oob=True)


def _percentiles(measure: Measure) -> list[pl.Expr]:
    return [
        _nearest_rank_of_sorted(pl.col(measure.column), p).alias(percentile_column(measure, p))
        for p in WINDOW_PERCENTILES
    ]


def _request_stats(
    frame: pl.DataFrame, slos: Mapping[str, SloTargets] | None, window_ns: int, step_ns: int
) -> pl.DataFrame:
    """Counts, attainment numerator and TTFT/TPOT percentiles by (class, window of intended)."""
    is_ok = pl.col("outcome") == Outcome.OK.value
    rows = slo.per_request(frame, slos=slos).with_columns(frame.get_column("intended_ns"))
    ok_sorted = [
        pl.col(m.column).filter(is_ok).drop_nulls().sort().alias(m.column) for m in _PER_REQUEST
    ]
    return (
        _assign(rows.lazy(), pl.col("intended_ns"), window_ns, step_ns)
        .group_by("class", "window")
        .agg(
            pl.len().cast(pl.Int64).alias("requests"),
            is_ok.sum().cast(pl.Int64).alias("ok"),
            pl.col("meets_slo").sum().cast(pl.Int64).alias("met_slo"),
            *[(pl.col("outcome") == o).sum().cast(pl.Int64).alias(o) for o in FAILURE_OUTCOMES],
            *ok_sorted,
        )
        .with_columns(*(e for m in _PER_REQUEST for e in _percentiles(m)))
        .drop(*(m.column for m in _PER_REQUEST))
        .collect()
    )


def _gap_stats(frame: pl.DataFrame, window_ns: int, step_ns: int) -> pl.DataFrame:
    """ITL percentiles by (class, window of the gap's end): every gap of every ok request."""
    chunks = pl.col(ITL.end)
    gaps = (
        frame.lazy()
        .filter((pl.col("outcome") == Outcome.OK.value) & (chunks.list.len() > 1))
        .select(
            "class",
            (chunks.list.slice(1) - chunks.list.head(chunks.list.len() - 1)).alias("gap_ns"),
            chunks.list.slice(1).alias("end_ns"),
        )
        .explode("gap_ns", "end_ns")
        .sort("gap_ns")  # once, before a sliding grid repeats each gap in several windows
    )
    return (
        _assign(gaps, pl.col("end_ns"), window_ns, step_ns)
        .group_by("class", "window")
        .agg(  # group_by keeps row order within a group: each list comes out sorted
            pl.len().cast(pl.Int64).alias("itl_gaps"),
            (pl.col("gap_ns").cast(pl.Float64) / 1e6).alias(ITL.column),
        )
        .with_columns(*_percentiles(ITL))
        .drop(ITL.column)
        .collect()
    )


def _in_flight(
    frame: pl.DataFrame, grid: pl.DataFrame, window_ns: int, step_ns: int
) -> pl.DataFrame:
    """Requests sent and not yet ended at each window's end: #(sent <= t) - #(end <= t)."""
    sent = frame.filter(pl.col("sent_ns").is_not_null())
    parts = []
    for (name,), part in sent.partition_by("class", as_dict=True).items():
        windows = grid.filter(pl.col("class") == name).get_column("window")
        at_ns = windows * step_ns + window_ns
        started = part.get_column("sent_ns").sort().search_sorted(at_ns, side="right")
        ended = part.select(_end_ns()).to_series().sort().search_sorted(at_ns, side="right")
        in_flight = (started.cast(pl.Int64) - ended.cast(pl.Int64)).alias("in_flight")
        parts.append(
            pl.DataFrame({"window": windows, "in_flight": in_flight}).select(
                pl.lit(str(name)).alias("class"), "window", "in_flight"
            )
        )
    if not parts:
        return grid.with_columns(pl.lit(0, pl.Int64).alias("in_flight"))
    return pl.concat(parts)
