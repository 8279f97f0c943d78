"""The plan memory estimate against what a run really holds: `check`'s and `run`'s peak RSS.

`loadgen check` and `loadgen run` refuse a plan whose estimated client memory exceeds
`--max-memory-gb` (default: half of the host's). The estimate (`loadgen.workload.plans.
estimate_memory`) is requests × (PLAN_BYTES + RECORD_BYTES + TOKEN_BYTES × output tokens).
This script measures, for each `--requests` size:

* `check`: peak RSS of `loadgen check` (the plans alone) minus the RSS of `check` on a
  one-request plan (the interpreter and imports), against requests × PLAN_BYTES;
* `run`: peak RSS of `loadgen run --url` against a `loadgen sim` of its own (so the
  simulator's memory is not counted), minus the one-request baseline, against the whole
  estimate. A run's peak is reached at its end, when the joined records are audited.

Each figure is the median of `--repeats` runs with min–max. The estimate should be above
the measured peak (it is a cap: an underestimate lets a plan through that the host cannot
hold) and not far above it (an overestimate refuses plans the host could hold).

Usage: python benchmarks/plan_memory.py [--requests 2000,10000,30000] [--tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from loadgen.run.processes.simulator import running_sim
from loadgen.workload.inputs import size_text
from loadgen.workload.plans import PLAN_BYTES, estimate_memory
from loadgen.workload.spec import loads

WORKLOAD = """
name: plan-memory
classes:
  chat:
    arrival: {{process: constant, rate_per_s: {rate}}}
    requests: {requests}
    prompt_tokens: {{dist: fixed, value: 16}}
    output_tokens: {{dist: fixed, value: {tokens}}}
    deadlines: {{first_token_s: 60, stall_s: 30, total_s: 120}}
"""


def peak_rss_bytes(command: list[str]) -> int:
    """The peak RSS of one command, from wait4's rusage (Linux reports KiB)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 2, 3):
        raise SystemExit(f"{' '.join(command)} exited with {status}")
    return usage.ru_maxrss * 1024


def median_text(values: list[int]) -> str:
    return (f"{size_text(int(statistics.median(values)))} "
            f"({size_text(min(values))}–{size_text(max(values))})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="2000,10000,30000")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(n) for n in args.requests.split(",")]
    loadgen = [sys.executable, "-m", "loadgen"]
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_sim(["--speed", "20", "--max-batch", "1024", "--decode-step-ms", "20"]) as sim,
    ):
        folder = Path(tmp)

        def workload(requests: int) -> Path:
            path = folder / f"w{requests}.yaml"
            text = WORKLOAD.format(rate=args.rate, requests=requests, tokens=args.tokens)
            path.write_text(text)
            return path

        def check_peak(requests: int) -> int:
            return peak_rss_bytes([*loadgen, "check", str(workload(requests))])

        def run_peak(requests: int, repeat: int) -> int:
            run_id = f"r{requests}-{repeat}"
            return peak_rss_bytes([*loadgen, "run", str(workload(requests)), "--url", sim.url,
                                   "--out", str(folder / "runs"), "--run-id", run_id, "-q",
                                   "--lag-bound-ms", "1000", "--no-preflight"])  # fmt: skip

        check_base = [check_peak(1) for _ in range(args.repeats)]
        run_base = [run_peak(1, r) for r in range(args.repeats)]
        print(f"baseline (1 request): check {median_text(check_base)}, run {median_text(run_base)}")
        print(f"{'requests':>9}  {'check: plans':>26}  {'estimate':>10}  "
              f"{'run: whole':>26}  {'estimate':>10}")  # fmt: skip
        for requests in sizes:
            spec = loads(WORKLOAD.format(rate=args.rate, requests=requests, tokens=args.tokens))
            estimate = estimate_memory(spec)
            checks = [check_peak(requests) - int(statistics.median(check_base))
                      for _ in range(args.repeats)]  # fmt: skip
            runs = [run_peak(requests, r) - int(statistics.median(run_base))
                    for r in range(args.repeats)]  # fmt: skip
            print(f"{requests:>9,}  {median_text(checks):>26}  "
                  f"{size_text(requests * PLAN_BYTES):>10}  {median_text(runs):>26}  "
                  f"{size_text(estimate.bytes):>10}")  # fmt: skip
    load1, _, _ = os.getloadavg()
    own = size_text(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(f"load average at the end: {load1:.2f} on {os.cpu_count()} cores; "
          f"this script's own peak RSS {own}")  # fmt: skip


if __name__ == "__main__":
    main()
