"""Memory and time against hostile input: peak RSS and wall time of each case that once grew
without bound, so the bound each now has can be read before and after its cap.

Each case plays a server of `loadgen.testing.hostile` (in this process) to a `loadgen`
command run as a subprocess; every process of it (the run, its scraper) writes its own peak
RSS (VmHWM) as it exits, through a `sitecustomize` this script puts first on PYTHONPATH (not
`/usr/bin/time`: a spawned child's ru_maxrss starts at its parent's). The figure is the
largest process's peak. A watchdog kills the command once its processes together pass
`--cap-mib` or it runs past `--wall-s` (reported as `killed`, with what it held then: a lower
bound):

* `tiny-events`: one stream of one-character events for `--seconds` (its total deadline).
* `empty-data-lines`: one event of empty `data:` lines that never ends (first-token
  deadline `--seconds`).
* `session-answer`: a chat session whose first answer is `--answer-mb` MB of text, and a
  second turn that carries it.
* `reset-body`: `--cache reset` refused (HTTP 400) with a `--body-mb` MB body.
* `reset-trickle`: `--cache reset` refused with a body trickled one byte a second.
* `scrape-huge`: `--server-metrics-url` scraped every 0.5 s for 3 s from a `/metrics` of
  `--series` series of 8 labels each (~22 MB at 100,000).
* `scrape-trickle`: `/metrics` trickled one byte a second, scraped during a 3 s run.
* `report-windows`: `loadgen report RUN --window 1 --step 1e-9` on a 10 s run.

`--python PATH` runs the commands with another interpreter, e.g. one where the main branch
is installed, for the figures before a change:

    git worktree add /tmp/before main && python3 -m venv /tmp/before/.venv
    /tmp/before/.venv/bin/pip install -e /tmp/before
    python benchmarks/memory_bounds.py --python /tmp/before/.venv/bin/python --cases tiny-events
    python benchmarks/memory_bounds.py --cases tiny-events        # this checkout

Usage (from the repository root; Linux):

    python benchmarks/memory_bounds.py                      # every case, 1 repeat
    python benchmarks/memory_bounds.py --cases reset-body --body-mb 400 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import polars as pl

from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.hostile import (
    empty_data_lines,
    exposition,
    long_answer,
    refusing_reset,
    serving_metrics,
    tiny_events,
)

SINGLE = """
name: {name}
target: {{api: openai-chat, model: m}}
classes:
  chat:
    arrival: {{process: constant, rate_per_s: {rate:g}}}
    requests: {requests}
    prompt_tokens: {{dist: fixed, value: 5}}
    output_tokens: {{dist: fixed, value: 3}}
    slo: {{ttft_ms: 60000, tpot_ms: 60000, percentile: 50}}
    deadlines: {{first_token_s: {first:g}, stall_s: {stall:g}, total_s: {total:g}}}
"""
SESSION = """
name: session
target: {api: openai-chat, model: m}
classes:
  chat:
    kind: chat
    arrival: {process: constant, rate_per_s: 1}
    requests: 1
    turns: {dist: fixed, value: 2}
    think_time_s: {dist: fixed, value: 0}
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 3}
    slo: {ttft_ms: 60000, tpot_ms: 60000, percentile: 50}
    deadlines: {first_token_s: 120, stall_s: 120, total_s: 600}
