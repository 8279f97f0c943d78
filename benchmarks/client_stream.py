"""What does loadgen's streaming client cost, and how true are its timestamps?

Drives the real engine (`loadgen.engine.runner.Engine` on a
`loadgen.engine.transport.Pool`, through the engine harness `loadgen run` uses, on uvloop
when installed) against `loadgen sim`
in its own process (`running_sim`), and checks every client timestamp against the
simulator's trace. Each repeat starts a fresh simulator with a clean token cadence (flat
decode step = the token gap, a batch that holds every stream, near-instant prefill, output
length forced by max_tokens + ignore_eos), then sends `--streams` requests spread evenly
over `--ramp-s` seconds; all of them are then open together. Per repeat, and as median
(min–max) over repeats, it reports:

* chunks received, chunks/s (over the span of client chunk arrivals), failures by outcome;
* client CPU per chunk (µs): this process's user + system CPU time during the engine run
  ÷ chunks received (the simulator is another process, so it is excluded), and the
  client's CPU utilisation (CPU s / wall s of the run, 1.0 = one core); and the steady
  figure, CPU per chunk only while every stream is open (sampled every 50 ms), which
  leaves out connection setup and teardown;
* timestamp error (ms): client arrival of content chunk i of a request − the simulator's
  write time of the same chunk (matched by `X-Request-Id: loadgen-<id>` and chunk index;
  both clocks are `perf_counter_ns`, i.e. CLOCK_MONOTONIC on Linux), min/p50/p99/max;
  the simulator stamps a chunk just *after* its write() returns, so a small negative min
  only means the client read it before the simulator got the CPU back; also over the
  steady state alone (chunks written while every stream is open);
* TTFT error (ms): client `first_token_ns` − the simulator's write time of chunk 0;
* send lag (ms): dispatched − intended, p99/max (the open-loop scheduler's health);
* contention during the run, to tell the client's cost from a busy machine: the client's
  involuntary context switches, the simulator's CPU utilisation, the host's CPU-pressure
  stall time (/proc/pressure/cpu "some") and vCPU steal time.

The bar it is held to: ≤ 40 µs CPU per chunk; timestamp error p99 ≤ 5 ms and TTFT error
p99 ≤ 2 ms at 256 streams × 20 ms gaps; no failures at 1,000 streams × 200 ms gaps.
Exit code 1 when any request failed.

Usage (from the repository root):

    python benchmarks/client_stream.py --streams 256 --gap-ms 20 --tokens 100
    python benchmarks/client_stream.py --mode hold   # 1,000 streams × 200 ms gaps × 30 tokens
    python benchmarks/client_stream.py --streams 128 --repeats 1 --profile client.prof
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from time import perf_counter_ns
from typing import Any

import anyio
import numpy as np

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.engine.harness import run_beside
from loadgen.engine.harness import run_engine as run_engine_harness
from loadgen.engine.host import backend_options, quiet_gc
from loadgen.engine.runner import Engine, EngineConfig
from loadgen.engine.transport import Pool, make_endpoint
from loadgen.results.records import Outcome, RequestRecord
from loadgen.run.processes.simulator import running_sim
from loadgen.workload.plans import RequestPlan
from loadgen.workload.spec import Deadlines

STAMPS = {"auto": None, "kernel": True, "user": False}  # --stamps: Pool(kernel_stamps=...)
MODES = {  # --mode: defaults for --streams, --gap-ms, --tokens
    "cadence": (256, 20.0, 100),
    "hold": (1000, 200.0, 30),
}
BAR_CPU_US_PER_CHUNK = 40.0
BAR_TIMESTAMP_P99_MS = 5.0
BAR_TTFT_P99_MS = 2.0
START_DELAY_NS = 20_000_000  # t0 a little after now, as run_engine does
SAMPLE_S = 0.05  # CPU sampling period, for the steady-state figure


@dataclass(frozen=True, slots=True)
class EngineRun:
    """What one engine run produced: records, its t0 and what it cost."""

    records: list[RequestRecord]
    t0_ns: int
    cpu_user_s: float
    cpu_sys_s: float
    wall_s: float
    cpu_samples: list[tuple[int, float]]  # (perf_counter_ns, process CPU s) every SAMPLE_S


def make_plans(streams: int, tokens: int, prompt_tokens: int, ramp_s: float) -> list[RequestPlan]:
    """`streams` plans with intended times evenly spread over [0, ramp_s)."""
    step_ns = int(ramp_s * 1e9) // max(streams, 1)
    return [
        RequestPlan(
            request_id=i,
            class_name="bench",
            intended_ns=i * step_ns,
            prompt_tokens=prompt_tokens,
            output_tokens=tokens,
            deadlines=Deadlines(),
        )
        for i in range(streams)
    ]


def sim_args(streams: int, gap_ms: float) -> list[str]:
    """A simulator with a clean cadence: one token per stream every `gap_ms`, all batched."""
    return [
        "--decode-step-ms", f"{gap_ms:g}",
        "--max-batch", str(max(streams, 1)),
        "--prefill-tokens-per-s", "100000000",
        "--speed", "1",
    ]  # fmt: skip  # flag/value pairs read better one per line


def run_engine(
    plans: Sequence[RequestPlan],
    url: str,
    profiler: cProfile.Profile | None,
    kernel_stamps: bool | None = None,
) -> EngineRun:
    """Run the plans through the engine harness on a Pool, as `loadgen run` does, timed."""
    adapter = adapter_for("openai-chat")
    endpoint = make_endpoint(url, adapter.default_path, {})
    config = EngineConfig(adapter=adapter, body_options=BodyOptions(model="m"), seed=0)
    records: list[RequestRecord] = []
    t0_box: list[int] = []
    samples: list[tuple[int, float]] = []

    async def sample_cpu() -> None:
        while True:
            samples.append((perf_counter_ns(), time.process_time()))
            await anyio.sleep(SAMPLE_S)

    async def session(engine: Engine) -> None:
        t0_ns = perf_counter_ns() + START_DELAY_NS
        t0_box.append(t0_ns)
        await run_beside(engine, t0_ns, sample_cpu)

    pool = Pool(endpoint, kernel_stamps=kernel_stamps)
    with quiet_gc():  # as `loadgen run` does around its engine
        before = resource.getrusage(resource.RUSAGE_SELF)
        start_ns = perf_counter_ns()
        if profiler is not None:
            profiler.enable()
        try:
            run_engine_harness(plans, pool, config, records.append, session, quiet=False)
        finally:
            if profiler is not None:
                profiler.disable()
    wall_s = (perf_counter_ns() - start_ns) / 1e9
    after = resource.getrusage(resource.RUSAGE_SELF)
    return EngineRun(
        records=sorted(records, key=lambda r: r.request_id),
        t0_ns=t0_box[0],
        cpu_user_s=after.ru_utime - before.ru_utime,
        cpu_sys_s=after.ru_stime - before.ru_stime,
        wall_s=wall_s,
        cpu_samples=samples,
    )


def machine_counters(sim_pid: int) -> dict[str, float]:
    """Contention counters (Linux; NaN where unavailable): the client's involuntary context
    switches, the simulator's CPU s, system-wide CPU pressure stall s and vCPU steal s."""
    counters = {"client_nivcsw": float(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw)}
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{sim_pid}/stat").read_text().rsplit(")", 1)[1].split()
        counters["sim_cpu_s"] = (int(fields[11]) + int(fields[12])) * tick_s
    except (OSError, IndexError, ValueError):
        counters["sim_cpu_s"] = float("nan")
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        counters["cpu_stall_s"] = int(some.rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        counters["cpu_stall_s"] = float("nan")
    try:
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()
        counters["steal_s"] = int(cpu[8]) * tick_s
    except (OSError, IndexError, ValueError):
        counters["steal_s"] = float("nan")
    return counters


def read_trace(path: Path) -> dict[str, dict[str, Any]]:
    """The simulator's request lines, by X-Request-Id."""
    by_id: dict[str, dict[str, Any]] = {}
    with path.open("rb") as lines:
        for line in lines:
            item = json.loads(line)
            if item.get("type") == "request" and item.get("x_request_id"):
                by_id[item["x_request_id"]] = item
    return by_id


def _ms(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64) / 1e6


def analyse(run: EngineRun, trace: dict[str, dict[str, Any]], notes: list[str]) -> dict[str, Any]:
    """Every figure of one repeat; anything odd (mismatches, failures) goes to `notes`."""
    t0 = run.t0_ns
    pairs: list[tuple[int, int]] = []  # (server write, client arrival) of each chunk, absolute
    ttft_err: list[int] = []
    unmatched = count_mismatch = 0
    for record in run.records:
        server = trace.get(record.request_id_sent or f"loadgen-{record.request_id}")
        if server is None:
            unmatched += 1
            continue
        client_ns, server_ns = record.chunk_ns, server["chunk_ns"]
        if len(client_ns) != len(server_ns):
            count_mismatch += 1
        pairs += [(s, t0 + c) for c, s in zip(client_ns, server_ns, strict=False)]
        if record.first_token_ns is not None and server_ns:
            ttft_err.append(t0 + record.first_token_ns - server_ns[0])
    if unmatched:
        notes.append(f"{unmatched} requests have no line in the simulator's trace")
    if count_mismatch:
        notes.append(
            f"{count_mismatch} requests: client and simulator chunk counts differ "
            "(matched on the shorter)"
        )
    outcomes = Counter(r.outcome for r in run.records)
    failures = {str(o): n for o, n in outcomes.items() if o is not Outcome.OK}
    chunks = sum(len(r.chunk_ns) for r in run.records)
    arrivals = [c for r in run.records for c in r.chunk_ns]
    span_s = (max(arrivals) - min(arrivals)) / 1e9 if len(arrivals) > 1 else float("nan")
    lag = _ms([r.dispatched_ns - r.intended_ns for r in run.records if r.dispatched_ns is not None])
    cpu_s = run.cpu_user_s + run.cpu_sys_s
    written = np.asarray([w for w, _ in pairs], dtype=np.int64)
    err = _ms([a - w for w, a in pairs])
    window = steady_window(run)
    steady = err[(written >= window[0]) & (written <= window[1])] if window else err[:0]
    return {
        "chunks": chunks,
        "chunks_per_s": chunks / span_s,
        "failed": sum(failures.values()),
        "failures": failures,
        "cpu_us_per_chunk": cpu_s / max(chunks, 1) * 1e6,
        "cpu_user_us_per_chunk": run.cpu_user_s / max(chunks, 1) * 1e6,
        "cpu_sys_us_per_chunk": run.cpu_sys_s / max(chunks, 1) * 1e6,
        "cpu_utilisation": cpu_s / run.wall_s,
        "steady_cpu_us_per_chunk": steady_cpu_us_per_chunk(run, window),
        "wall_s": run.wall_s,
        "ts_err_min_ms": float(err.min()) if err.size else float("nan"),
        **_percentiles("ts_err", err),
        **_percentiles("steady_ts_err", steady),
        **_percentiles("ttft_err", _ms(ttft_err)),
        "send_lag_p99_ms": float(np.percentile(lag, 99)) if lag.size else float("nan"),
        "send_lag_max_ms": float(lag.max()) if lag.size else float("nan"),
    }


def steady_window(run: EngineRun) -> tuple[int, int] | None:
    """Absolute ns while every stream is open: the last first token → the first last token.

    Leaves out connection setup, the ramp and teardown; None when no such window exists.
    """
    done = [r for r in run.records if r.first_token_ns is not None and r.last_token_ns]
    if not done:
        return None
    start_ns = run.t0_ns + max(r.first_token_ns or 0 for r in done)
    end_ns = run.t0_ns + min(r.last_token_ns or 0 for r in done)
    return (start_ns, end_ns) if start_ns < end_ns else None


def steady_cpu_us_per_chunk(run: EngineRun, window: tuple[int, int] | None) -> float:
    """CPU per chunk between the first and last CPU sample inside the steady window (NaN
    when it holds fewer than two samples)."""
    if window is None:
        return float("nan")
    inside = [(t, cpu) for t, cpu in run.cpu_samples if window[0] <= t <= window[1]]
    if len(inside) < 2:
        return float("nan")
    (a_ns, a_cpu), (b_ns, b_cpu) = inside[0], inside[-1]
    lo, hi = a_ns - run.t0_ns, b_ns - run.t0_ns
    chunks = sum(1 for r in run.records for c in r.chunk_ns if lo < c <= hi)
    return (b_cpu - a_cpu) / max(chunks, 1) * 1e6


def _percentiles(name: str, values: np.ndarray) -> dict[str, float]:
    if not values.size:
        return {f"{name}_{k}_ms": float("nan") for k in ("p50", "p99", "max")}
    p50, p99 = np.percentile(values, [50, 99])
    return {
        f"{name}_p50_ms": float(p50),
        f"{name}_p99_ms": float(p99),
        f"{name}_max_ms": float(values.max()),
    }


def run_once(args: argparse.Namespace, profiler: cProfile.Profile | None) -> dict[str, Any]:
    """One repeat: a fresh simulator, one engine run, the figures and notes."""
    plans = make_plans(args.streams, args.tokens, args.prompt_tokens, args.ramp_s)
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "sim.jsonl"
        with running_sim(sim_args(args.streams, args.gap_ms), trace_file=trace_path) as sim:
            before = machine_counters(sim.pid)
            run = run_engine(plans, sim.url, profiler, STAMPS[args.stamps])
            after = machine_counters(sim.pid)
        trace = read_trace(trace_path)  # complete once the simulator has exited
    notes: list[str] = []
    figures = analyse(run, trace, notes)
    figures["client_nivcsw"] = after["client_nivcsw"] - before["client_nivcsw"]
    figures["sim_cpu_utilisation"] = (after["sim_cpu_s"] - before["sim_cpu_s"]) / run.wall_s
    figures["cpu_stall_ms"] = (after["cpu_stall_s"] - before["cpu_stall_s"]) * 1e3
    figures["steal_ms"] = (after["steal_s"] - before["steal_s"]) * 1e3
    expected = args.streams * args.tokens
    if figures["chunks"] != expected:
        notes.append(f"expected {expected} chunks, received {figures['chunks']}")
    figures["notes"] = notes
    return figures


# -- output -------------------------------------------------------------------------

ROWS = [  # (key, label, format)
    ("chunks", "chunks received", "{:.0f}"),
    ("chunks_per_s", "chunks/s", "{:.0f}"),
    ("failed", "failed requests", "{:.0f}"),
    ("cpu_us_per_chunk", "client CPU/chunk µs", "{:.1f}"),
    ("cpu_user_us_per_chunk", "  of which user µs", "{:.1f}"),
    ("cpu_sys_us_per_chunk", "  of which sys µs", "{:.1f}"),
    ("steady_cpu_us_per_chunk", "steady CPU/chunk µs", "{:.1f}"),
    ("cpu_utilisation", "client CPU s / wall s", "{:.2f}"),
    ("wall_s", "engine run wall s", "{:.2f}"),
    ("ts_err_min_ms", "timestamp err min ms", "{:.3f}"),
    ("ts_err_p50_ms", "timestamp err p50 ms", "{:.3f}"),
    ("ts_err_p99_ms", "timestamp err p99 ms", "{:.3f}"),
    ("ts_err_max_ms", "timestamp err max ms", "{:.3f}"),
    ("steady_ts_err_p50_ms", "  steady-state p50 ms", "{:.3f}"),
    ("steady_ts_err_p99_ms", "  steady-state p99 ms", "{:.3f}"),
    ("steady_ts_err_max_ms", "  steady-state max ms", "{:.3f}"),
    ("ttft_err_p50_ms", "TTFT err p50 ms", "{:.3f}"),
    ("ttft_err_p99_ms", "TTFT err p99 ms", "{:.3f}"),
    ("ttft_err_max_ms", "TTFT err max ms", "{:.3f}"),
    ("send_lag_p99_ms", "send lag p99 ms", "{:.3f}"),
    ("send_lag_max_ms", "send lag max ms", "{:.3f}"),
    ("client_nivcsw", "client involuntary csw", "{:.0f}"),
    ("sim_cpu_utilisation", "sim CPU s / wall s", "{:.2f}"),
    ("cpu_stall_ms", "host CPU-pressure stall ms", "{:.0f}"),
    ("steal_ms", "vCPU steal ms", "{:.0f}"),
]


def print_repeat(index: int, figures: dict[str, Any]) -> None:
    """One line per repeat, then its notes and failures (loudly)."""
    parts = [f"{key}={fmt.format(figures[key])}" for key, _, fmt in ROWS]
    print(f"repeat {index}: " + " ".join(parts), flush=True)
    for note in figures["notes"]:
        print(f"  note: {note}", flush=True)
    if figures["failed"]:
        print(f"  !!! FAILURES by outcome: {figures['failures']} !!!", flush=True)


def print_summary(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    """Median (min–max) of every figure over the repeats, then the bar."""
    print(
        f"\n{args.streams} streams × {args.tokens} tokens, token gap {args.gap_ms:g} ms, "
        f"ramp {args.ramp_s:g} s; median (min–max) of {len(results)} repeats:"
    )
    for key, label, fmt in ROWS:
        values = [r[key] for r in results]
        low, mid, high = (fmt.format(v) for v in (min(values), median(values), max(values)))
        print(f"  {label:>24}: {mid:>10}  ({low}–{high})")
    print("bar (timestamp and TTFT bars are set at 256 streams × 20 ms):")
    checks = [
        ("client CPU/chunk ≤ 40 µs", "cpu_us_per_chunk", BAR_CPU_US_PER_CHUNK),
        ("timestamp err p99 ≤ 5 ms", "ts_err_p99_ms", BAR_TIMESTAMP_P99_MS),
        ("TTFT err p99 ≤ 2 ms", "ttft_err_p99_ms", BAR_TTFT_P99_MS),
        ("no failures", "failed", 0),
    ]
    for label, key, limit in checks:
        worst = max(r[key] for r in results)
        verdict = "meets" if worst <= limit else "MISSES"
        print(f"  {label:>26}: {verdict} (worst repeat {worst:.3f})")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line; --mode fills in whichever of --streams/--gap-ms/--tokens is not given."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        epilog="Example: python benchmarks/client_stream.py --streams 256 --gap-ms 20 "
        "--tokens 100 --repeats 3",
    )
    parser.add_argument(
        "--mode",
        choices=sorted(MODES),
        default="cadence",
        help="defaults: cadence = 256 streams × 20 ms × 100 tokens; "
        "hold = 1,000 streams × 200 ms × 30 tokens",
    )
    parser.add_argument("--streams", type=int, help="concurrent streams")
    parser.add_argument("--gap-ms", type=float, help="token gap = the sim's flat decode step")
    parser.add_argument("--tokens", type=int, help="output tokens per stream")
    parser.add_argument("--prompt-tokens", type=int, default=8, help="prompt size (words)")
    parser.add_argument("--ramp-s", type=float, default=1.0, help="sends spread over this")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--stamps",
        choices=sorted(STAMPS),
        default="auto",
        help="arrival stamps: kernel receive time (SO_TIMESTAMPNS; auto = on Linux over "
        "plain HTTP) or user = perf_counter_ns when the loop reads the socket",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        type=Path,
        help="cProfile the client during the engine runs, write pstats to FILE and print "
        "the top functions (the profiler inflates the CPU and timing figures)",
    )
    args = parser.parse_args(argv)
    streams, gap_ms, tokens = MODES[args.mode]
    args.streams = streams if args.streams is None else args.streams
    args.gap_ms = gap_ms if args.gap_ms is None else args.gap_ms
    args.tokens = tokens if args.tokens is None else args.tokens
    if min(args.streams, args.tokens, args.repeats) < 1 or args.gap_ms <= 0:
        parser.error("--streams, --tokens, --repeats must be ≥ 1 and --gap-ms > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the repeats, print each and the summary; 1 when any request failed."""
    args = parse_args(argv)
    profiler = cProfile.Profile() if args.profile else None
    anyio.run(anyio.sleep, 0, backend_options=backend_options())  # one-time imports, untimed
    results = []
    for index in range(1, args.repeats + 1):
        figures = run_once(args, profiler)
        print_repeat(index, figures)
        results.append(figures)
    print_summary(args, results)
    if profiler is not None:
        profiler.dump_stats(args.profile)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    if any(r["failed"] for r in results):
        print("!!! SOME REQUESTS FAILED: see the failures above !!!", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
