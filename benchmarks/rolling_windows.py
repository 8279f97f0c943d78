"""Rolling 30-day windows over a store of nightly runs: histograms vs exact records.

Synthesises N nightly runs (default 30 × 100,000 requests, one day apart) directly with
numpy (no network): Poisson arrivals at `--rate`, lognormal TTFT (median 250 ms), 10-30
chunks per request (~20) with lognormal per-request pace (median 25 ms) and per-gap
jitter, ~0.3 % failures; nights 18-20 regress (TTFT ×1.8, 2 % failures) so the plot has
something to show. Each run folder gets `run.json` (t0 on its night) and
`records.parquet` like `loadgen run` leaves them. Then it measures:

* `write_histograms` per run (s, median and min–max over the runs),
* `rolling_windows(store, window=30d, step=1d)` from the histograms, and with
  `exact=True` from the records, each `--repeats` times (median, min–max),
* the largest relative difference histogram vs exact over every percentile of every window.

Usage: python benchmarks/rolling_windows.py --runs 30 --requests 100000 --repeats 3
       [--store DIR] [--plot rolling.png]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl

from loadgen.analysis.minutes import run_histograms
from loadgen.analysis.rolling import rolling_windows
from loadgen.render.rolling_view import render_rolling_table, rolling_plot
from loadgen.results.records import SCHEMA, Outcome
from loadgen.results.write import write_histograms
from loadgen.workload.spec import SloTargets

SLO = SloTargets(ttft_ms=1000, tpot_ms=50, percentile=99)
NS_PER_MS = 1_000_000


def synth_records(rng: np.random.Generator, n: int, rate: float, bad: bool) -> pl.DataFrame:
    """n records with `records.SCHEMA`: ok requests stream 10-30 chunks, failures have none."""
    intended = np.cumsum(rng.exponential(1e9 / rate, n)).astype(np.int64)
    ttft_ns = rng.lognormal(np.log(250 * (1.8 if bad else 1.0)), 0.5, n) * NS_PER_MS
    failed = rng.random(n) < (0.02 if bad else 0.003)
    chunks = np.where(failed, 0, rng.integers(10, 31, n))
    pace_ms = rng.lognormal(np.log(25.0), 0.25, n)
    request_of_chunk = np.repeat(np.arange(n), chunks)
    gaps = rng.lognormal(0.0, 0.3, request_of_chunk.size) * pace_ms[request_of_chunk] * NS_PER_MS
    starts = np.concatenate(([0], np.cumsum(chunks)[:-1]))
    gaps[starts[chunks > 0]] = 0.0  # the first chunk comes at TTFT
    within = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[starts] - gaps[starts], chunks)
    first = intended + ttft_ns.astype(np.int64)
    chunk_ns = (np.repeat(first, chunks) + within.astype(np.int64)).astype(np.int64)
    lists = (
        pl.DataFrame({"request_id": request_of_chunk, "chunk_ns": chunk_ns})
        .group_by("request_id", maintain_order=True)
        .agg("chunk_ns")
    )
    outcomes = np.where(
        failed,
        rng.choice([Outcome.TIMEOUT_FIRST_TOKEN.value, Outcome.REJECTED.value], n),
        Outcome.OK.value,
    )
    frame = pl.DataFrame(
        {"request_id": np.arange(n), "class": "chat", "intended_ns": intended, "outcome": outcomes}
    ).join(lists, on="request_id", how="left")
    return frame.with_columns(
        pl.col("intended_ns").alias("sent_ns"),
        pl.col("chunk_ns").list.first().alias("first_token_ns"),
        pl.col("chunk_ns").list.last().alias("last_token_ns"),
        pl.col("chunk_ns").list.last().fill_null(pl.col("intended_ns")).alias("end_ns"),
        pl.col("chunk_ns").list.len().fill_null(0).alias("output_tokens"),
        pl.lit("chunks").alias("token_source"),
    ).select(
        [
            pl.col(name).cast(dtype) if name in frame.columns or name in _DERIVED else
            pl.lit(None, dtype).alias(name)
            for name, dtype in SCHEMA.items()
        ]
    )  # fmt: skip


_DERIVED = {"sent_ns", "first_token_ns", "last_token_ns", "end_ns", "output_tokens", "token_source"}


def write_store(store: Path, runs: int, requests: int, rate: float) -> None:
    """`runs` run folders, t0 at 02:00 UTC on successive nights."""
    first = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    for night in range(runs):
        t0 = first + timedelta(days=night)
        run_dir = store / f"{t0:%Y%m%dT%H%M%SZ}-chat-nightly"
        run_dir.mkdir(parents=True)
        rng = np.random.default_rng(night)
        synth_records(rng, requests, rate, bad=night in (17, 18, 19)).write_parquet(
            run_dir / "records.parquet"
        )
        slo = {"ttft_ms": SLO.ttft_ms, "tpot_ms": SLO.tpot_ms, "percentile": SLO.percentile}
        info = {
            "run_id": run_dir.name,
            "planned": requests,
            "workload": {"name": "chat-nightly", "spec": {"classes": {"chat": {"slo": slo}}}},
            "t0": {"unix_ns": int(t0.timestamp() * 1e9), "utc": t0.isoformat()},
        }
        (run_dir / "run.json").write_text(json.dumps(info), encoding="utf-8")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}–{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s of each run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", type=Path, help="keep the store here (default: a temp dir)")
    parser.add_argument("--plot", type=Path, help="write the TTFT plot (PNG) here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or Path(tmp)
        started = time.perf_counter()
        write_store(store, args.runs, args.requests, args.rate)
        print(f"synthesised {args.runs} runs × {args.requests:,} requests in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        per_run = []
        for run_dir in sorted(p.parent for p in store.glob("*/run.json")):
            t = time.perf_counter()
            path = write_histograms(run_dir, run_histograms(run_dir))
            per_run.append(time.perf_counter() - t)
        size = path.stat().st_size
        print(f"write_histograms per run: {spread(per_run)}; {size / 1024:.0f} KiB per file")
        window, step = timedelta(days=30), timedelta(days=1)
        timings: dict[str, list[float]] = {"histograms": [], "exact": []}
        frame = exact_frame = pl.DataFrame()
        for repeat in range(args.repeats):
            t = time.perf_counter()
            frame = rolling_windows(store, window=window, step=step)
            timings["histograms"].append(time.perf_counter() - t)
            t = time.perf_counter()
            exact_frame = rolling_windows(store, window=window, step=step, exact=True)
            timings["exact"].append(time.perf_counter() - t)
            print(f"repeat {repeat + 1}: histograms {timings['histograms'][-1]:.3f} s, "
                  f"exact {timings['exact'][-1]:.3f} s")  # fmt: skip
        print(f"rolling_windows 30d/1d over {frame.height} windows from histograms: "
              f"{spread(timings['histograms'])}")  # fmt: skip
        print(
            f"rolling_windows 30d/1d with exact=True (records):        {spread(timings['exact'])}"
        )
        worst = exact_frame.get_column("max_rel_diff").max()
        print(f"max relative difference histogram vs exact: {worst:.3e}")
        same = exact_frame.select(frame.columns).equals(frame)
        print(f"histogram columns identical with and without exact=True: {same}")
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS {peak_mib:.0f} MiB")
        from rich.console import Console

        Console(width=140).print(render_rolling_table(exact_frame.tail(8)))
        if args.plot:
            args.plot.write_bytes(rolling_plot(frame, slo_ms={"chat": SLO}))
            print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
