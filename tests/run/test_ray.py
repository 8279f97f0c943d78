"""`run --ray`: shards placed, started, collected and merged by a real local Ray cluster of
three nodes (`ray.cluster_utils.Cluster`: a raylet per node, on loopback), against the
built-in simulator started once by the driver. Faults are made for real: a shard process
SIGKILLed, a node removed, the driver interrupted."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from loadgen.testing.builders import workload_file
from loadgen.workload.plans import plan_work
from loadgen.workload.shards import Share, share_ids
from loadgen.workload.spec import load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

NODES = 3
SHORT = """
name: ray
target: {api: openai-chat, model: sim}
cache: warm
classes:
  chat:
    arrival: {process: poisson, rate_per_s: 40}
    requests: %d
    prompt_tokens: {dist: uniform, min: 20, max: 200}
    output_tokens: {dist: fixed, value: 10}
    slo: {ttft_ms: 2000, tpot_ms: 200, percentile: 80}
sim: {speed: 2}
"""
LONG = SHORT % 900  # ~22 s of arrivals: time to hurt it mid-run
SHARD_PROCESS = "loadgen.run.scale.raycluster.shard"
# A run that ran to its end: met, missed, inconclusive, or (on a host others load too) the
# generator fell behind; what these tests check is placement, records and faults, not that.
VERDICTS = (0, 2, 3, 7)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Three Ray nodes of two logical CPUs each, on loopback (the node address is forced to
    127.0.0.1: Ray would otherwise advertise this host's interface address). Ray gives a
    raylet 30 s to start, fixed; on a host others load that can pass, so a cluster that did
    not come up is shut down and started again (three tries)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's switch to loopback-only
    from ray.cluster_utils import Cluster  # defers ray (a slow import, and the [ray] extra)

    for attempt in range(3):
        made = None
        try:
            made = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
            for _ in range(NODES - 1):
                made.add_node(num_cpus=2)
            made.wait_for_nodes()
            break
        except Exception:  # Ray's own: "The current node timed out during startup"
            if made is not None:
                made.shutdown()
            if attempt == 2:
                raise
    yield made
    made.shutdown()


def driver(cluster: Any, workload: Path, out: Path, run_id: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "loadgen", "run", str(workload), "--ray", cluster.address,
            "--out", str(out), "--run-id", run_id, "--lag-bound-ms", "1000", *extra]  # fmt: skip


def shard_processes() -> list[int]:
    """pids of shard processes still alive on any node (all nodes are this host)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if SHARD_PROCESS.encode() in cmdline:
                found.append(int(entry.name))
    return found


