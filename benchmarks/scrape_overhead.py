"""What does scraping the server's /metrics cost the client, per chunk?

Runs the same workload through `loadgen.run.execute` (the code `loadgen run` runs) against
one `loadgen sim` process (`running_sim`: its CPU is another process's), alternately without
scraping and with `--server-metrics-url /metrics` at `--interval` (default 1 s), `--repeats`
times each. Per run it reports chunks received and this process's user + system CPU time
during `execute` ÷ chunks (µs per chunk: the engine, the scraper thread and the run's own
bookkeeping, which is the same in both arms); then per arm the median (min–max) over repeats,
and the difference of the medians. It also times the scraper's own work in isolation: one GET
+ parse of the simulator's exposition (`Scraper.scrape_once`), median of 200.

The simulator's physics are set so the client is busy: a flat decode step of `--gap-ms`, a
batch that holds every stream, near-instant prefill; `--streams` sessions of `--tokens`
tokens each, all started within the first second.

Usage (from the repository root):

    python benchmarks/scrape_overhead.py
    python benchmarks/scrape_overhead.py --streams 128 --tokens 200 --gap-ms 20 --repeats 5
"""

from __future__ import annotations

import argparse
import io
import resource
import tempfile
import time
from pathlib import Path
from statistics import median

import httpx
import polars as pl

from loadgen.analysis.server import with_server
from loadgen.engine.scrape import Scraper
from loadgen.results.runfolder import read_server_metrics
from loadgen.run.execute import RunOptions, execute
from loadgen.run.simulator import running_sim
from loadgen.workload.spec import load

WORKLOAD = """\
name: scrape-overhead
target: {{api: openai-chat, model: sim}}
classes:
  chat:
    arrival: {{process: constant, rate_per_s: {rate}}}
    requests: {streams}
    prompt_tokens: {{dist: fixed, value: 16}}
    output_tokens: {{dist: fixed, value: {tokens}}}
    deadlines: {{first_token_s: 30, stall_s: 30, total_s: 120}}
"""


def cpu_s() -> float:
    """This process's user + system CPU seconds (every thread: the scraper's too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_run(
    spec_path: Path, url: str, out: Path, run_id: str, scrape_s: float | None
) -> dict[str, float]:
    """One `execute`; CPU per chunk (µs) and what it received."""
    options = RunOptions(url=url, out_dir=out, run_id=run_id, quiet=True, lag_bound_ms=1000.0,
                         server_metrics_url="/metrics" if scrape_s else None,
                         server_metrics_interval_s=scrape_s)  # fmt: skip
    spec = load(spec_path)
    before = cpu_s()
    result = execute(spec, options, log=io.StringIO())
    cpu = cpu_s() - before
    records = pl.read_parquet(result.run_dir / "records.parquet")
    chunks = int(records["chunk_ns"].list.len().sum())
    failed = int((records["outcome"] != "ok").sum())
    scrapes = result.summary.server.scrapes if result.summary.server else 0
    audit_cpu = 0.0
    if scrape_s:  # the end-of-run work on the scraped rows, done again to time it alone
        before = cpu_s()
        with_server(result.summary, read_server_metrics(result.run_dir),
                    result.run_info.server_metrics, records)  # fmt: skip
        audit_cpu = cpu_s() - before
    return {"chunks": chunks, "cpu_us_per_chunk": cpu / chunks * 1e6, "failed": failed,
            "scrapes": scrapes, "audit_us_per_chunk": audit_cpu / chunks * 1e6}  # fmt: skip


def scrape_cost_us(url: str, n: int = 200) -> float:
    """Median wall µs of one scrape (GET + parse + rows) of the simulator's /metrics."""
    scraper = Scraper(url + "/metrics", 1.0)
    times = []
    with httpx.Client(timeout=5) as client:
        for _ in range(n):
            start = time.perf_counter_ns()
            scraper.scrape_once(client)
            times.append((time.perf_counter_ns() - start) / 1e3)
    return median(times)


def spread(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=1.0, help="scrape interval (s)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sim = ["--decode-step-ms", f"{args.gap_ms:g}", "--max-batch", str(args.streams),
           "--prefill-tokens-per-s", "100000000"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, running_sim(sim) as server:
        folder = Path(tmp)
        spec_path = folder / "w.yaml"
        spec_path.write_text(WORKLOAD.format(rate=args.streams, streams=args.streams,
                                             tokens=args.tokens))  # fmt: skip
        arms: dict[str, list[float]] = {
            "without scraping": [],
            f"scraping every {args.interval:g} s": [],
        }
        audits: list[float] = []
        for repeat in range(args.repeats):
            for arm, interval in zip(arms, (None, args.interval), strict=True):
                row = one_run(spec_path, server.url, folder, f"r{repeat}-{interval}", interval)
                arms[arm].append(row["cpu_us_per_chunk"])
                if interval:
                    audits.append(row["audit_us_per_chunk"])
                print(f"repeat {repeat} {arm:>24}: {row['chunks']:,} chunks, "
                      f"{row['cpu_us_per_chunk']:.2f} µs CPU/chunk, {row['scrapes']} scrapes, "
                      f"{row['failed']} failed")  # fmt: skip
        print()
        for arm, values in arms.items():
            print(f"{arm:>26}: {spread(values)} µs CPU per chunk "
                  f"(median (min–max) of {args.repeats})")  # fmt: skip
        base, scraped = (median(v) for v in arms.values())
        print(f"{'difference':>26}: {scraped - base:+.2f} µs per chunk "
              f"({(scraped - base) / base:+.1%})")  # fmt: skip
        print(f"{'of which end-of-run audit':>26}: {spread(audits)} µs per chunk (the server "
              "block from the rows: once per run, not per chunk)")  # fmt: skip
        print(f"{'one scrape':>26}: {scrape_cost_us(server.url):.0f} µs wall "
              "(GET + parse, median of 200)")  # fmt: skip


if __name__ == "__main__":
    main()
