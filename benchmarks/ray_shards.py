"""`run --ray` on a local three-node Ray cluster against the same workload in one process.

Starts `ray.cluster_utils.Cluster` (three nodes on loopback, two logical CPUs each), runs
the workload once as one `loadgen run` process and once as `loadgen run --ray ADDRESS
--shards 3` (each against the built-in simulator the driver starts), and prints the
placement (shard → node), each node's measured clock offset, the merged records against
the plan, and TTFT, ITL and send lag (sent − intended) p50/p90/p99 side by side.

With `--fault`, the sharded run is hurt `--after` seconds past its agreed start instead:
`kill` SIGKILLs shard 1's process, `node` removes the last node outright, `interrupt` sends
SIGINT to the driver (Ctrl-C). It then prints the driver's exit code, each shard's outcome
and its records by outcome, and the shard processes left on any node (all are this host).

Usage: python benchmarks/ray_shards.py --rate 60 --requests 900
       python benchmarks/ray_shards.py --rate 40 --requests 900 --fault node
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

WORKLOAD = """
name: ray-bench
target: {{api: openai-chat, model: sim}}
cache: warm
classes:
  chat:
    arrival: {{process: poisson, rate_per_s: {rate}}}
    requests: {requests}
    prompt_tokens: {{dist: uniform, min: 20, max: 200}}
    output_tokens: {{dist: fixed, value: 20}}
    slo: {{ttft_ms: 2000, tpot_ms: 200, percentile: 90}}
"""


@contextmanager
def local_cluster(nodes: int = 3) -> Iterator[Any]:
    """A Ray cluster of `nodes` raylets on this host, on loopback."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's switch to loopback-only
    from ray.cluster_utils import Cluster  # defers ray (a slow import)

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


def loadgen_run(workload: Path, out: Path, run_id: str, *extra: str) -> tuple[int, str]:
    """`loadgen run` in a subprocess: its exit code and stderr."""
    ran = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", str(workload), "--out", str(out), "--run-id",
         run_id, "--lag-bound-ms", "1000", *extra],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return ran.returncode, ran.stderr


def figures(run_dir: Path) -> dict[str, np.ndarray]:
    """TTFT (from the intended send), every inter-token gap, send lag: ms, of ok records."""
    ok = pl.read_parquet(run_dir / "records.parquet").filter(pl.col("outcome") == "ok")
    gaps = ok.select(pl.col("chunk_ns").list.diff(null_behavior="drop")).explode("chunk_ns")
    return {
        "TTFT": ((ok["first_token_ns"] - ok["intended_ns"]) / 1e6).to_numpy(),
        "ITL": (gaps["chunk_ns"].drop_nulls() / 1e6).to_numpy(),
        "send lag": ((ok["sent_ns"] - ok["intended_ns"]) / 1e6).to_numpy(),
    }


def side_by_side(one: Path, merged: Path) -> None:
    a, b = figures(one), figures(merged)
    print(f"{'metric (ms)':<12} {'one process p50/p90/p99':>28} {'--ray 3 shards p50/p90/p99':>30}")
    for name in a:
        cells = ["/".join(f"{np.percentile(f[name], q):.2f}" for q in (50, 90, 99)) for f in (a, b)]
        print(f"{name:<12} {cells[0]:>28} {cells[1]:>30}")


def placement(merged: Path) -> dict[str, Any]:
    info = json.loads((merged / "run.json").read_text())
    ray = info["ray"]
    before, after = ray["before_t0_s"], ray["after_run_s"]
    print(f"strategy {ray['strategy']} on {ray['nodes_alive']} alive nodes; "
          f"{before:.2f} s before t0, {after:.2f} s after the run")  # fmt: skip
    for s in ray["shards"]:
        print(f"  shard {s['index']} → node {s['node_ip']} {s['node_id'][:12]} · clock offset "
              f"{s['clock_offset_ms']:+.3f} ms (round trip {s['clock_rtt_ms']:.3f} ms) · "
              f"{s['outcome']}")  # fmt: skip
    records = pl.read_parquet(merged / "records.parquet")
    counts = dict(records.group_by("outcome").len().iter_rows())
    print(f"merged records {records.height} = planned {info['planned']}: {counts}; "
          f"shard skew spread {info['shards']['spread_ms']:.3f} ms")  # fmt: skip
    return info