"""


@dataclass(frozen=True, slots=True)
class Case:
    """A hostile server and the loadgen command it is played to."""

    name: str
    what: str
    server: Callable[[argparse.Namespace], Any]  # the ScriptedServer handler
    command: Callable[[argparse.Namespace, Path, str], list[str]]  # loadgen's arguments


def single(name: str, *, first: float, stall: float, total: float, requests: int = 1,
           rate: float = 1.0) -> str:  # fmt: skip
    return SINGLE.format(name=name, first=first, stall=stall, total=total, requests=requests,
                         rate=rate)  # fmt: skip


def run_args(work: Path, url: str, workload: str, *extra: str) -> list[str]:
    path = work / "w.yaml"
    path.write_text(workload)
    return ["run", str(path), "--url", url, "--out", str(work), "--run-id", "r", "-q",
            "--lag-bound-ms", "60000", "--no-preflight", "--verdict", "point", *extra]  # fmt: skip


def report_args(work: Path, url: str) -> list[str]:
    """A 10 s run made here (by this checkout), then the report the case measures."""
    path = work / "w.yaml"
    path.write_text(single("windows", first=5, stall=5, total=10, requests=10))
    made = subprocess.run([sys.executable, "-m", "loadgen", *run_args(work, url, path.read_text())],
                          capture_output=True, text=True)  # fmt: skip
    if not (work / "r" / "records.parquet").exists():
        raise SystemExit(f"report-windows: the run failed: {made.stderr}")
    return ["report", str(work / "r"), "--out", str(work / "rep"), "--window", "1",
            "--step", "1e-9"]  # fmt: skip


CASES = [
    Case("tiny-events", "one-character events for --seconds",
         lambda a: tiny_events(None),
         lambda a, w, u: run_args(w, u, single("tiny", first=min(a.seconds, 5),
                                               stall=min(a.seconds, 5), total=a.seconds))),
    Case("empty-data-lines", "empty data: lines, never a blank one",
         lambda a: empty_data_lines,
         lambda a, w, u: run_args(w, u, single("empty", first=a.seconds, stall=5, total=600))),
    Case("session-answer", "a session's first answer of --answer-mb MB",
         lambda a: long_answer(a.answer_mb * 1_000_000),
         lambda a, w, u: run_args(w, u, SESSION)),
    Case("reset-body", "--cache reset refused with a --body-mb MB body",
         lambda a: refusing_reset(a.body_mb * 1_000_000),
         lambda a, w, u: run_args(w, u, single("reset", first=5, stall=5, total=10),
                                  "--cache", "reset")),
    Case("reset-trickle", "--cache reset refused, one byte a second",
         lambda a: refusing_reset(1000, trickle_s=1.0),
         lambda a, w, u: run_args(w, u, single("reset", first=5, stall=5, total=10),
                                  "--cache", "reset")),
    Case("scrape-huge", "/metrics of --series series of 8 labels",
         lambda a: serving_metrics(exposition(a.series)),
         lambda a, w, u: run_args(w, u, single("scrape", first=5, stall=5, total=10,
                                               requests=4, rate=1.0),
                                  "--server-metrics-url", "/metrics",
                                  "--server-metrics-interval", "0.5")),
    Case("scrape-trickle", "/metrics one byte a second",
         lambda a: serving_metrics(exposition(10), trickle_s=1.0),
         lambda a, w, u: run_args(w, u, single("scrape", first=5, stall=5, total=10,
                                               requests=4, rate=1.0),
                                  "--server-metrics-url", "/metrics")),
    Case("report-windows", "report --window 1 --step 1e-9 on a 10 s run",
         lambda a: (lambda r: simple_chat(3)),
         lambda a, w, u: report_args(w, u)),
]  # fmt: skip


# Imported by every Python process of the command (first on its PYTHONPATH): its VmHWM to
# $LOADGEN_PEAK_DIR/<pid> at exit, by atexit and, for multiprocessing's children (which
# end with os._exit), by a multiprocessing finalizer.
SITECUSTOMIZE = """
import atexit, os, re
from pathlib import Path
_DIR = os.environ.get("LOADGEN_PEAK_DIR")

def _peak():
    status = Path("/proc/self/status").read_text()
    Path(_DIR, str(os.getpid())).write_text(re.search(r"VmHWM:\\s+(\\d+)", status)[1])

if _DIR:
    atexit.register(_peak)
    import multiprocessing.util
    multiprocessing.util.Finalize(None, _peak, exitpriority=1000)
