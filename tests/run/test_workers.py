"""`run --workers N`: one schedule from N processes, one folder, nothing lost or changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.analysis.minutes import build_histograms, load_histograms
from loadgen.cli import cli
from loadgen.results.runfolder import read_records
from loadgen.run.host import choose_workers
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import workload_file
from loadgen.testing.crashtest import received_ids, slow_after_five, start_interrupt_run, wait_for
from loadgen.workload.plans import plan_run, plan_work
from loadgen.workload.shards import Share, split_work
from loadgen.workload.spec import load

WORKLOAD = """
name: workers
target: {api: openai-chat, model: m}
classes:
  single:
    arrival: {process: poisson, rate_per_s: 40}
    requests: 40
    prompt_tokens: {dist: uniform, min: 5, max: 20}
    output_tokens: {dist: uniform, min: 2, max: 6}
  chat:
    arrival: {process: poisson, rate_per_s: 10}
    requests: 6
    turns: {dist: uniform, min: 1, max: 3}
    think_time_s: {dist: fixed, value: 0.05}
    prompt_tokens: {dist: fixed, value: 8}
    output_tokens: {dist: fixed, value: 3}
  agent:
    kind: agent
    arrival: {process: constant, rate_per_s: 5}
    requests: 3
    hops: {dist: fixed, value: 3}
    tool_time_s: {dist: fixed, value: 0.02}
    prompt_tokens: {dist: fixed, value: 8}
    output_tokens: {dist: fixed, value: 3}
  docs:
    kind: summarization
    arrival: {process: constant, rate_per_s: 1, start_s: 0.2}
    requests: 4
    concurrency: 2
    prompt_tokens: {dist: fixed, value: 30}
    output_tokens: {dist: fixed, value: 3}
"""
PLAN_COLUMNS = ["request_id", "class", "max_tokens", "session_id", "turn"]


def write_workload(tmp_path: Path, text: str = WORKLOAD) -> Path:
    return workload_file(tmp_path, text)


def run_cli(tmp_path: Path, url: str, run_id: str, *extra: str) -> tuple[int, str, Path]:
    """`loadgen run` in-process; (exit code, output, run folder)."""
    args = ["run", str(write_workload(tmp_path)), "--url", url, "--out", str(tmp_path),
            "--run-id", run_id, "-q", "--lag-bound-ms", "1000", "--seed", "3",
            "--verdict", "point",  # 3 trajectories bound no share: the plans are under test
            *extra]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output, tmp_path / run_id


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same workload and seed, run by one process and by two."""
    tmp_path = tmp_path_factory.mktemp("workers")
    # A server that honours the forced length: as many tokens as the body's max_tokens.
    with ScriptedServer(lambda r: simple_chat(r.body["max_tokens"])) as server:
        code_one, said_one, one = run_cli(tmp_path, server.url, "one")
        code_two, said_two, two = run_cli(tmp_path, server.url, "two", "--workers", "2")
    assert code_one == 0, said_one
    assert code_two == 0, said_two
    return one, two


def test_the_shares_of_two_workers_are_exactly_the_single_process_plan(tmp_path: Path) -> None:
    """Split in two, the plans (ids, times, classes, token counts) are those of one process,
    and every session, trajectory and batch stays whole in one share."""
    spec = load(write_workload(tmp_path))
    work = plan_work(spec, 3)
    shares = [split_work(work, Share(i, 2)) for i in range(2)]
    union = sorted((p for s in shares for p in s.plans), key=lambda p: p.request_id)
    assert union == plan_run(spec, 3)
    assert all(s.plans for s in shares)
    for flow in work.flows:
        assert sum(flow in s.flows for s in shares) == 1
    starts = sorted([p.request_id for p in work.singles] + [f.session_id for f in work.flows])
    firsts = {p.request_id for p in shares[0].singles} | {f.session_id for f in shares[0].flows}
    assert firsts == set(starts[0::2])  # every other start, in start order


def test_two_workers_record_the_same_plan_as_one_process(two_runs: tuple[Path, Path]) -> None:
    """ids, classes, token counts, sessions and scheduled intended times match a 1-process run."""
    one, two = (pl.read_parquet(r / "records.parquet") for r in two_runs)
    assert one.select(PLAN_COLUMNS).equals(two.select(PLAN_COLUMNS))
    scheduled = pl.col("turn").fill_null(0) == 0
    singles = pl.col("session_id").is_null()
    assert one.filter(singles)["intended_ns"].equals(two.filter(singles)["intended_ns"])
    firsts = scheduled & pl.col("session_id").is_not_null() & (pl.col("class") != "docs")
    assert one.filter(firsts)["intended_ns"].equals(two.filter(firsts)["intended_ns"])