def no_shard_left(wait_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + wait_s
    while (left := shard_processes()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def wait_for(process: subprocess.Popen[str], what: str, log: Path, timeout_s: float = 90) -> None:
    """Until the driver's stderr (in `log`) says `what`."""
    deadline = time.monotonic() + timeout_s
    while what not in log.read_text():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)


def shard_pid(index: int) -> int:
    """The pid of shard `index`'s process (its options file is in `loadgen-shard-<i>-*`)."""
    for pid in shard_processes():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        if f"loadgen-shard-{index}-" in cmdline:
            return pid
    raise AssertionError(f"no process of shard {index}")


def outcomes(run_dir: Path) -> dict[str, int]:
    frame = pl.read_parquet(run_dir / "records.parquet")
    return dict(frame.group_by("outcome").len().iter_rows())


def assert_only_shard_unfinished(run_dir: Path, workload: Path, index: int) -> None:
    """One record per plan; shard `index`'s plans include some never sent (not_sent or
    cancelled), and every other shard's were all sent."""
    records = pl.read_parquet(run_dir / "records.parquet")
    work = plan_work(load(workload))
    assert records.height == len(work.plans)
    unfinished = {"not_sent", "cancelled"}
    for shard in range(3):
        ids = share_ids(work, Share(shard, 3))
        mine = records.filter(pl.col("request_id").is_in(ids))
        assert mine.height == len(ids)
        left = mine.filter(pl.col("outcome").is_in(list(unfinished))).height
        assert (left > 0) == (shard == index), (shard, left)


@pytest.fixture(scope="module")
def merged(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A 150-request run as three shards, and the same workload in one process."""
    tmp = tmp_path_factory.mktemp("ray")
    workload = workload_file(tmp, SHORT % 150)
    ran = subprocess.run(driver(cluster, workload, tmp, "merged", "--shards", "3"),
                         capture_output=True, text=True, timeout=200)  # fmt: skip
    assert ran.returncode in VERDICTS, ran.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "loadgen", "run", str(workload), "--out",
                          str(tmp), "--run-id", "one", "-q", "--lag-bound-ms", "1000"],
                         capture_output=True, text=True, timeout=200)  # fmt: skip
    assert one.returncode in VERDICTS, one.stderr[-3000:]
    return tmp / "merged", tmp / "one", ran.stderr


def test_three_shards_are_placed_one_per_node_and_merge_to_the_plan(
    merged: tuple[Path, Path, str],
) -> None:
    """STRICT_SPREAD puts each shard on its own node; the merged records are the plan's."""
    run_dir, one_dir, said = merged
    info = json.loads((run_dir / "run.json").read_text())
    ray = info["ray"]
    assert ray["strategy"] == "STRICT_SPREAD"
    assert len({s["node_id"] for s in ray["shards"]}) == NODES
    assert [s["outcome"] for s in ray["shards"]] == ["ok"] * 3
    assert len(re.findall(r"shard \d/3 → node", said)) == 3
    records = pl.read_parquet(run_dir / "records.parquet")
    whole = pl.read_parquet(one_dir / "records.parquet")
    assert info["planned"] == records.height == whole.height == 150
    columns = ["request_id", "class", "prompt_tokens_target", "max_tokens"]
    assert records.select(columns).equals(whole.select(columns))
    assert set(outcomes(run_dir)).isdisjoint({"not_sent", "cancelled"})  # every plan was sent
    assert sorted(p.name for p in (run_dir / "shards").iterdir()) == ["0", "1", "2"]


def test_each_shard_keeps_its_nodes_clock_offset_and_merge_rebases_by_it(
    merged: tuple[Path, Path, str],
) -> None:
    """Per shard: the offset measured before T is in its own run.json and in the merged
    table, and the merged intended times are the plan's moved by (anchor − offset − T)."""
    run_dir, _, _ = merged
    info = json.loads((run_dir / "run.json").read_text())
    table = info["shards"]
    spec_path = run_dir.parent / "w.yaml"
    work = plan_work(load(spec_path))
    for row, placed in zip(table["shards"], info["ray"]["shards"], strict=True):
        shard = json.loads((run_dir / "shards" / str(row["index"]) / "run.json").read_text())
        offset_ns = shard["shard"]["clock_offset_ns"]
        assert row["clock_offset_ms"] == placed["clock_offset_ms"] == round(offset_ns / 1e6, 6)
        assert abs(offset_ns) < 10e6  # one host: its nodes share one clock
        shift = shard["t0"]["measured_unix_ns"] - offset_ns - table["start_at_unix_ns"]
        ids = share_ids(work, Share(row["index"], 3))
        mine = pl.read_parquet(run_dir / "records.parquet").filter(pl.col("request_id").is_in(ids))
        planned = {p.request_id: p.intended_ns for p in work.plans}
        assert all(
            got - planned[rid] == shift
            for rid, got in mine.select("request_id", "intended_ns").iter_rows()
        )
    assert info["ray"]["before_t0_s"] > 0
    assert info["ray"]["after_run_s"] >= 0


def test_no_process_is_left_on_any_node_after_a_run(merged: tuple[Path, Path, str]) -> None:
    """Every shard process has ended once the driver has."""
    assert no_shard_left() == []


def test_a_shard_process_killed_mid_run_is_recovered_named_and_exits_5(
    cluster: Any, tmp_path: Path
) -> None:
    """SIGKILL to shard 1's process: its records up to the kill kept, the rest cancelled or
    not_sent; the other shards complete; one record per plan; exit 5."""
    workload = workload_file(tmp_path, LONG)
    log = tmp_path / "driver.log"
    with log.open("w") as err:
        process = subprocess.Popen(driver(cluster, workload, tmp_path, "killed", "--shards", "3"),
                                   stdout=subprocess.DEVNULL, stderr=err, text=True)  # fmt: skip
        wait_for(process, "agreed start", log)
        time.sleep(6)
        os.kill(shard_pid(1), signal.SIGKILL)
        assert process.wait(timeout=200) == 5, log.read_text()[-3000:]
    assert "shard 1 killed" in log.read_text()
    run_dir = tmp_path / "killed"
    assert_only_shard_unfinished(run_dir, workload, 1)
    ray = json.loads((run_dir / "run.json").read_text())["ray"]
    assert [s["outcome"] for s in ray["shards"]] == ["ok", "killed", "ok"]
    assert no_shard_left() == []


def test_ctrl_c_on_the_driver_stops_every_shard_and_exits_130(cluster: Any, tmp_path: Path) -> None:
    """SIGINT to the driver mid-run: every shard stops as Ctrl-C stops a run, records kept
    (the unsent ones not_sent), one merged folder, exit 130, no process left."""
    workload = workload_file(tmp_path, LONG)
    log = tmp_path / "driver.log"
    with log.open("w") as err:
        process = subprocess.Popen(driver(cluster, workload, tmp_path, "stopped", "--shards", "3"),
                                   stdout=subprocess.DEVNULL, stderr=err, text=True)  # fmt: skip
        wait_for(process, "agreed start", log)
        time.sleep(5)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=200) == 130, log.read_text()[-3000:]
    run_dir = tmp_path / "stopped"
    counts = outcomes(run_dir)
    assert sum(counts.values()) == 900
    assert counts["ok"] > 0
    assert counts.get("not_sent", 0) > 0
    info = json.loads((run_dir / "run.json").read_text())
    assert info["stopped"] == "interrupted"
    assert [s["outcome"] for s in info["ray"]["shards"]] == ["interrupted"] * 3
    assert no_shard_left() == []


def test_a_clock_skew_above_the_bound_refuses_the_run_before_any_traffic(
    cluster: Any, tmp_path: Path
) -> None:
    """--max-clock-skew-ms 0: any measured offset is too much; exit 1, no run folder."""
    workload = workload_file(tmp_path, SHORT % 30)
    ran = subprocess.run(driver(cluster, workload, tmp_path, "skewed", "--max-clock-skew-ms", "0"),
                         capture_output=True, text=True, timeout=200)  # fmt: skip
    assert ran.returncode == 1, ran.stderr[-3000:]
    assert "refused before any traffic: node clocks too far apart" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert not (tmp_path / "skewed").exists()
    assert no_shard_left() == []


def test_a_shard_that_cannot_get_ready_refuses_the_run_with_its_reason(
    cluster: Any, tmp_path: Path
) -> None:
    """A target no shard can reach (a closed port): each shard's preflight fails before it is
    ready; the driver refuses the run before any traffic with their reasons; exit 1."""
    workload = workload_file(tmp_path, SHORT % 30)
    ran = subprocess.run(driver(cluster, workload, tmp_path, "unready", "--url", "http://127.0.0.1:9"),
                         capture_output=True, text=True, timeout=200)  # fmt: skip
    assert ran.returncode == 1, ran.stderr[-3000:]
    assert (
        "refused before any traffic: shard 0 not ready: its process ended with exit 1" in ran.stderr
    )
    assert "Traceback" not in ran.stderr
    assert not (tmp_path / "unready").exists()
    assert no_shard_left() == []


def test_ray_without_an_address_starts_a_local_ray_for_the_run_and_stops_it(
    tmp_path: Path,
) -> None:
    """`--ray` alone: a one-node Ray of its own started by the driver (not the module's
    cluster, which runs on this host too), on loopback though the test's environment does
    not ask for it (the driver does), two shards SPREAD on it, merged; no shard left; and
    nothing in the home folder (Ray wrote ~/.ray/auth_token, which every later `ray start`
    enforced), the run saying where Ray's own state went."""
    workload = workload_file(tmp_path, SHORT % 40)
    env = {k: v for k, v in os.environ.items()
           if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" and not k.startswith("RAY_AUTH")}  # fmt: skip
    env["RAY_ADDRESS"] = ""
    home = tmp_path / "home"
    home.mkdir()
    env["HOME"] = str(home)
    ran = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", str(workload), "--ray", "--shards", "2", "--out",
         str(tmp_path), "--run-id", "local", "--lag-bound-ms", "1000"],
        capture_output=True, text=True, timeout=200, env=env,
    )  # fmt: skip
    assert ran.returncode in VERDICTS, ran.stderr[-3000:]
    assert "started a local Ray for this run" in ran.stderr
    assert list(home.rglob("*")) == []
    session = re.search(r"its logs and state in (\S+),", ran.stderr)
    assert session is not None
    assert Path(session.group(1)).is_dir()
    info = json.loads((tmp_path / "local" / "run.json").read_text())
    assert info["ray"]["started_local"] is True
    assert info["ray"]["strategy"] == "SPREAD"
    assert {shard["node_ip"] for shard in info["ray"]["shards"]} == {"127.0.0.1"}
    assert sum(outcomes(tmp_path / "local").values()) == 40
    assert no_shard_left() == []


