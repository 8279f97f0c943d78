"""What `--prometheus-port` costs the client: CPU per chunk with the live endpoint and without.

Two parts (`--part`, default both), each repeated `--repeats` times, printed per repeat
and as median (min–max):

* `level`: `loadgen calibrate`'s measurement of one level (default 256 streams × 50
  tokens/s for 4 s, one engine process) against the built-in simulator, alternately
  without and with a live exporter whose endpoint a scraper thread in the same process
  reads every `--scrape-every` seconds (so the exposition's own CPU is counted too: process
  CPU covers every thread). Client CPU µs per chunk, and the difference of the medians.
* `observe`: the exporter's only work on the engine's side, `LiveTally.observe` (one call
  per finished request, never per chunk), over synthetic records of `--tokens` chunks: µs
  per record and per chunk, no sockets.

Usage (from the repository root):

    python benchmarks/live_overhead.py
    python benchmarks/live_overhead.py --part level --repeats 5 --streams 512
    python benchmarks/live_overhead.py --part observe --tokens 500
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import urllib.request
from statistics import median

from loadgen.analysis.calibration import Ladder, Thresholds
from loadgen.analysis.live import LiveTally
from loadgen.results.records import Outcome, RequestRecord
from loadgen.run.live import LiveExporter
from loadgen.studies.calibrate import measure_level


def spread(values: list[float]) -> str:
    return f"{median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}"


def level_figures(streams: int, seconds: float, live: LiveExporter | None) -> tuple[float, ...]:
    """CPU µs per chunk, send lag p99 ms and timestamp error p99 ms of one level."""
    ladder = Ladder(streams=(streams,), stream_s=seconds, ramp_s=0.5)
    level = measure_level(streams, ladder, Thresholds(), live=live)
    return level.cpu_us_per_chunk, level.send_lag_p99_ms, level.timestamp_err_p99_ms


def scrape_until(url: str, every_s: float, halt: threading.Event, counter: list[int]) -> None:
    while not halt.wait(every_s):
        with urllib.request.urlopen(url, timeout=5) as response:
            response.read()
        counter[0] += 1


def part_level(args: argparse.Namespace) -> None:
    print(f"level: {args.streams} streams × 50 tokens/s for {args.seconds:g} s, one process; "
          f"scrape every {args.scrape_every:g} s")  # fmt: skip
    without: list[tuple[float, ...]] = []
    with_live: list[tuple[float, ...]] = []
    for repeat in range(args.repeats):
        without.append(level_figures(args.streams, args.seconds, None))
        live = LiveExporter(port=0, grace_s=0)
        assert live.url is not None
        halt, scrapes = threading.Event(), [0]
        scraper = threading.Thread(target=scrape_until,
                                   args=(live.url, args.scrape_every, halt, scrapes))  # fmt: skip
        scraper.start()
        with_live.append(level_figures(args.streams, args.seconds, live))
        halt.set()
        scraper.join()
        live.close()
        (a, b, c), (x, y, z) = without[-1], with_live[-1]
        print(f"  repeat {repeat + 1}: without {a:.2f} µs/chunk, lag p99 {b:.2f} ms, stamp err "
              f"p99 {c:.2f} ms · with endpoint {x:.2f} µs/chunk, lag p99 {y:.2f} ms, stamp err "
              f"p99 {z:.2f} ms ({scrapes[0]} scrapes) · {load_text()}")  # fmt: skip
    for i, (name, unit) in enumerate(
        [("CPU per chunk", "µs"), ("send lag p99", "ms"), ("timestamp error p99", "ms")]
    ):
        off, on = [f[i] for f in without], [f[i] for f in with_live]
        delta = median(on) - median(off)
        print(f"{name}: without {spread(off)} {unit} · with --prometheus-port {spread(on)} "
              f"{unit} · difference of the medians {delta:+.2f} {unit}")  # fmt: skip


def synthetic_record(request_id: int, tokens: int) -> RequestRecord:
    chunks = tuple(100_000_000 + i * 20_000_000 for i in range(tokens))
    return RequestRecord(
        request_id=request_id, class_name="chat", intended_ns=0, outcome=Outcome.OK,
        dispatched_ns=1000, sent_ns=2000, first_token_ns=chunks[0], last_token_ns=chunks[-1],
        end_ns=chunks[-1] + 1000, chunk_ns=chunks, chunk_tokens=(1,) * tokens,
        output_tokens=tokens,
    )  # fmt: skip


def part_observe(args: argparse.Namespace) -> None:
    records = [synthetic_record(i, args.tokens) for i in range(args.records)]
    per_record: list[float] = []
    for _ in range(args.repeats):
        tally = LiveTally({"chat": {"ttft_ms": 1000.0, "tpot_ms": 50.0}})
        start = time.process_time()
        for record in records:
            tally.observe(record)
        per_record.append((time.process_time() - start) / len(records) * 1e6)
    per_chunk = [v / args.tokens for v in per_record]
    print(f"observe: {args.records:,} records of {args.tokens} chunks, {args.repeats} repeats")
    print(f"  µs per record: {spread(per_record)}; µs per chunk: {spread(per_chunk)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["level", "observe", "all"], default="all")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--scrape-every", type=float, default=1.0)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args()
    if args.part in ("observe", "all"):
        part_observe(args)
    if args.part in ("level", "all"):
        part_level(args)


if __name__ == "__main__":
    main()
