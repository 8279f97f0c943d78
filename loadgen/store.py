"""Results store: the runs under one folder, and per-minute histograms next to their records.

Sits after the run (which leaves `run.json` and `records.parquet` in `<store>/<run-id>/`)
and before the reports over many runs (`rolling.py`). A 30-day window holds millions of
requests and tens of millions of ITL gaps; reading every record again for each window is
slow, so each run also keeps `histograms.parquet`: per class and per wall-clock minute,
mergeable HdrHistograms and the counts attainment needs. Records stay the source of
truth: the histograms are recomputable from them (and `rolling.py` does so for a run
that has none).

`histograms.parquet`, one row per (class, minute) with at least one request:

- `class` (str); `minute` (int32): minutes since the wall-clock (UTC) minute holding t0;
  `minute_start_unix_ns` (int64): that minute's start on the wall clock
  (`run.json` `t0.unix_ns` + intended_ns, floored to the minute). A request belongs to
  the minute of its *intended* send time.
- `requests`, one count per outcome (`ok`, `rejected`, ... as in `records.OUTCOMES`),
  `meets_slo` (requests meeting every per-request threshold of the run's SLOs, the
  attainment numerator; `slo.per_request`).
- `ttft`, `tpot`, `itl`, `e2e` (str, null when empty): HdrHistogram V2 base64
  (`LatencyHistogram.encode`: µs, 3 significant digits, 1 µs to 1 hour, values above the
  range counted as overflow) of TTFT from the intended time (ok requests), TPOT (ok,
  N > 1), every ITL gap (ok requests) and E2E (ok). Failures are not in the histograms;
  the counts say how many to rank worst.

Histograms are filled per bucket, not per value: every value is rounded to whole µs (as
`LatencyHistogram.record_ms` does) and mapped with numpy to the lowest value of its
HdrHistogram bucket, and each bucket is recorded once with its count. That loses
nothing (a bucket is the histogram's resolution) and records ~10x fewer values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from loadgen.errors import LoadgenError
from loadgen.histograms import HIGHEST_US, LatencyHistogram
from loadgen.metrics import NS_PER_MS
from loadgen.records import OUTCOMES, Outcome, read_records, write_parquet_atomic
from loadgen.slo import STOPS, SloTargets, per_request

HISTOGRAMS_FILE = "histograms.parquet"
RUN_FILE = "run.json"
NS_PER_MINUTE = 60 * 1_000_000_000
METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e")
COUNT_COLUMNS: tuple[str, ...] = ("requests", *OUTCOMES, "meets_slo")
# HdrHistogram with 3 significant digits keeps 2048 sub-buckets (11 bits): a value of
# bit length b > 11 shares its bucket with every value equal to it in the top 11 bits.
_SUB_BUCKET_BITS = 11


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEntry:
    """One run folder of the store, as its `run.json` describes it."""

    run_dir: Path
    run_id: str
    started_unix_ns: int  # t0 on the wall clock
    workload: str  # its name
    slos: Mapping[str, SloTargets] = field(default_factory=dict)
    workload_key: str = ""  # `name@fingerprint`: what the store pools by (`loadgen.identity`)
    offered_rate_per_s: float | None = None
    stopped: str | None = (
        None  # `run_stop`: interrupted, watchdog, incomplete; None: ran to its end
    )

    @property
    def is_complete(self) -> bool:
        """Ran to its end: a stopped run is left out of windows and baselines unless asked."""
        return self.stopped is None

    @property
    def started(self) -> datetime:
        """t0 as an aware UTC datetime."""
        return datetime.fromtimestamp(self.started_unix_ns / 1e9, UTC)


def discover_runs(store_dir: Path) -> list[RunEntry]:
    """Every run folder directly under `store_dir` that has a `run.json`, oldest t0 first."""
    entries = [read_run_entry(path.parent) for path in store_dir.glob(f"*/{RUN_FILE}")]
    return sorted(entries, key=lambda e: (e.started_unix_ns, e.run_id))


def select_runs(
    runs: Sequence[RunEntry], *, workload: str | None = None, include_incomplete: bool = False
) -> list[RunEntry]:
    """The runs a pooled report may use: complete ones (unless `include_incomplete`), of the
    workload `workload` names (a name, which may cover several fingerprints, each still its
    own workload, or one `name@fingerprint` key) when given."""
    chosen = [r for r in runs if include_incomplete or r.is_complete]
    if workload is not None:
        chosen = [r for r in chosen if workload in (r.workload, r.workload_key)
                  or (("@" in workload) and r.workload_key.startswith(workload))]  # fmt: skip
    return chosen


def read_run_entry(run_dir: Path) -> RunEntry:
    """A run's `run.json` as a `RunEntry` (LoadgenError if it is unreadable or has no t0)."""
    info = _read_run_json(run_dir)
    try:
        started = int(info["t0"]["unix_ns"])
        workload = info["workload"]
        classes = workload.get("spec", {}).get("classes", {})
        slos = {str(name): _slo_targets(cls.get("slo") or {}) for name, cls in classes.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LoadgenError(f"{run_dir / RUN_FILE}: not a loadgen run.json ({exc!r})") from None
    ident = _identity(info)
    return RunEntry(
        run_dir=run_dir,
        run_id=str(info.get("run_id", run_dir.name)),
        started_unix_ns=started,
        workload=str(workload.get("name", "")),
        slos=slos,
        workload_key=str(ident.get("key") or f"{workload.get('name', '')}@unknown"),
        offered_rate_per_s=ident.get("offered_rate_per_s"),
        stopped=run_stop(info),
    )


def _identity(info: Mapping[str, Any]) -> dict[str, Any]:
    """The run's workload identity; for a run whose stored spec this loadgen cannot rebuild,
    none (its key is then `name@unknown`: a workload of its own)."""
    from loadgen.identity import identity_of_run

    try:
        return identity_of_run(info)
    except LoadgenError:
        return {}


def run_stop(info: Mapping[str, Any]) -> str | None:
    """How a run stopped before its end, from its run.json (a key of `slo.STOPS`), or None.

    `incomplete`: killed outright (`finished: false`: it never wrote its end) or recovered
    from its parts; `watchdog`: stopped by it; `interrupted`: Ctrl-C or SIGTERM. Runs
    written before `stopped` was recorded are read from `interrupted` and `finished`.
    """
    if info.get("recovered") or not info.get("finished", True):
        return "incomplete"
    stopped = info.get("stopped")
    if stopped in STOPS:
        return str(stopped)
    if info.get("watchdog"):
        return "watchdog"
    return "interrupted" if info.get("interrupted") else None


def _read_run_json(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LoadgenError(f"{path}: cannot read run.json ({exc})") from None
    if not isinstance(info, dict):
        raise LoadgenError(f"{path}: not a loadgen run.json (not an object)")
    return info


def _slo_targets(slo: Mapping[str, Any]) -> SloTargets:
    known = {f.name for f in fields(SloTargets)}
    return SloTargets(**{k: v for k, v in slo.items() if k in known and v is not None})


def write_histograms(
    run_dir: Path,
    frame: pl.DataFrame | None = None,
    slos: Mapping[str, SloTargets] | None = None,
) -> Path:
    """Write `histograms.parquet` for a run (records and SLOs read from the folder if not given)."""
    entry = read_run_entry(run_dir)
    records = read_records(run_dir) if frame is None else frame
    minutes = build_histograms(
        records, t0_unix_ns=entry.started_unix_ns, slos=entry.slos if slos is None else slos
    )
    path = run_dir / HISTOGRAMS_FILE
    write_parquet_atomic(minutes, path)
    return path


def load_histograms(run_dir: Path) -> pl.DataFrame | None:
    """A run's per-minute histograms, or None when it has no readable file with the columns.

    An outcome added to `records.OUTCOMES` after the file was written reads as 0.
    """
    path = run_dir / HISTOGRAMS_FILE
    if not path.exists():
        return None
    try:
        minutes = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError):
        return None
    required = ("class", "minute_start_unix_ns", "requests", Outcome.OK.value, "meets_slo")
    if any(name not in minutes.columns for name in (*required, *METRICS)):
        return None
    absent = [name for name in COUNT_COLUMNS if name not in minutes.columns]
    return minutes.with_columns(pl.lit(0, pl.Int64).alias(name) for name in absent)


def minute_start_ns(intended_ns: pl.Expr, t0_unix_ns: int) -> pl.Expr:
    """The wall-clock minute (unix ns, floored) of an intended time in ns since t0."""
    return ((intended_ns + t0_unix_ns) // NS_PER_MINUTE) * NS_PER_MINUTE


def request_measures(
    frame: pl.DataFrame, *, t0_unix_ns: int, slos: Mapping[str, SloTargets] | None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per request (class, minute_start_unix_ns, outcome, ms measures, meets_slo) and
    every ITL gap of ok requests (class, minute_start_unix_ns, itl_ms).

    The measures are `slo.per_request`'s; ITL gaps are successive `chunk_ns` differences,
    as in `metrics.itl_gaps_ms`. Both the histograms and the exact window figures read
    these, so the two can only differ by histogram resolution.
    """
    minute = frame.select(minute_start_ns(pl.col("intended_ns"), t0_unix_ns)).to_series()
    rows = per_request(frame, slos=slos).with_columns(minute.alias("minute_start_unix_ns"))
    chunk_ns = pl.col("chunk_ns")
    gaps = (
        frame.lazy()
        .filter(pl.col("outcome") == Outcome.OK.value)
        .select(
            "class",
            minute_start_ns(pl.col("intended_ns"), t0_unix_ns).alias("minute_start_unix_ns"),
            (chunk_ns.list.slice(1) - chunk_ns.list.head(chunk_ns.list.len() - 1)).alias("gap"),
        )
        .explode("gap")
        .drop_nulls("gap")
        .select(
            "class",
            "minute_start_unix_ns",
            (pl.col("gap").cast(pl.Float64) / NS_PER_MS).alias("itl_ms"),
        )
        .collect()
    )
    return rows, gaps


def metric_values(rows: pl.DataFrame, gaps: pl.DataFrame) -> pl.DataFrame:
    """Long form (metric, class, minute_start_unix_ns, value_ms) of every histogram value."""
    ok = rows.filter(pl.col("outcome") == Outcome.OK.value)
    keys = ("class", "minute_start_unix_ns")
    parts = [
        ok.filter(pl.col(f"{m}_ms").is_not_null()).select(
            pl.lit(m).alias("metric"), *keys, pl.col(f"{m}_ms").alias("value_ms")
        )
        for m in ("ttft", "tpot", "e2e")
    ]
    parts.append(
        gaps.select(pl.lit("itl").alias("metric"), *keys, pl.col("itl_ms").alias("value_ms"))
    )
    return pl.concat(parts, how="vertical_relaxed")


def build_histograms(
    frame: pl.DataFrame, *, t0_unix_ns: int, slos: Mapping[str, SloTargets] | None
) -> pl.DataFrame:
    """The `histograms.parquet` frame of a records frame (see the module docstring)."""
    rows, gaps = request_measures(frame, t0_unix_ns=t0_unix_ns, slos=slos)
    keys = ["class", "minute_start_unix_ns"]
    counts = rows.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("requests"),
        *[(pl.col("outcome") == o).sum().cast(pl.Int64).alias(o) for o in OUTCOMES],
        pl.col("meets_slo").sum().cast(pl.Int64).alias("meets_slo"),
    )
    encoded = _encoded_histograms(metric_values(rows, gaps))
    t0_minute = (t0_unix_ns // NS_PER_MINUTE) * NS_PER_MINUTE
    return (
        counts.join(encoded, on=keys, how="left")
        .with_columns(
            ((pl.col("minute_start_unix_ns") - t0_minute) // NS_PER_MINUTE)
            .cast(pl.Int32)
            .alias("minute")
        )
        .select("class", "minute", "minute_start_unix_ns", *COUNT_COLUMNS, *METRICS)
        .sort("class", "minute")
    )


def _encoded_histograms(values: pl.DataFrame) -> pl.DataFrame:
    """One row per (class, minute) with an encoded histogram column per metric (null if none)."""
    keys = ["metric", "class", "minute_start_unix_ns"]
    us = values.get_column("value_ms").to_numpy() * 1000.0
    if us.size and (np.isnan(us).any() or us.min() < 0):
        raise ValueError("a latency must be >= 0 (a negative or NaN measure is a bug upstream)")
    overflow = us > HIGHEST_US
    buckets = np.where(overflow, -1, _lowest_in_bucket(np.rint(np.where(overflow, 0, us))))
    bucket = pl.col("bucket")
    per_histogram = (
        values.select(keys)
        .with_columns(pl.Series("bucket", buckets, dtype=pl.Int64))
        .group_by([*keys, "bucket"])
        .len()
        .group_by(keys)
        .agg(
            bucket.filter(bucket >= 0).alias("buckets"),
            pl.col("len").filter(bucket >= 0).alias("counts"),
            pl.col("len").filter(bucket < 0).sum().alias("overflow"),
        )
    )
    out: dict[str, list[Any]] = {"metric": [], "class": [], "minute_start_unix_ns": [], "h": []}
    for row in per_histogram.iter_rows(named=True):
        histogram = LatencyHistogram()
        histogram.record_counts_us(row["buckets"], row["counts"])
        histogram.record_overflow(int(row["overflow"]))
        for name in keys:
            out[name].append(row[name])
        out["h"].append(histogram.encode())
    schema = {"metric": pl.String, "class": pl.String, "minute_start_unix_ns": pl.Int64}
    long = pl.DataFrame(out, schema={**schema, "h": pl.String})
    wide = long.pivot(on="metric", index=["class", "minute_start_unix_ns"], values="h")
    missing = [pl.lit(None, pl.String).alias(m) for m in METRICS if m not in wide.columns]
    return wide.with_columns(missing)


def _lowest_in_bucket(values_us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Each whole-µs value mapped to the lowest value of its HdrHistogram bucket.

    A value of bit length b > 11 shares its bucket with the values that agree with it in
    the top 11 bits; below 2048 µs every µs is its own bucket. frexp gives b exactly for
    integers below 2**53.
    """
    ints = values_us.astype(np.int64)
    _, bit_length = np.frexp(values_us)
    shift = np.maximum(bit_length.astype(np.int64) - _SUB_BUCKET_BITS, 0)
    return np.left_shift(np.right_shift(ints, shift), shift)