def test_more_shards_than_nodes_are_spread_and_said(cluster: Any, tmp_path: Path) -> None:
    """--shards 4 on 3 nodes: SPREAD, with a warning that says so; the run still merges."""
    workload = workload_file(tmp_path, SHORT % 40)
    ran = subprocess.run(driver(cluster, workload, tmp_path, "spread", "--shards", "4"),
                         capture_output=True, text=True, timeout=200)  # fmt: skip
    assert ran.returncode in VERDICTS, ran.stderr[-3000:]
    assert "placed with SPREAD" in ran.stderr
    info = json.loads((tmp_path / "spread" / "run.json").read_text())
    assert info["ray"]["strategy"] == "SPREAD"
    assert len(info["ray"]["shards"]) == 4
    assert sum(outcomes(tmp_path / "spread").values()) == 40


def test_capacity_with_ray_runs_each_step_as_a_sharded_run(cluster: Any, tmp_path: Path) -> None:
    """`capacity --ray`: its one step is a merged run of three shards placed by Ray."""
    workload = workload_file(tmp_path, SHORT % 100)
    ran = subprocess.run(
        [sys.executable, "-m", "loadgen", "capacity", str(workload), "--ray", cluster.address,
         "--shards", "3", "--steps", "1x", "--out", str(tmp_path / "cap"), "--lag-bound-ms",
         "1000", "--max-extend", "1"],
        capture_output=True, text=True, timeout=250,
    )  # fmt: skip
    # 3 too: on a busy host the step can fall behind (its verdict is then INVALID, still a step)
    assert ran.returncode in (0, 2, 3, 7), ran.stderr[-3000:] + ran.stdout[-2000:]
    steps = [p for p in (tmp_path / "cap" / "steps").iterdir() if (p / "run.json").exists()]
    assert len(steps) == 1
    info = json.loads((steps[0] / "run.json").read_text())
    assert len(info["ray"]["shards"]) == 3
    assert info["planned"] == pl.read_parquet(steps[0] / "records.parquet").height
    assert (tmp_path / "cap" / "capacity.json").exists()
    assert no_shard_left() == []


