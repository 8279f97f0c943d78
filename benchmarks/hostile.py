"""Hostile servers: what `loadgen run` makes of each, with its peak memory and wall time.

For each case of `loadgen.testing.hostile` (and a healthy server, the steady-state reference):
a scripted server in this process plays the case to every request; `loadgen run` runs as
a subprocess (so its peak RSS is its own: its VmHWM, which it writes as it exits) with
`--no-preflight`, `--requests` requests at 20 req/s and the suite's short deadlines
(first token 1 s, stall 0.5 s, total 2 s); then again with the preflight on
(`--preflight-timeout 1`), whose exit code, wall time and peak RSS are reported too. Each case is
repeated `--repeats` times; the table shows the median and (min–max) of each figure.

Usage (from the repository root):

    python benchmarks/hostile.py                   # every case, 3 repeats, 20 requests
    python benchmarks/hostile.py --repeats 5 --cases line-100mb,headers-20mb
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import polars as pl

from loadgen.testing import ReceivedRequest, ScriptedServer, Step, simple_chat
from loadgen.testing.hostile import CASES, DEADLINES

WORKLOAD = """
name: hostile
target: {{api: openai-chat, model: m}}
classes:
  chat:
    arrival: {{process: constant, rate_per_s: 20}}
    requests: {requests}
    prompt_tokens: {{dist: fixed, value: 5}}
    output_tokens: {{dist: fixed, value: 3}}
    slo: {{ttft_ms: 2000, tpot_ms: 1000, percentile: 90}}
    deadlines: {{first_token_s: {first:g}, stall_s: {stall:g}, total_s: {total:g}}}
"""


# `python -m loadgen`, writing its own peak RSS (VmHWM) to argv[1] as it exits. Not the
# child's ru_maxrss: Linux starts that at the forking parent's RSS (this process, with the
# server's buffers and polars loaded), which would hide the child's own figure.
LAUNCH = """
import atexit, re, runpy, sys
from pathlib import Path
out = Path(sys.argv.pop(1))
def peak():
    out.write_text(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text())[1])
atexit.register(peak)
sys.argv[0] = "loadgen"
runpy.run_module("loadgen", run_name="__main__")
"""


def loadgen(args: Sequence[str], out: Path) -> dict[str, Any]:
    """Run `python -m loadgen ARGS`; its exit code, wall time and peak RSS (MiB)."""
    peak = out / "peak_kib.txt"
    with (out / "stderr.txt").open("wb") as err, (out / "stdout.txt").open("wb") as std:
        started = time.perf_counter()
        code = subprocess.call([sys.executable, "-c", LAUNCH, str(peak), *args],
                               stdout=std, stderr=err)  # fmt: skip
        wall_s = time.perf_counter() - started
    return {"exit": code, "wall_s": wall_s, "rss_mib": int(peak.read_text()) / 1024}


Script = Callable[[ReceivedRequest], Iterable[Step]]


def one_case(script: Script, requests: int) -> dict[str, Any]:
    """One repeat of one case: the run without the preflight, then the preflight alone."""
    with tempfile.TemporaryDirectory() as work_dir, ScriptedServer(script) as server:
        work = Path(work_dir)
        workload = work / "hostile.yaml"
        deadlines = {"first": DEADLINES.first_token_s, "stall": DEADLINES.stall_s,
                     "total": DEADLINES.total_s}  # fmt: skip
        workload.write_text(WORKLOAD.format(requests=requests, **deadlines))
        common = ["run", str(workload), "--url", server.url, "--out", str(work), "-q",
                  "--lag-bound-ms", "1000"]  # fmt: skip
        run = loadgen([*common, "--run-id", "run", "--no-preflight"], work)
        frame = pl.read_parquet(work / "run" / "records.parquet")
        planned = json.loads((work / "run" / "run.json").read_text())["planned"]
        outcomes = Counter(frame["outcome"].to_list())
        pre = loadgen([*common, "--run-id", "pre", "--preflight-timeout", "1"], work)
        pre_error = (work / "stderr.txt").read_text().strip().splitlines()
    return {
        **run,
        "outcomes": ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())),
        "recorded": frame.height,
        "planned": planned,
        "pre_exit": pre["exit"],
        "pre_wall_s": pre["wall_s"],
        "pre_rss_mib": pre["rss_mib"],
        "pre_error": next((line for line in pre_error if line.startswith("error:")), ""),
    }


def spread(values: list[float], fmt: str) -> str:
    """`median (min–max)`."""
    return f"{median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20, help="planned requests per run")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    args = parser.parse_args(argv)
    healthy = ("healthy", "a well-behaved stream", lambda r: simple_chat(3))
    cases = [healthy, *((c.name, c.what, c.script) for c in CASES)]
    if args.cases:
        wanted = set(args.cases.split(","))
        cases = [c for c in cases if c[0] in wanted]
    print(f"{args.requests} requests per run at 20 req/s; deadlines first token "
          f"{DEADLINES.first_token_s:g} s, stall {DEADLINES.stall_s:g} s, total "
          f"{DEADLINES.total_s:g} s; median (min–max) of {args.repeats} repeats; "
          f"load average {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    header = ("case", "outcome (records)", "recorded/planned", "peak RSS MiB", "wall s",
              "with preflight: exit", "wall s", "peak RSS MiB")  # fmt: skip
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    errors = {}
    for name, what, script in cases:
        repeats = [one_case(script, args.requests) for _ in range(args.repeats)]
        last = repeats[-1]
        counts = {f"{r['recorded']}/{r['planned']}" for r in repeats}
        outcomes = {r["outcomes"] for r in repeats}
        print(" | ".join([
            f"{name} ({what})", " / ".join(sorted(outcomes)), " ".join(sorted(counts)),
            spread([r["rss_mib"] for r in repeats], ".0f"),
            spread([r["wall_s"] for r in repeats], ".1f"),
            " ".join(sorted({str(r["pre_exit"]) for r in repeats})),
            spread([r["pre_wall_s"] for r in repeats], ".1f"),
            spread([r["pre_rss_mib"] for r in repeats], ".0f"),
        ]), flush=True)  # fmt: skip
        errors[name] = last["pre_error"]
    print("\npreflight errors (last repeat):")
    for name, error in errors.items():
        print(f"  {name}: {error or '(passed)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
