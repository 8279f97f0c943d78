"""Soak: a long `loadgen run` at moderate load; does its memory or its file count grow?

Starts `loadgen sim` (its own process), then `loadgen run` against it for `--minutes`
(default 30) of Poisson chat traffic at a rate one simulated replica serves without a
growing queue (5 req/s by default: at 20 req/s its prefill alone is ~75 % busy and the
number of streams in flight, and of open connections, grows all run long), and samples
the run's resident memory (VmRSS) and open file descriptors from /proc every `--every-s`
seconds. Prints the curve, then the
growth after warm-up (the first `--warmup` share of the run): memory growth should stay
within 10 % and the file count should not grow.

Usage: python benchmarks/soak.py --minutes 30 --rate 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from loadgen.run.processes.simulator import running_sim

WORKLOAD = """
name: soak
target: {{api: openai-chat, model: sim}}
classes:
  chat:
    arrival: {{process: poisson, rate_per_s: {rate}}}
    duration_s: {duration}
    prompt_tokens: {{dist: lognormal, mean: 300, cv: 0.5, min: 16, max: 2000}}
    output_tokens: {{dist: lognormal, mean: 60, cv: 0.5, min: 8, max: 300}}
    slo: {{ttft_ms: 1000, tpot_ms: 50, percentile: 99}}
    deadlines: {{first_token_s: 30, stall_s: 10, total_s: 120}}
"""


def sample(pid: int) -> tuple[float, int] | None:
    """(RSS in MiB, open file descriptors) of a live process, else None."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024, fds
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=5.0, help="requests per second")
    parser.add_argument("--every-s", type=float, default=10.0, help="sampling interval")
    parser.add_argument("--warmup", type=float, default=0.2, help="share of the run excluded")
    args = parser.parse_args()
    duration = args.minutes * 60
    folder = Path(tempfile.mkdtemp(prefix="loadgen-soak-"))
    workload = folder / "soak.yaml"
    workload.write_text(WORKLOAD.format(rate=args.rate, duration=duration))
    samples: list[tuple[float, float, int]] = []
    with running_sim(["--max-batch", "256", "--chunk-tokens", "512"]) as sim:
        command = [sys.executable, "-m", "loadgen", "run", str(workload), "--url", sim.url,
                   "--out", str(folder), "--run-id", "soak", "-q"]  # fmt: skip
        started = time.monotonic()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        print(f"{'t (s)':>8} {'RSS (MiB)':>10} {'fds':>6}")
        while process.poll() is None:
            point = sample(process.pid)
            if point is not None:
                elapsed = time.monotonic() - started
                samples.append((elapsed, *point))
                print(f"{elapsed:8.0f} {point[0]:10.1f} {point[1]:6d}", flush=True)
            time.sleep(args.every_s)
        output = process.communicate()[0].decode(errors="replace")
    print(output[-1500:])
    steady = [s for s in samples if s[0] >= args.warmup * duration and s[0] <= duration]
    if len(steady) < 2:
        print("too few samples after warm-up to judge growth")
        return
    first, last = steady[0], steady[-1]
    rss_growth = (last[1] - first[1]) / first[1]
    print(f"after warm-up ({first[0]:.0f} s → {last[0]:.0f} s): RSS {first[1]:.1f} → "
          f"{last[1]:.1f} MiB ({rss_growth:+.1%}); fds {first[2]} → {last[2]} "
          f"(max {max(s[2] for s in steady)})")  # fmt: skip
    print(
        f"memory growth within 10 %: {'yes' if rss_growth <= 0.10 else 'NO'}; "
        f"fd growth: {'none' if last[2] <= first[2] else last[2] - first[2]}"
    )
    # Kept-alive connections stay open for reuse, so the fd count follows the highest number
    # of requests in flight so far; growth after the last new peak would be a leak.
    peak, peak_s = peak_in_flight(folder / "soak" / "records.parquet")
    after = [s for s in samples if s[0] >= peak_s + 2 * args.every_s and s[0] <= duration]
    print(f"peak in flight: {peak} requests at {peak_s:.0f} s of the run", end="")
    if len(after) >= 2:
        start_fds, end_fds = after[0][2], after[-1][2]
        growth = "none" if end_fds <= start_fds else end_fds - start_fds
        print(f"; fds after it: {start_fds} → {end_fds} (max {max(s[2] for s in after)}), "
              f"growth {growth}")  # fmt: skip
    else:
        print()


def peak_in_flight(records_path: Path) -> tuple[int, float]:
    """The most requests in flight at once (sent to end), and when (seconds from t0)."""
    records = pl.read_parquet(records_path, columns=["sent_ns", "end_ns"]).drop_nulls()
    events = sorted([(t, 1) for t in records["sent_ns"]] + [(t, -1) for t in records["end_ns"]])
    peak, peak_ns, in_flight = 0, 0, 0
    for t_ns, step in events:
        in_flight += step
        if in_flight > peak:
            peak, peak_ns = in_flight, t_ns
    return peak, peak_ns / 1e9


if __name__ == "__main__":
    main()