def test_a_node_lost_mid_run_is_named_its_plans_marked_and_the_run_exits_5(
    cluster: Any, tmp_path: Path
) -> None:
    """A node (not the head) removed outright mid-run: its shard is reported lost by name,
    its plans recorded cancelled/not_sent, the others' records kept, exit 5. Last in the
    module: the cluster has a node fewer after it (one is added back)."""
    workload = workload_file(tmp_path, LONG)
    log = tmp_path / "driver.log"
    with log.open("w") as err:
        process = subprocess.Popen(driver(cluster, workload, tmp_path, "lost", "--shards", "3"),
                                   stdout=subprocess.DEVNULL, stderr=err, text=True)  # fmt: skip
        wait_for(process, "agreed start", log)
        time.sleep(5)
        victim = cluster.list_all_nodes()[-1]
        cluster.remove_node(victim, allow_graceful=False)
        assert process.wait(timeout=200) == 5, log.read_text()[-3000:]
    said = log.read_text()
    run_dir = tmp_path / "lost"
    info = json.loads((run_dir / "run.json").read_text())
    lost = [s for s in info["ray"]["shards"] if s["outcome"] == "lost"]
    assert len(lost) == 1
    assert lost[0]["node_id"] == victim.node_id
    assert f"shard {lost[0]['index']} lost" in said
    assert_only_shard_unfinished(run_dir, workload, lost[0]["index"])
    assert no_shard_left() == []
    cluster.add_node(num_cpus=2)
