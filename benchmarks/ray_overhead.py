"""What `run --ray` adds: seconds before t0 and after the run, and send lag at one shard's load.

On a local three-node Ray cluster (`ray_shards.local_cluster`), alternating, `--repeats`
times: one `loadgen run` process at `--rate` req/s (`--requests`), and `loadgen run --ray
--shards 3` at three times that rate and count (so each shard carries the one process's
load). For each: wall seconds from launching the command to t0 (run.json's t0 against the
launch), wall seconds from the last record's end to the command's exit, and send lag
(sent − intended) p99; for the Ray run also the driver's own `ray.before_t0_s` and
`ray.after_run_s`. A third arm, for send lag only, launches the same three shards by hand
(`run --shard i/3 --start-at T`, three processes on this host against one `loadgen sim`):
the same processes on the same cores without Ray, so the difference is what Ray adds
during the run. Prints every repeat, then medians (min–max).

Usage: python benchmarks/ray_overhead.py --rate 40 --requests 400 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from ray_shards import WORKLOAD, local_cluster


def timed_run(workload: Path, out: Path, run_id: str, *extra: str) -> dict[str, float]:
    """One `loadgen run`: seconds launch → t0, last end → exit, send lag p99 (ms)."""
    launched_ns = time.time_ns()
    ran = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", str(workload), "--out", str(out), "--run-id",
         run_id, "--lag-bound-ms", "1000", "-q", *extra],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    exited_ns = time.time_ns()
    run_dir = out / run_id
    if ran.returncode not in (0, 2, 7):
        raise SystemExit(f"{run_id}: exit {ran.returncode}: {ran.stderr[-1500:]}")
    info = json.loads((run_dir / "run.json").read_text())
    records = pl.read_parquet(run_dir / "records.parquet")
    t0_ns = info["t0"]["unix_ns"]
    last_end_ns = t0_ns + int(records["end_ns"].max())  # type: ignore[arg-type]
    lag = ((records["sent_ns"] - records["intended_ns"]) / 1e6).drop_nulls().to_numpy()
    figures = {
        "launch→t0 s": (t0_ns - launched_ns) / 1e9,
        "end→exit s": (exited_ns - last_end_ns) / 1e9,
        "lag p99 ms": float(np.percentile(lag, 99)),
    }
    if "ray" in info:
        figures["ray before_t0 s"] = info["ray"]["before_t0_s"]
        figures["ray after_run s"] = info["ray"]["after_run_s"]
    return figures


def by_hand(workload: Path, out: Path, run_id: str) -> dict[str, float]:
    """Three shards launched together by hand against one simulator: send lag p99 (ms) of
    their records together."""
    said = out / f"{run_id}-sim.log"
    with said.open("w") as log:
        sim = subprocess.Popen([sys.executable, "-m", "loadgen", "sim", "--port", "0"],
                               stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        while not (urls := [w for w in said.read_text().split() if w.startswith("http://")]):
            if sim.poll() is not None:
                raise SystemExit(f"loadgen sim ended: {said.read_text()[-1500:]}")
            time.sleep(0.1)
        url = urls[0]
        start_at = f"{time.time() + 4:.3f}"  # time for three interpreters to start

        def shard(i: int) -> subprocess.Popen[str]:
            cmd = [sys.executable, "-m", "loadgen", "run", str(workload), "--url", url,
                   "--out", str(out), "--run-id", f"{run_id}-{i}", "--shard", f"{i}/3",
                   "--start-at", start_at, "--lag-bound-ms", "1000", "-q"]  # fmt: skip
            return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)  # fmt: skip

        shards = [shard(i) for i in range(3)]
        for shard in shards:
            _, err = shard.communicate(timeout=900)
            if shard.returncode not in (0, 2, 7):
                raise SystemExit(f"{run_id}: exit {shard.returncode}: {err[-1500:]}")
    finally:
        sim.terminate()
        sim.wait()
    records = pl.concat(
        pl.read_parquet(out / f"{run_id}-{i}" / "records.parquet") for i in range(3)
    )
    lag = ((records["sent_ns"] - records["intended_ns"]) / 1e6).drop_nulls().to_numpy()
    return {"lag p99 ms": float(np.percentile(lag, 99))}


def summary(rows: list[dict[str, float]]) -> str:
    return "  ".join(
        f"{key} {statistics.median(r[key] for r in rows):.3f} "
        f"({min(r[key] for r in rows):.3f}–{max(r[key] for r in rows):.3f})"
        for key in rows[0]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=40.0, help="one shard's req/s")
    parser.add_argument("--requests", type=int, default=400, help="one shard's requests")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, local_cluster() as cluster:
        folder = Path(work)
        one = folder / "one.yaml"
        one.write_text(WORKLOAD.format(rate=args.rate, requests=args.requests))
        three = folder / "three.yaml"
        three.write_text(WORKLOAD.format(rate=3 * args.rate, requests=3 * args.requests))
        plain, sharded, hand = [], [], []
        for repeat in range(args.repeats):
            plain.append(timed_run(one, folder, f"one-{repeat}"))
            sharded.append(timed_run(three, folder, f"ray-{repeat}", "--ray", cluster.address,
                                     "--shards", "3"))  # fmt: skip
            hand.append(by_hand(three, folder, f"hand-{repeat}"))
            print(f"repeat {repeat}: one process {plain[-1]}")
            print(f"repeat {repeat}: --ray 3 shards {sharded[-1]}")
            print(f"repeat {repeat}: 3 shards by hand {hand[-1]}")
        print(f"one process ({args.rate:g} req/s): {summary(plain)}")
        print(f"--ray 3 shards ({args.rate:g} req/s each): {summary(sharded)}")
        print(f"3 shards by hand ({args.rate:g} req/s each): {summary(hand)}")


if __name__ == "__main__":
    main()
