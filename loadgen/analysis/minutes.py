"""Per-minute histograms of a run: built from its records, kept beside them, merged by windows.

A 30-day window holds millions of requests and tens of millions of ITL gaps; reading every
record again for each window is slow, so each run also keeps `histograms.parquet`: per class
and per wall-clock minute, mergeable HdrHistograms and the counts attainment needs. This
module builds the frame (`run_histograms`); `results.write` writes the file and
`results.runfolder` reads it. Records stay the source of truth: the histograms are
recomputable from them (and `loadgen.analysis.rolling` does so for a run that has none).
`histograms.parquet`, one row per (class, minute) with at least one request:

- `class` (str); `minute` (int32): minutes since the wall-clock (UTC) minute holding t0;
  `minute_start_unix_ns` (int64): that minute's start on the wall clock
  (`run.json` `t0.unix_ns` + intended_ns, floored to the minute). A request belongs to
  the minute of its *intended* send time.
- `requests`, one count per outcome (`ok`, `rejected`, ... as in `records.OUTCOMES`),
  `meets_slo` (requests meeting every per-request threshold of the run's SLOs, the
  attainment numerator; `slo.per_request`).
- one per measure a target can be set on (`measures.SLO_MEASURES`: `ttft`, `tpot`, `itl`,
  `e2e`; str, null when empty): HdrHistogram V2 base64
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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import polars as pl

from loadgen.analysis.histograms import HIGHEST_US, LatencyHistogram
from loadgen.analysis.slo import per_request
from loadgen.measures import GAP, ITL, SLO_MEASURES
from loadgen.results.records import OUTCOMES, Outcome
from loadgen.results.runfolder import HISTOGRAM_METRICS, read_records
from loadgen.results.runfolder import load_histograms as read_histograms
from loadgen.results.store import read_run_entry
from loadgen.units import NS_PER_MS
from loadgen.workload.spec import SloTargets

NS_PER_MINUTE = 60 * 1_000_000_000


METRICS: tuple[str, ...] = HISTOGRAM_METRICS


COUNT_COLUMNS: tuple[str, ...] = ("requests", *OUTCOMES, "meets_slo")


# HdrHistogram with 3 significant digits keeps 2048 sub-buckets (11 bits): a value of
# bit length b > 11 shares its bucket with every value equal to it in the top 11 bits.
_SUB_BUCKET_BITS = 11


def run_histograms(
    run_dir: Path,
    frame: pl.DataFrame | None = None,
    slos: Mapping[str, SloTargets] | None = None,
) -> pl.DataFrame:
    """`histograms.parquet`'s frame for a run (records and SLOs read from the folder if not
    given); `results.write.write_histograms` writes it."""
    entry = read_run_entry(run_dir)
    records = read_records(run_dir) if frame is None else frame
    return build_histograms(
        records, t0_unix_ns=entry.started_unix_ns, slos=entry.slos if slos is None else slos
    )


def load_histograms(run_dir: Path) -> pl.DataFrame | None:
    """A run's per-minute histograms, or None when it has no readable file with the columns.

    An outcome added to `records.OUTCOMES` after the file was written reads as 0.
    """
    return read_histograms(run_dir, COUNT_COLUMNS)


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
    chunk_ns = pl.col(ITL.end)
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
            (pl.col("gap").cast(pl.Float64) / NS_PER_MS).alias(ITL.column),
        )
        .collect()
    )
    return rows, gaps


def metric_values(rows: pl.DataFrame, gaps: pl.DataFrame) -> pl.DataFrame:
    """Long form (metric, class, minute_start_unix_ns, value_ms) of every histogram value."""
    ok = rows.filter(pl.col("outcome") == Outcome.OK.value)
    keys = ("class", "minute_start_unix_ns")
    parts = [
        (gaps if m.per == GAP else ok)
        .filter(pl.col(m.column).is_not_null())
        .select(pl.lit(m.name).alias("metric"), *keys, pl.col(m.column).alias("value_ms"))
        for m in SLO_MEASURES
    ]
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