def test_planned_equals_recorded_across_workers_with_chained_flows(
    two_runs: tuple[Path, Path],
) -> None:
    """Every planned request of every worker, turns and hops included, is one record, all ok."""
    _, two = two_runs
    records = pl.read_parquet(two / "records.parquet")
    spec = load(two.parent / "w.yaml")
    assert records["request_id"].to_list() == [p.request_id for p in plan_run(spec, 3)]
    assert (records["outcome"] == "ok").all()
    summary = json.loads((two / "summary.json").read_text())
    assert summary["generator"]["planned"] == summary["generator"]["recorded"] == records.height
    info = json.loads((two / "run.json").read_text())
    processes = info["workers"]["processes"]
    assert info["workers"]["count"] == 2
    assert sum(p["records"] for p in processes) == records.height
    assert len({p["pid"] for p in processes}) == 2
    assert not (two / "records.parts").exists()
    # A later turn was sent after the previous one ended: the flow ran in one process.
    turns = records.filter(pl.col("class") == "chat").sort("session_id", "turn")
    for _, session in turns.group_by("session_id"):
        ends, sends = session["end_ns"].to_list(), session["sent_ns"].to_list()
        assert all(sent > end for end, sent in zip(ends, sends[1:], strict=False))


def test_merged_histograms_equal_the_histograms_of_the_merged_records(
    two_runs: tuple[Path, Path],
) -> None:
    """histograms.parquet of a 2-worker run is what its joined records give."""
    _, two = two_runs
    info = json.loads((two / "run.json").read_text())
    stored = load_histograms(two)
    assert stored is not None
    again = build_histograms(read_records(two), t0_unix_ns=info["t0"]["unix_ns"], slos=None)
    assert stored.select("class", "requests", "ok", "ttft", "itl").equals(
        again.select("class", "requests", "ok", "ttft", "itl")
    )


def test_default_workers_follow_the_calibrated_envelope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No calibration: one process; a peak past the envelope: one per core; within it: one."""
    from loadgen.run.envelope import host_name, save_calibration

    monkeypatch.setenv("LOADGEN_CALIBRATION", str(tmp_path / "cal.json"))
    spec = load(write_workload(tmp_path))
    work = plan_work(spec, 3)
    assert choose_workers(spec, work, None)[0] == 1
    assert choose_workers(spec, work, 3) == (3, "--workers 3")
    result = {"host": host_name(), "processes": 1, "measured_at": "2026-11-29T00:00:00Z"}
    save_calibration({**result, "envelope": {"streams": 1, "chunks_per_s": 10.0}})
    count, why = choose_workers(spec, work, None)
    assert count == min(os.cpu_count() or 1, 50)  # one per core, at most the plan's 50 starts
    assert "one per core" in why
    save_calibration({**result, "envelope": {"streams": 10_000, "chunks_per_s": 1e6}})
    assert choose_workers(spec, work, None)[0] == 1


def start_run(tmp_path: Path, url: str, *extra: str) -> subprocess.Popen[bytes]:
    return start_interrupt_run(tmp_path, url, "--workers", "2", *extra)


@pytest.mark.slow  # ~5 s on 2 cores: left to .ci/run's second part
def test_ctrl_c_of_a_two_worker_run_records_every_plan(tmp_path: Path) -> None:
    """SIGINT to the parent: both workers stop, cancel after the grace, all 60 recorded (never
    sent: not_sent; sent and unfinished: cancelled, exactly what the server got), exit 130,
    verdict "interrupted"."""
    with ScriptedServer(slow_after_five) as server:
        process = start_run(tmp_path, server.url, "--grace", "0.3")
        wait_for(process, lambda: len(server.requests) >= 15)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        received = received_ids(server)
    assert process.returncode == 130, stderr.decode()
    run_dir = tmp_path / "r"
    records = pl.read_parquet(run_dir / "records.parquet")
    assert records["request_id"].to_list() == list(range(60))
    by_outcome = {
        o: set(records.filter(pl.col("outcome") == o)["request_id"].to_list())
        for o in ("ok", "cancelled", "not_sent")
    }
    assert by_outcome["ok"] == set(range(5))
    assert by_outcome["cancelled"] == received - by_outcome["ok"]
    assert by_outcome["not_sent"] == set(range(60)) - received
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["interrupted"], summary["generator"]["recorded"]) == (True, 60)
    assert (summary["verdict"]["status"], summary["verdict"]["exit_code"]) == ("interrupted", 130)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["interrupted"] is True
    assert [p["records"] for p in info["workers"]["processes"]] == [30, 30]


def worker_pids(parent_pid: int) -> list[int]:
    """The spawned workers among a process's children (Linux /proc)."""
    children = Path(f"/proc/{parent_pid}/task/{parent_pid}/children").read_text().split()
    return [
        int(pid)
        for pid in children
        if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    ]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
