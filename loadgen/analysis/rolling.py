"""Rolling windows over the results store: per class, percentiles and attainment over time.

Reads the store (`loadgen.results.store`) and feeds the reports: for every step, each workload's
classes' figures over the TRAILING window, pooled over every request of every run of that
workload in it. A workload is a name and a fingerprint of its resolved spec
(`loadgen.workload.identity`): two runs that differ in anything but seed, run length and target URL
are two workloads, and a class named "chat" in each is two rows, never one. Runs that are
no measure of the server (`RunEntry.invalid`: stopped before their end, or their generator
fell behind) are left out unless `include_incomplete`: their unsent and cancelled requests
are not the server's failures, nor their client's time the server's latency.
Pooling merges the runs' per-minute histograms; it never averages per-run percentiles (a
bad night of 1,000 requests and 29 good nights of 100,000 pool to a p99 set by the good
nights, while an average of p99s is pulled up by the bad one: only pooling answers "what
did 99 % of our users see this month").

- Windows end on multiples of `step` (UTC, counted from the epoch: midnight for `1d`), or
  on `end`, `end - step`, ... when `end` is given. Window k covers [end_k - window, end_k).
  The first window is the first that ends after the earliest request, the last the first
  that ends after the latest one (or `end`).
- A request counts in a window when the wall-clock minute of its intended send time
  starts inside it: histograms are kept per minute, so window and step are whole minutes.
- Percentiles are nearest rank (as in `analysis.metrics`), of TTFT (from the intended time), TPOT
  (N > 1) and E2E over ok requests, of ITL over the individual gaps of ok requests, and,
  with `_with_failures`, of TTFT/TPOT/E2E with every failed request ranked worst (+inf in
  the frame, null in JSON, "fail" in the table: the percentile falls on a failure).
- attainment = requests meeting every per-request threshold of their run's SLOs / all
  requests (failures stay in the denominator).
- Each failures-worst percentile carries its one-sided order-statistic bounds at
  WINDOW_CONFIDENCE (`_low`, `_high`): the histograms hold counts, so the ranks are exact
  and the values at bucket resolution (< 0.1 % from 1 ms up), widened to the bucket's edge
  (`LatencyHistogram.bounds_ms`); null where a bound is open (too few requests in the
  window), +inf (null in JSON) where it falls on a failure. ITL has none: its bounds
  count requests, not gaps (`analysis.slo`), and a minute's histogram does not keep which
  gap came from which request. The pooled requests of many runs are treated as one
  sample: a bad night widens no interval, it moves the percentile.
- A run without `histograms.parquet` (or with an unreadable one) is read from its
  records and binned the same way; `fallback_runs` names those runs in each window.
- Each run is a point too (`rolling_view(...).runs`): one row per run and class, its own
  requests, attainment and percentiles with their bounds, from its histograms alone, as
  a window holding only that run would have them.
- `exact=True` also computes every percentile from the records (`<column>_exact`) and
  `max_rel_diff`, the largest |histogram − exact| / exact of the row. HdrHistogram with
  3 significant digits keeps it below 0.1 % from 1 ms up.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from loadgen.analysis.histograms import LatencyHistogram
from loadgen.analysis.metrics import PERCENTILES
from loadgen.analysis.minutes import (
    METRICS,
    NS_PER_MINUTE,
    build_histograms,
    load_histograms,
    metric_values,
    request_measures,
)
from loadgen.errors import LoadgenError, OptionError
from loadgen.measures import FAILURES_WORST
from loadgen.percentiles import nearest_rank
from loadgen.results.records import OUTCOMES, Outcome
from loadgen.results.runfolder import read_records, read_summary
from loadgen.results.store import RunEntry, discover_runs, select_runs

# The histograms' measures that also rank every failure worst, as the summary does
WITH_FAILURES: tuple[str, ...] = tuple(m.name for m in FAILURES_WORST if m.name in METRICS)
WINDOW_CONFIDENCE = 0.95  # the level of every window's percentile bounds
_UNITS_NS = {
    "s": 1_000_000_000,
    "m": NS_PER_MINUTE,
    "h": 60 * NS_PER_MINUTE,
    "d": 24 * 60 * NS_PER_MINUTE,
    "w": 7 * 24 * 60 * NS_PER_MINUTE,
}
_DURATION = re.compile(r"(?:\d+[smhdw])+")


def parse_duration(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `1d12h`, `2w` as a timedelta (> 0); ConfigError otherwise."""
    compact = text.strip().lower()
    if not _DURATION.fullmatch(compact):
        raise OptionError(
            "--window",
            f"cannot read {text!r} as a duration",
            "use whole numbers with units s, m, h, d, w: 30d, 12h, 90m, 1d12h",
        )
    total_ns = sum(int(n) * _UNITS_NS[unit] for n, unit in re.findall(r"(\d+)([smhdw])", compact))
    if total_ns <= 0:
        raise OptionError("--window", f"{text!r} is not > 0", "e.g. 30d")
    return timedelta(microseconds=total_ns // 1000)


@dataclass(slots=True)
class _Bin:
    """One class's requests in one slot of time: counts, merged histograms, the runs in it."""

    counts: dict[str, int] = field(default_factory=dict)
    histograms: dict[str, LatencyHistogram] = field(default_factory=dict)
    run_ids: set[str] = field(default_factory=set)  # its runs (all of one workload)
    run_requests: dict[str, int] = field(default_factory=dict)  # requests of each run in it
    values_ms: dict[str, list[npt.NDArray[np.float64]]] = field(default_factory=dict)  # exact


@dataclass(frozen=True, slots=True)
class RollingView:
    """What `loadgen report STORE` shows: the trailing windows and every run as a point."""

    windows: pl.DataFrame  # one row per (window end, workload, class): `rolling_windows`
    runs: pl.DataFrame  # one row per (run, workload, class): the run's own figures


def rolling_windows(
    store_dir: Path,
    *,
    window: timedelta,
    step: timedelta,
    class_name: str | Sequence[str] | None = None,
    exact: bool = False,
    end: datetime | None = None,
    workload: str | None = None,
    include_incomplete: bool = False,
    skipped: list[str] | None = None,
) -> pl.DataFrame:
    """One row per (window end, workload, class): see the module docstring for every column.

    `workload` selects by name (every fingerprint of it, each its own rows) or by key
    (`name@fingerprint`); `class_name`, one class or several; `include_incomplete` pools
    runs that stopped early too. A run whose run.json, or whose histograms and records, are
    damaged is left out, with why appended to `skipped` (else it is a LoadgenError).
    """
    return rolling_view(
        store_dir, window=window, step=step, class_name=class_name, exact=exact, end=end,
        workload=workload, include_incomplete=include_incomplete, skipped=skipped,
    ).windows  # fmt: skip


def rolling_view(
    store_dir: Path,
    *,
    window: timedelta,
    step: timedelta,
    class_name: str | Sequence[str] | None = None,
    exact: bool = False,
    end: datetime | None = None,
    workload: str | None = None,
    include_incomplete: bool = False,
    skipped: list[str] | None = None,
) -> RollingView:
    """The windows (`rolling_windows`, whose arguments these are) and each run's own row,
    from one read of the store."""
    window_ns, step_ns = _whole_minutes_ns(window, "--window"), _whole_minutes_ns(step, "--step")
    runs = pooled_runs(store_dir, workload=workload, include_incomplete=include_incomplete,
                       skipped=skipped)  # fmt: skip
    minutes, fallback, damaged = _load_minutes(runs, strict=skipped is None)
    if damaged and skipped is not None:
        skipped.extend(f"{run_id} ({reason})" for run_id, reason in damaged.items())
        runs = [r for r in runs if r.run_id not in damaged]
    keys = sorted(set(minutes.select("workload", "class").iter_rows()))
    if class_name is not None:
        wanted = [class_name] if isinstance(class_name, str) else list(class_name)
        unknown = [c for c in wanted if c not in {c for _, c in keys}]
        if unknown:
            raise OptionError(
                "--class",
                f"no run in {store_dir} has class {', '.join(map(repr, unknown))}",
                f"classes found: {', '.join(sorted({c for _, c in keys})) or 'none'}",
            )
        keys = [k for k in keys if k[1] in wanted]
        minutes = minutes.filter(pl.col("class").is_in(wanted))
    started = {r.run_id: r.started for r in runs}
    points = _run_rows(minutes, started)
    ends = _window_ends(minutes, runs, step_ns, end)
    if not ends:
        return RollingView(windows=_frame([], exact=exact), runs=points)
    slot_ns = math.gcd(window_ns, step_ns)  # every window is a whole number of slots
    anchor = ends[-1]
    bins = _bin_minutes(minutes, anchor, slot_ns)
    if exact:
        _add_exact_values(bins, runs, sorted({c for _, c in keys}), anchor, slot_ns)
    costs = _run_costs(runs)
    rows = []
    for end_ns in ends:
        first, last = (end_ns - window_ns - anchor) // slot_ns, (end_ns - anchor) // slot_ns
        for key in keys:
            parts = [bins[(*key, s)] for s in range(first, last) if (*key, s) in bins]
            row = _window_row(parts, exact=exact)
            row |= _window_cost(parts, key[1], costs)
            run_ids = sorted(set().union(*(p.run_ids for p in parts)), key=started.__getitem__)
            row |= {
                "window_start": end_ns - window_ns,
                "window_end": end_ns,
                "workload": key[0],
                "class": key[1],
                "runs": len(run_ids),
                "run_ids": run_ids,
                "run_started": [started[r] for r in run_ids],
                "fallback_runs": [r for r in run_ids if r in fallback],
            }
            rows.append(row)
    return RollingView(windows=_frame(rows, exact=exact), runs=points)


def _run_rows(minutes: pl.DataFrame, started: Mapping[str, datetime]) -> pl.DataFrame:
    """One row per (run, workload, class), oldest run first: its minutes merged into one
    bin, figured as a window (`_window_row`) of that run alone."""
    bins: dict[tuple[str, str, str], _Bin] = {}
    for row in minutes.iter_rows(named=True):
        _add_minute(bins.setdefault((row["run_id"], row["workload"], row["class"]), _Bin()), row)
    rows = []
    for (run_id, workload, cls), part in sorted(
        bins.items(), key=lambda item: (started[item[0][0]], item[0])
    ):
        row = _window_row([part], exact=False)
        row |= {"run_id": run_id, "run_started": started[run_id], "workload": workload,
                "class": cls}  # fmt: skip
        rows.append(row)
    return _points_frame(rows)


# Per run and class: (its requests, its cost, its ok output tokens, its good output tokens).
RunCosts = dict[str, dict[str, tuple[int, float | None, int, int]] | None]


def _run_costs(runs: Sequence[RunEntry]) -> RunCosts:
    """Each run's cost per class from its summary.json (None: no price, or no summary)."""
    out: RunCosts = {}
    for run in runs:
        try:
            summary = read_summary(run.run_dir)
        except (LoadgenError, OSError, ValueError):
            out[run.run_id] = None
            continue
        if summary.cost is None:
            out[run.run_id] = None
            continue
        out[run.run_id] = {
            name: (summary.classes[name].requests if name in summary.classes else 0,
                   c.cost, c.output_tokens, c.good_output_tokens)
            for name, c in summary.cost.classes.items()
        }  # fmt: skip
    return out


def _window_cost(parts: Sequence[_Bin], class_name: str, costs: RunCosts) -> dict[str, Any]:
    """Cost per million (good) output tokens over the window: each run's class cost and
    tokens counted in the share of its requests that fall in the window (requests are binned
    by intended time); null unless every run in the window has a price."""
    in_window: dict[str, int] = {}
    for p in parts:
        for run_id, n in p.run_requests.items():
            in_window[run_id] = in_window.get(run_id, 0) + n
    cost = tokens = good = 0.0
    for run_id, n in in_window.items():
        per_class = costs.get(run_id)
        figures = per_class.get(class_name) if per_class is not None else None
        run_cost = figures[1] if figures is not None else None
        if figures is None or run_cost is None or not figures[0]:
            return {"cost_per_million_output_tokens": None,
                    "cost_per_million_good_output_tokens": None}  # fmt: skip
        requests, _, run_tokens, run_good = figures
        share = n / requests
        cost += share * run_cost
        tokens += share * run_tokens
        good += share * run_good
    return {
        "cost_per_million_output_tokens": cost / tokens * 1e6 if tokens and in_window else None,
        "cost_per_million_good_output_tokens": cost / good * 1e6 if good and in_window else None,
    }


def pooled_runs(
    store_dir: Path, *, workload: str | None = None, include_incomplete: bool = False,
    skipped: list[str] | None = None,
) -> list[RunEntry]:  # fmt: skip
    """The store's runs a window may pool (`store.select_runs`); LoadgenError/ConfigError,
    saying what the store holds, when none qualifies (`skipped`: see `discover_runs`)."""
    every = discover_runs(store_dir, skipped)
    if not every:
        raise LoadgenError(f"{store_dir}: no runs found (no folder with a run.json)")
    runs = select_runs(every, workload=workload, include_incomplete=include_incomplete)
    if not runs:
        held = sorted({r.workload_key for r in every})
        invalid = sum(not r.is_complete for r in every)
        raise OptionError(
            "--workload" if workload is not None else "--include-incomplete",
            f"no valid run in {store_dir}"
            + (f" of workload {workload!r}" if workload is not None else "")
            + f" ({len(every)} runs, {invalid} of them stopped early or fell behind)",
            f"workloads found: {', '.join(held)}; pick one with --workload NAME, or add "
            "--include-incomplete to pool runs that stopped early or fell behind",
        )
    return runs


def _whole_minutes_ns(value: timedelta, option: str) -> int:
    total_ns = (value // timedelta(microseconds=1)) * 1000
    if total_ns <= 0 or total_ns % NS_PER_MINUTE:
        raise OptionError(
            option,
            f"must be a whole number of minutes > 0 (got {value})",
            "histograms are kept per minute: e.g. 30d, 1d, 12h, 15m",
        )
    return total_ns


def _load_minutes(
    runs: Sequence[RunEntry], *, strict: bool = True
) -> tuple[pl.DataFrame, set[str], dict[str, str]]:
    """Every run's per-minute histograms with a run_id column, the runs read from records,
    and (unless `strict`: then a LoadgenError) each run left out because its histograms and
    its records are damaged, with why."""
    frames, fallback, damaged = [], set(), {}
    for run in runs:
        minutes = load_histograms(run.run_dir)
        if minutes is None:
            try:
                records = read_records(run.run_dir)
            except LoadgenError as exc:
                if strict:
                    raise
                damaged[run.run_id] = str(exc)
                continue
            fallback.add(run.run_id)
            minutes = build_histograms(records, t0_unix_ns=run.started_unix_ns, slos=run.slos)
        frames.append(minutes.with_columns(pl.lit(run.run_id).alias("run_id"),
                                           pl.lit(run.workload_key).alias("workload")))  # fmt: skip
    if not frames:
        raise LoadgenError("no run's histograms or records could be read: "
                           + "; ".join(f"{k} ({v})" for k, v in damaged.items()))  # fmt: skip
    return pl.concat(frames, how="diagonal_relaxed"), fallback, damaged


def _window_ends(
    minutes: pl.DataFrame, runs: Sequence[RunEntry], step_ns: int, end: datetime | None
) -> list[int]:
    """Window ends (unix ns), oldest first: see the module docstring."""
    starts = minutes.get_column("minute_start_unix_ns")
    first = int(starts.min()) if starts.len() else runs[0].started_unix_ns  # type: ignore[arg-type]
    last = int(starts.max()) if starts.len() else runs[-1].started_unix_ns  # type: ignore[arg-type]
    if end is None:
        last_end = (last // step_ns + 1) * step_ns
    else:
        aware = end if end.tzinfo is not None else end.replace(tzinfo=UTC)
        last_end = (aware - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000
    return list(range(last_end, first, -step_ns))[::-1]


def _bin_minutes(
    minutes: pl.DataFrame, anchor: int, slot_ns: int
) -> dict[tuple[str, str, int], _Bin]:
    """Merge the per-minute rows into one `_Bin` per (workload, class, slot)."""
    slotted = minutes.with_columns(
        ((pl.col("minute_start_unix_ns") - anchor) // slot_ns).alias("slot")
    )
    bins: dict[tuple[str, str, int], _Bin] = {}
    for row in slotted.iter_rows(named=True):
        _add_minute(bins.setdefault((row["workload"], row["class"], row["slot"]), _Bin()), row)
    return bins


_COUNT_COLUMNS = ("requests", *OUTCOMES, "meets_slo")


def _add_minute(b: _Bin, row: Mapping[str, Any]) -> None:
    """One run's minute of one class (a row of its histograms) into the bin `b`."""
    b.run_ids.add(row["run_id"])
    b.run_requests[row["run_id"]] = b.run_requests.get(row["run_id"], 0) + row["requests"]
    for name in _COUNT_COLUMNS:
        b.counts[name] = b.counts.get(name, 0) + (row.get(name) or 0)
    for metric in METRICS:
        histogram = b.histograms.setdefault(metric, LatencyHistogram())
        if row[metric] is not None:
            histogram.add_encoded(row[metric])


def _add_exact_values(
    bins: dict[tuple[str, str, int], _Bin],
    runs: Sequence[RunEntry],
    classes: Sequence[str],
    anchor: int,
    slot_ns: int,
) -> None:
    """Every run's measures from its records, kept per (workload, class, slot) for exact
    percentiles."""
    for run in runs:
        records = read_records(run.run_dir).filter(pl.col("class").is_in(classes))
        rows, gaps = request_measures(records, t0_unix_ns=run.started_unix_ns, slos=run.slos)
        values = metric_values(rows, gaps).with_columns(
            ((pl.col("minute_start_unix_ns") - anchor) // slot_ns).alias("slot")
        )
        groups = values.partition_by(["class", "slot", "metric"], as_dict=True)
        for (cls, slot, metric), part in groups.items():
            b = bins.get((run.workload_key, str(cls), int(slot)))
            if b is not None:
                array = part.get_column("value_ms").to_numpy()
                b.values_ms.setdefault(str(metric), []).append(array)


def _window_row(parts: Sequence[_Bin], *, exact: bool) -> dict[str, Any]:
    """Counts, attainment and percentiles of one class over the bins of one window."""
    counts = {name: sum(p.counts.get(name, 0) for p in parts) for name in ("requests", *OUTCOMES)}
    requests, ok = counts["requests"], counts[Outcome.OK.value]
    meeting = sum(p.counts.get("meets_slo", 0) for p in parts)
    row: dict[str, Any] = {
        "requests": requests,
        "ok": ok,
        "failures": requests - ok,
        "meets_slo": meeting,
        "attainment": meeting / requests if requests else None,
        "outcomes": {name: counts[name] for name in OUTCOMES},
    }
    for metric in METRICS:
        histogram = LatencyHistogram()
        for p in parts:
            if metric in p.histograms:
                histogram.merge(p.histograms[metric])
        row[f"{metric}_ms_count"] = histogram.count
        row |= _percentile_cells(f"{metric}_ms", histogram.percentiles_ms(PERCENTILES))
        if metric in WITH_FAILURES:
            values = histogram.percentiles_ms(PERCENTILES, failures=requests - ok)
            row |= _percentile_cells(f"{metric}_ms_with_failures", values)
            bounds = histogram.bounds_ms(PERCENTILES, WINDOW_CONFIDENCE, failures=requests - ok)
            row |= _bound_cells(f"{metric}_ms_with_failures", bounds)
        if exact:
            arrays = [a for p in parts for a in p.values_ms.get(metric, [])]
            pooled = np.concatenate(arrays) if arrays else np.empty(0)
            row |= _percentile_cells(f"{metric}_ms", exact_percentiles(pooled), "_exact")
            if metric in WITH_FAILURES:
                values = exact_percentiles(pooled, failures=requests - ok)
                row |= _percentile_cells(f"{metric}_ms_with_failures", values, "_exact")
    if exact:
        row["max_rel_diff"] = _max_rel_diff(row)
    return row


def _percentile_cells(prefix: str, values: Sequence[float], suffix: str = "") -> dict[str, Any]:
    """`{prefix}_p50{suffix}: value, ...`; NaN (empty population) becomes None."""
    return {
        f"{prefix}_p{p:g}{suffix}": None if math.isnan(v) else v
        for p, v in zip(PERCENTILES, values, strict=True)
    }


def _bound_cells(
    prefix: str, bounds: Sequence[tuple[float | None, float | None]]
) -> dict[str, Any]:
    """`{prefix}_p50_low, {prefix}_p50_high, ...`: None where a bound is open, +inf where it
    falls on a failure (as the percentiles: null in JSON)."""
    cells: dict[str, Any] = {}
    for p, (low, high) in zip(PERCENTILES, bounds, strict=True):
        cells[f"{prefix}_p{p:g}_low"] = low
        cells[f"{prefix}_p{p:g}_high"] = high
    return cells


def exact_percentiles(
    values_ms: npt.NDArray[np.float64], *, failures: int = 0, ps: Sequence[float] = PERCENTILES
) -> list[float]:
    """Nearest-rank percentiles of `values_ms` plus `failures` ranked worst (+inf; NaN if empty).

    The same values `metrics.percentiles` gives, by selection (np.partition, O(n)) rather
    than a full sort: a 30-day window holds tens of millions of ITL gaps.
    """
    n = values_ms.size + failures
    if n == 0:
        return [math.nan for _ in ps]
    ranks = [nearest_rank(p, n) for p in ps]
    kth = sorted({r - 1 for r in ranks if r <= values_ms.size})
    selected = np.partition(values_ms, kth) if kth else values_ms
    return [float(selected[r - 1]) if r <= values_ms.size else math.inf for r in ranks]


def _max_rel_diff(row: Mapping[str, Any]) -> float | None:
    """The largest |histogram − exact| / exact over the row's percentiles (0 where both agree
    on a failure or on an empty population)."""
    diffs = []
    for name, exact_value in row.items():
        if not name.endswith("_exact"):
            continue
        value = row[name.removesuffix("_exact")]
        if value == exact_value or (value is None and exact_value is None):
            diffs.append(0.0)
        elif value is None or exact_value is None or math.isinf(value) or math.isinf(exact_value):
            diffs.append(math.inf)
        else:
            diffs.append(abs(value - exact_value) / exact_value if exact_value else math.inf)
    return max(diffs) if diffs else None


def _percentile_columns(*, exact: bool) -> list[str]:
    names = []
    for metric in METRICS:
        names.append(f"{metric}_ms_count")
        prefixes = [f"{metric}_ms"]
        if metric in WITH_FAILURES:
            prefixes.append(f"{metric}_ms_with_failures")
        for prefix in prefixes:
            names.extend(f"{prefix}_p{p:g}" for p in PERCENTILES)
            if exact:
                names.extend(f"{prefix}_p{p:g}_exact" for p in PERCENTILES)
        if metric in WITH_FAILURES:
            names.extend(f"{metric}_ms_with_failures_p{p:g}_{side}"
                         for p in PERCENTILES for side in ("low", "high"))  # fmt: skip
    return names


def _points_frame(rows: Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    """The runs' rows: a run's identity, then the columns a window row has."""
    schema: dict[str, Any] = {
        "run_id": pl.String,
        "run_started": pl.Datetime("us", "UTC"),
        "workload": pl.String,
        "class": pl.String,
        **_figure_schema(exact=False),
    }
    return (
        pl.DataFrame(list(rows), schema=schema, orient="row")
        if rows
        else pl.DataFrame(schema=schema)
    )


def _figure_schema(*, exact: bool) -> dict[str, Any]:
    """The columns a window (or a run) is figured by: counts, attainment, percentiles."""
    schema: dict[str, Any] = {
        "requests": pl.Int64,
        "ok": pl.Int64,
        "failures": pl.Int64,
        "meets_slo": pl.Int64,
        "attainment": pl.Float64,
        "outcomes": pl.Struct(dict.fromkeys(OUTCOMES, pl.Int64)),
    }
    for name in _percentile_columns(exact=exact):
        schema[name] = pl.Int64 if name.endswith("_count") else pl.Float64
    return schema


def _frame(rows: Sequence[Mapping[str, Any]], *, exact: bool) -> pl.DataFrame:
    when = pl.Datetime("ns", "UTC")
    schema: dict[str, Any] = {
        "window_start": pl.Int64,
        "window_end": pl.Int64,
        "workload": pl.String,
        "class": pl.String,
        "runs": pl.Int64,
        "run_ids": pl.List(pl.String),
        "run_started": pl.List(pl.Datetime("us", "UTC")),
        "fallback_runs": pl.List(pl.String),
        **_figure_schema(exact=exact),
    }
    if exact:
        schema["max_rel_diff"] = pl.Float64
    schema["cost_per_million_output_tokens"] = pl.Float64  # null without --price-per-hour
    schema["cost_per_million_good_output_tokens"] = pl.Float64
    frame = (
        pl.DataFrame(list(rows), schema=schema, orient="row")
        if rows
        else pl.DataFrame(schema=schema)
    )
    return frame.with_columns(pl.col("window_start", "window_end").cast(when))


def to_json(frame: pl.DataFrame) -> list[dict[str, Any]]:
    """The rows as JSON-ready dicts: ISO-8601 times, ms rounded to 1 µs, +inf/NaN as None."""
    return [{k: _json_value(v) for k, v in row.items()} for row in frame.iter_rows(named=True)]


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    return value