SHARD_PROCESS = (
    "loadgen.run.scale.raycluster.shard"  # a shard process's module, on its command line
)


def shard_processes() -> list[tuple[int, str]]:
    """(pid, command line) of every shard process alive on this host."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, UnicodeDecodeError):
                continue
            if SHARD_PROCESS in cmdline:
                found.append((int(entry.name), cmdline))
    return found


def hurt(cluster: Any, workload: Path, out: Path, fault: str, after_s: float) -> None:
    """The sharded run with one fault `after_s` past its agreed start, and what it left."""
    from loadgen.workload.plans import plan_work
    from loadgen.workload.shards import Share, share_ids
    from loadgen.workload.spec import load

    log = out / "driver.log"
    with log.open("w") as err:
        driver = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "run", str(workload), "--ray", cluster.address,
             "--shards", "3", "--out", str(out), "--run-id", "hurt", "--lag-bound-ms", "1000"],
            stdout=subprocess.DEVNULL, stderr=err, text=True,
        )  # fmt: skip
        while "agreed start" not in log.read_text():
            if driver.poll() is not None:
                raise SystemExit(f"the driver ended before the start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        time.sleep(after_s)
        if fault == "kill":
            pid = next(p for p, line in shard_processes() if "loadgen-shard-1-" in line)
            os.kill(pid, signal.SIGKILL)
        elif fault == "node":
            cluster.remove_node(cluster.list_all_nodes()[-1], allow_graceful=False)
        else:
            driver.send_signal(signal.SIGINT)
        code = driver.wait(timeout=600)
    said = [line for line in log.read_text().splitlines() if line.startswith("shard ")]
    print(f"--fault {fault} after {after_s:g} s: exit {code}")
    for line in said:
        print(f"  driver said: {line.strip()}")
    info = json.loads((out / "hurt" / "run.json").read_text())
    records = pl.read_parquet(out / "hurt" / "records.parquet")
    work = plan_work(load(workload))
    counts = dict(records.group_by("outcome").len().iter_rows())
    print(f"merged records {records.height} of {len(work.plans)} planned: {counts}")
    for shard in info["ray"]["shards"]:
        ids = share_ids(work, Share(shard["index"], 3))
        mine = records.filter(pl.col("request_id").is_in(ids))
        print(f"  shard {shard['index']} ({shard['outcome']}): "
              f"{dict(sorted(mine.group_by('outcome').len().iter_rows()))}")  # fmt: skip
    time.sleep(2)  # a lost node's shard process ends itself within a second
    print(f"shard processes left on any node: {[pid for pid, _ in shard_processes()]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=60.0, help="the run's req/s (all shards)")
    parser.add_argument("--requests", type=int, default=900)
    parser.add_argument("--fault", choices=("kill", "node", "interrupt"), default=None,
                        help="hurt the sharded run instead of comparing it")  # fmt: skip
    parser.add_argument("--after", type=float, default=6.0, help="seconds past the start")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, local_cluster() as cluster:
        folder = Path(work)
        workload = folder / "w.yaml"
        workload.write_text(WORKLOAD.format(rate=args.rate, requests=args.requests))
        if args.fault is not None:
            hurt(cluster, workload, folder, args.fault, args.after)
            return
        code_one, said = loadgen_run(workload, folder, "one", "-q")
        print(f"one process: exit {code_one}" + ("" if code_one == 0 else f": {said[-800:]}"))
        code, said = loadgen_run(workload, folder, "ray", "--ray", cluster.address,
                                 "--shards", "3", "-q")  # fmt: skip
        print(f"--ray --shards 3: exit {code}" + ("" if code == 0 else f": {said[-800:]}"))
        placement(folder / "ray")
        side_by_side(folder / "one", folder / "ray")


if __name__ == "__main__":
    main()