@pytest.mark.slow  # ~7 s on 2 cores: left to .ci/run's second part
def test_a_dead_worker_loses_nothing_of_the_other_and_invalidates_the_run(tmp_path: Path) -> None:
    """SIGKILL to one worker: the other's 30 records are ok, the dead one's unrecorded plans
    are client_error records (planned == recorded), and the run exits 3."""
    with ScriptedServer(lambda r: simple_chat(20, gap_s=0.05)) as server:
        process = start_run(tmp_path, server.url)
        wait_for(process, lambda: len(server.requests) >= 10)
        os.kill(worker_pids(process.pid)[0], signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 3, stderr.decode()
    records = pl.read_parquet(tmp_path / "r" / "records.parquet")
    assert records["request_id"].to_list() == list(range(60))
    processes = json.loads((tmp_path / "r" / "run.json").read_text())["workers"]["processes"]
    dead = next(p for p in processes if p["exit_code"] == -signal.SIGKILL)
    alive = next(p for p in processes if p["exit_code"] == 0)
    work = plan_work(load(tmp_path / "w.yaml"))
    by_id = records.select("request_id", "outcome")
    for info, expected in ((alive, {"ok"}), (dead, {"ok", "client_error"})):
        ids = [p.request_id for p in split_work(work, Share(info["index"], 2)).plans]
        outcomes = set(by_id.filter(pl.col("request_id").is_in(ids))["outcome"])
        assert outcomes <= expected
    assert (records["outcome"] == "client_error").sum() >= 1
    assert "recorded as client_error" in stderr.decode()


def test_workers_beyond_the_plans_starts_are_capped_with_a_warning(tmp_path: Path) -> None:
    """40 singles + 6 sessions + 3 trajectories + 1 batch = 50 starts: --workers 64 is 50
    workers (14 would get nothing to send), and the run says so."""
    from loadgen.run.host import workers_warnings

    spec = load(write_workload(tmp_path))
    work = plan_work(spec, 3)
    assert len(work.singles) + len(work.flows) == 50
    count, why = choose_workers(spec, work, 64)
    assert (count, why) == (50, "--workers 64, capped at the plan's 50 starts")
    said = workers_warnings(work, 64, count)
    assert said[0].startswith("--workers 64 capped at 50: the plan has 50 starts")
    assert choose_workers(spec, work, 50) == (50, "--workers 50")  # at the count: not capped


def test_more_workers_than_cores_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from loadgen.run import host

    work = plan_work(load(write_workload(tmp_path)), 3)
    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    said = host.workers_warnings(work, 8, 8)
    assert said == [
        "8 workers on 2 cores: the processes share the cores, so their start-up queues and "
        "their sends lag (a late send makes the run invalid, exit 3); use --workers 2 or "
        "fewer here"
    ]
    assert host.workers_warnings(work, 2, 2) == []  # one per core: nothing to say
    assert host.workers_warnings(work, None, 8) == []  # chosen by loadgen, not asked


def test_a_run_with_more_workers_than_requests_warns_even_when_quiet(tmp_path: Path) -> None:
    """--workers 4 for a plan of one request: one process runs it (no spawned workers),
    the warning is on stderr under -q, and run.json says why."""
    text = WORKLOAD.split("  chat:")[0].replace("requests: 40", "requests: 1")
    path = workload_file(tmp_path, text)
    result = CliRunner().invoke(cli, ["run", str(path), "--out", str(tmp_path / "o"),
                                      "--run-id", "r", "--workers", "4", "-q",
                                      "--lag-bound-ms", "1000"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "warning: --workers 4 capped at 1: the plan has 1 start " in result.stderr
    info = json.loads((tmp_path / "o" / "r" / "run.json").read_text())
    assert info["workers"]["count"] == 1
    assert info["workers"]["chosen"] == "--workers 4, capped at the plan's 1 start"