"""


def tree_rss_kib(pid: int) -> int:
    """Resident KiB of `pid` and every process below it (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        with contextlib.suppress(OSError, ValueError, IndexError):
            status = Path(f"/proc/{current}/status").read_text()
            total += int(status.split("VmRSS:")[1].split()[0])
        for children in Path(f"/proc/{current}").glob("task/*/children"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(c) for c in children.read_text().split())
    return total


def measure(args: Sequence[str], python: str, cap_mib: int, wall_s: float,
            out: Path) -> dict[str, Any]:  # fmt: skip
    """`loadgen ARGS`, killed past `cap_mib` (all its processes) or `wall_s`: its exit code,
    wall time, peak RSS (its largest process's) and the watchdog's verdict."""
    peaks = out / "peaks"
    peaks.mkdir()
    (out / "site").mkdir()
    (out / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": str(out / "site"), "LOADGEN_PEAK_DIR": str(peaks)}
    command = [python, "-m", "loadgen", *args]
    with (out / "stdout.txt").open("wb") as std, (out / "stderr.txt").open("wb") as err:
        started = time.perf_counter()
        # In `out`: `-m` puts the working directory first on sys.path, where a checkout's
        # own loadgen/ would shadow the interpreter's.
        process = subprocess.Popen(command, stdout=std, stderr=err, cwd=out, env=env,
                                   start_new_session=True)  # fmt: skip
        killed, seen_kib = "", 0
        while process.poll() is None:
            seen_kib = max(seen_kib, tree_rss_kib(process.pid))
            elapsed = time.perf_counter() - started
            if seen_kib > cap_mib * 1024 or elapsed > wall_s:
                killed = f"killed at {seen_kib / 1024:.0f} MiB, {elapsed:.0f} s"
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                break
            time.sleep(0.05)
        wall = time.perf_counter() - started
    written = [int(p.read_text()) for p in peaks.iterdir() if p.read_text().strip()]
    peak_kib = max(written) if written and not killed else seen_kib
    return {"exit": process.returncode, "wall_s": wall, "rss_mib": peak_kib / 1024,
            "killed": killed}  # fmt: skip


def records_line(work: Path) -> str:
    """What the run recorded: outcomes, and what the stamp cap left."""
    path = work / "r" / "records.parquet"
    if not path.exists():
        return "no records"
    frame = pl.read_parquet(path)
    outcomes = frame["outcome"].value_counts(sort=True).rows()
    text = ", ".join(f"{n} {o}" for o, n in outcomes)
    chunks = frame["chunk_ns"].list.len().max()
    if "unstamped_chunks" in frame.columns and frame["unstamped_chunks"].max():
        text += f"; {chunks:,} stamps kept, {frame['unstamped_chunks'].max():,} unstamped"
    elif chunks:
        text += f"; {chunks:,} stamps"
    if (work / "r" / "server_metrics.parquet").exists():
        text += f"; {pl.read_parquet(work / 'r' / 'server_metrics.parquet').height:,} metric rows"
    return text


@contextlib.contextmanager
def served(case: Case, args: argparse.Namespace) -> Iterator[str]:
    with ScriptedServer(case.server(args)) as server:
        yield server.url


def one(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work_dir, served(case, args) as url:
        work = Path(work_dir)
        figures = measure(case.command(args, work, url), args.python, args.cap_mib, args.wall_s,
                          work)  # fmt: skip
        figures["records"] = records_line(work)
        lines = (work / "stderr.txt").read_text(errors="replace").strip().splitlines()
        figures["said"] = next((line for line in lines if "error" in line.lower()), "")[:240]
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Example: python benchmarks/memory_bounds.py "
                                            "--cases tiny-events,reset-body")  # fmt: skip
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter that runs loadgen (default: this one)",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="tiny-events, empty-data-lines")
    parser.add_argument("--answer-mb", type=int, default=200, help="session-answer")
    parser.add_argument("--body-mb", type=int, default=200, help="reset-body")
    parser.add_argument("--series", type=int, default=100_000, help="scrape-huge")
    parser.add_argument("--cap-mib", type=int, default=3072, help="kill the command past this")
    parser.add_argument("--wall-s", type=float, default=120.0, help="kill the command past this")
    args = parser.parse_args(argv)
    wanted = set(args.cases.split(",")) if args.cases else {c.name for c in CASES}
    where = subprocess.run([args.python, "-c", "import loadgen; print(loadgen.__file__)"],
                           capture_output=True, text=True, cwd="/").stdout.strip()  # fmt: skip
    print(f"loadgen from {where}; median (min–max) of {args.repeats} repeats; cap "
          f"{args.cap_mib} MiB, {args.wall_s:g} s; load average "
          f"{os.getloadavg()[0]:.2f}\n")  # fmt: skip
    header = ("case", "peak RSS MiB", "wall s", "exit", "records", "said")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for case in (c for c in CASES if c.name in wanted):
        runs = [one(case, args) for _ in range(args.repeats)]
        rss, wall = [r["rss_mib"] for r in runs], [r["wall_s"] for r in runs]
        killed = "; ".join(sorted({r["killed"] for r in runs if r["killed"]}))
        print(" | ".join([
            f"{case.name} ({case.what})",
            f"{median(rss):.0f} ({min(rss):.0f}–{max(rss):.0f})" + (f" {killed}" if killed else ""),
            f"{median(wall):.1f} ({min(wall):.1f}–{max(wall):.1f})",
            " ".join(sorted({str(r["exit"]) for r in runs})),
            runs[-1]["records"], runs[-1]["said"] or "-",
        ]), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
