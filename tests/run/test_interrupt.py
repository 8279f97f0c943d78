"""Interrupted runs keep their measurements and judge nothing; no helper outlives a run.

Ctrl-C/SIGTERM: exit 130, every plan recorded (not_sent, cancelled), verdict "interrupted";
a second one exits at once, and `report --recover` finishes it, still "interrupted" (130).
SIGKILL: `report --recover` gives every plan a record and the run "incomplete" (exit 5).
The built-in simulator dies with its run, however the run ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import polars as pl
import pytest

from loadgen.results.recover import fill_unrecorded
from loadgen.results.runfolder import read_records
from loadgen.testing import ScriptedServer, head
from loadgen.testing.builders import workload_file
from loadgen.testing.crashtest import (
    INTERRUPT_WORKLOAD,
    descendants,
    kill_and_recover,
    received_ids,
    slow_after_five,
    start_interrupt_run,
    wait_for,
    wait_until_gone,
)
from loadgen.workload.plans import Flow, RequestPlan, Work
from loadgen.workload.spec import Deadlines

LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
VERDICT_WORDS = ("SLO MET", "SLO MISSED", " MET", "MISSED")


def outcome_ids(records: pl.DataFrame, outcome: str) -> set[int]:
    return set(records.filter(pl.col("outcome") == outcome)["request_id"].to_list())


def recover(run_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", "report", "--recover", str(run_dir), "--out",
         str(tmp_path / "rep"), "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_an_interrupt_records_every_plan_and_judges_nothing(tmp_path: Path, sig: int) -> None:
    """One SIGINT or SIGTERM: exit 130; all 60 plans recorded, those never sent as not_sent and
    those sent but unfinished after the grace as cancelled; the summary's verdict is
    "interrupted" (exit 130, slo_met null) and nothing printed says MET or MISSED."""
    with ScriptedServer(slow_after_five) as server:
        process = start_interrupt_run(tmp_path, server.url, "--grace", "0.3")
        wait_for(process, lambda: len(server.requests) >= 15)
        process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=60)
        received = received_ids(server)
    assert process.returncode == 130, stderr.decode()
    run_dir = tmp_path / "r"
    records = pl.read_parquet(run_dir / "records.parquet")
    assert records["request_id"].to_list() == list(range(60))
    ok, cancelled = outcome_ids(records, "ok"), outcome_ids(records, "cancelled")
    assert ok == set(range(5))  # the first five finish at once; the rest stream for 4 s
    assert cancelled == received - ok  # sent and unfinished: exactly what the server got
    assert outcome_ids(records, "not_sent") == set(range(60)) - received
    summary = json.loads((run_dir / "summary.json").read_text())
    # A stopped run has no verdict for the client's time to change: it never falls behind
    # by the generator-health rule, however late a loaded machine sent.
    generator = summary["generator"]
    assert (generator["client"], generator["reason"]) == (None, None)
    assert summary["verdict"] == {"status": "interrupted", "slo_met": None, "fell_behind": False,
                                  "exit_code": 130, "rule": "interval"}, generator  # fmt: skip
    assert summary["classes"]["chat"]["slo"]["met"] is None
    assert summary["generator"]["recorded"] == 60
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["interrupted"], info["stopped"]) == (True, "interrupted")
    assert not (run_dir / "records.parts").exists()
    said = " ".join(stdout.decode().split())
    assert "PARTIAL" in said
    assert "verdict: none" in said
    assert not [w for w in VERDICT_WORDS if w in said], said


def report(run_dir: Path, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`loadgen report RUN_DIR --format json` (with `flags`, e.g. --recover)."""
    return subprocess.run(
        [sys.executable, "-m", "loadgen", "report", *flags, str(run_dir), "--out",
         str(tmp_path / "rep"), "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.slow  # ~6 s on 2 cores: left to .ci/run's second part
def test_second_ctrl_c_exits_at_once_names_the_folder_and_stays_interrupted(
    tmp_path: Path, workers: int
) -> None:
    """Two SIGINTs: exit 130 without waiting the grace; the message names the run folder,
    what it holds and `report --recover`; run.json says interrupted. `report` of the folder
    and `report --recover` then agree: 60 records for 60 plans, the same outcomes, verdict
    interrupted, exit 130, and nothing calls the user's interrupt "killed"."""
    with ScriptedServer(slow_after_five) as server:
        process = start_interrupt_run(tmp_path, server.url, "--grace", "60", "--workers",
                                      str(workers))  # fmt: skip
        wait_for(process, lambda: len(server.requests) >= 15)
        time.sleep(1.5)  # parts are written about once a second
        process.send_signal(signal.SIGINT)
        time.sleep(0.3)
        sent_at = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        waited = time.monotonic() - sent_at
    said = " ".join(stderr.decode().split())
    assert process.returncode == 130, said
    assert waited < 30, "the second interrupt must not wait for the 60 s grace"
    run_dir = tmp_path / "r"
    assert f"second interrupt: exited at once (exit 130). {run_dir} keeps the records" in said
    assert f"`loadgen report --recover {run_dir}` gives every planned request a record" in said
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["finished"], info["stopped"], info["interrupted"]) == (False, "interrupted", True)
    kept = read_records(run_dir)
    assert (kept["outcome"] == "ok").sum() >= 5
    assert kept["request_id"].n_unique() == kept.height
    before = report(run_dir, tmp_path)
    assert not (run_dir / "records.parquet").exists()  # report alone writes no record
    after = report(run_dir, tmp_path, "--recover")
    assert (before.returncode, after.returncode) == (130, 130), before.stderr + after.stderr
    seen = [json.loads(r.stdout) for r in (before, after)]
    for summary in seen:
        assert summary["verdict"]["status"] == "interrupted"
        assert summary["generator"]["recorded"] == summary["generator"]["planned"] == 60
    assert seen[0]["classes"]["chat"]["outcomes"] == seen[1]["classes"]["chat"]["outcomes"]
    assert "marked interrupted (stopped by the user: no verdict, exit 130)" in after.stderr
    assert "killed" not in after.stderr + before.stderr
    records = pl.read_parquet(run_dir / "records.parquet")
    errors = records.filter(pl.col("outcome") != "ok")["error"].to_list()
    assert errors
    assert all(e.startswith("run interrupted (a second Ctrl-C)") for e in errors)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.slow  # ~7 s on 2 cores: left to .ci/run's second part
def test_a_killed_run_is_recovered_with_a_record_per_plan_and_no_verdict(
    tmp_path: Path, workers: int
) -> None:
    """SIGKILL, then `report --recover`: 60 records for 60 plans, whatever the worker count;
    a request recovered as cancelled (sent) really reached the server, one recovered as
    not_sent comes after every cancelled one; exit 5, verdict "incomplete", never MET."""
    with ScriptedServer(slow_after_five) as server:
        process = start_interrupt_run(tmp_path, server.url, "--grace", "60", "--workers",
                                      str(workers))  # fmt: skip
        wait_for(process, lambda: len(server.requests) >= 15)
        time.sleep(1.5)  # parts are written about once a second
        process.kill()
        process.communicate(timeout=60)
        received = received_ids(server)
    run_dir = tmp_path / "r"
    assert not (run_dir / "records.parquet").exists()
    assert (read_records(run_dir)["outcome"] == "ok").sum() >= 5  # finished > 1 s before
    result = recover(run_dir, tmp_path)
    assert result.returncode == 5, result.stderr
    assert "planned 60" in result.stderr
    summary = json.loads(result.stdout)
    assert summary["verdict"]["status"] == "incomplete"
    assert summary["verdict"]["slo_met"] is None
    assert summary["generator"]["recorded"] == summary["generator"]["planned"] == 60
    records = pl.read_parquet(run_dir / "records.parquet")
    assert records["request_id"].to_list() == list(range(60))
    ok, cancelled = outcome_ids(records, "ok"), outcome_ids(records, "cancelled")
    not_sent = outcome_ids(records, "not_sent")
    assert ok | cancelled | not_sent == set(range(60))
    assert ok == set(range(5))
    assert cancelled, "requests sent 1.5 s before the kill are cancelled, not not_sent"
    assert cancelled <= received
    assert min(not_sent) > max(cancelled)  # singles are due in id order
    assert not (run_dir / "records.parts").exists()
    assert json.loads((run_dir / "summary.json").read_text())["verdict"]["exit_code"] == 5
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["recovered"], info["stopped"]) == (True, "incomplete")
    again = recover(run_dir, tmp_path)
    assert again.returncode == 5  # a second --recover changes nothing and judges nothing
    assert "nothing to recover" in again.stderr
    assert pl.read_parquet(run_dir / "records.parquet").equals(records)


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_the_watchdog_stops_a_run_where_nothing_progresses(tmp_path: Path) -> None:
    """A server that goes silent, with deadlines longer than the job's patience: exit 4,
    every plan recorded, and the message says what the run was waiting for."""
    workload = workload_file(tmp_path, INTERRUPT_WORKLOAD.replace("first_token_s: 30, stall_s: 30, total_s: 60",
                                         "first_token_s: 300, stall_s: 300, total_s: 600"))  # fmt: skip
    with ScriptedServer(lambda r: [head(), 60.0]) as server:
        command = [sys.executable, "-m", "loadgen", "run", str(workload), "--url", server.url,
                   "--out", str(tmp_path), "--run-id", "w", "--no-preflight", "--watchdog", "1.5",
                   "--requests", "5"]  # fmt: skip
        started = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
    assert result.returncode == 4, result.stdout + result.stderr
    assert took < 60  # long before the 300 s deadlines
    said = " ".join(result.stdout.split())  # the table wraps long lines
    assert "stopped by the watchdog" in said
    assert "waiting for 5 requests in flight" in said
    assert not [w for w in VERDICT_WORDS if w in said], said
    records = pl.read_parquet(tmp_path / "w" / "records.parquet")
    assert records.height == 5
    assert (records["outcome"] == "cancelled").all()
    summary = json.loads((tmp_path / "w" / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert (summary["verdict"]["status"], summary["verdict"]["exit_code"]) == ("watchdog", 4)


@pytest.mark.slow  # ~18 s on 2 cores: left to .ci/run's second part
def test_sigkill_at_random_moments_loses_nothing_finished_a_second_before(tmp_path: Path) -> None:
    """Three runs killed at random moments: each request the server finished more than the
    flush interval (1 s) before its kill is in the recovered records as ok, every plan has a
    record, nothing recovered as sent missed the server, and the recovered run is incomplete
    (exit 5). "Before" allows what the run itself measured and a loaded machine stretches:
    the spill loop's 0.25 s tick, the longest a part took to reach the disk after its
    newest record, and the longest the client read an end after the server wrote it
    (`kill_and_recover(measured_margin=True)`: a fixed 1 s left no room for the tick or
    the write, which the design itself adds)."""
    seed = time.time_ns() % 1_000_000
    rng = random.Random(seed)
    for run in range(3):
        kill_after_s = rng.uniform(2.0, 5.0)
        work = tmp_path / str(run)
        work.mkdir()
        result = kill_and_recover(work, kill_after_s, measured_margin=True)
        context = f"seed {seed}, run {run}: {result}"
        assert result.finished_before > 0, context
        assert not result.missing, context
        assert not result.false_cancelled, context
        assert result.interrupted, context
        assert result.recovered == result.planned, context
        assert (result.exit_code, result.status) == (5, "incomplete"), context


# --- the recovery rules, on hand-made plans ----------------------------------------------

DEADLINES = Deadlines()
S = 1_000_000_000


def plan(request_id: int, intended_s: float, *, session: int | None = None, turn: int | None = None,
         delay_s: float = 0.0) -> RequestPlan:  # fmt: skip
    return RequestPlan(request_id=request_id, class_name="chat", intended_ns=int(intended_s * S),
                       prompt_tokens=5, output_tokens=5, deadlines=DEADLINES, session_id=session,
                       turn=turn, delay_s=delay_s)  # fmt: skip


def test_recovery_classifies_by_when_each_plan_became_due() -> None:
    """Heartbeat at 10 s. Singles: due by then → cancelled, later → not_sent. A session whose
    turn 0 ended ok at 8 s with 1 s think time: turn 1 due at 9 s → cancelled, so turn 2 (which
    needed turn 1's answer) → not_sent; with turn 0 ending at 9.5 s, turn 1 is due at 10.5 s →
    not_sent. A batch of concurrency 2 with one document done: the next two were running
    (cancelled), the last waited (not_sent)."""
    session = Flow(kind="session", class_name="chat", session_id=3, start_ns=2 * S, plans=(
        plan(3, 2, session=3, turn=0), plan(4, 2, session=3, turn=1, delay_s=1.0),
        plan(5, 2, session=3, turn=2, delay_s=1.0)))  # fmt: skip
    late = Flow(kind="session", class_name="chat", session_id=6, start_ns=3 * S, plans=(
        plan(6, 3, session=6, turn=0), plan(7, 3, session=6, turn=1, delay_s=1.0)))  # fmt: skip
    batch = Flow(kind="batch", class_name="chat", session_id=8, start_ns=1 * S, concurrency=2,
                 plans=tuple(plan(8 + i, 1, session=8, turn=i) for i in range(4)))  # fmt: skip
    work = Work(singles=[plan(0, 1.0), plan(1, 9.99), plan(2, 10.01)], flows=[session, late, batch])
    frame = pl.DataFrame(
        {"request_id": [3, 6, 8], "outcome": ["ok", "ok", "ok"], "end_ns": [8 * S, int(9.5 * S), 5 * S]}
    )  # fmt: skip
    filled = fill_unrecorded(work, frame, {0: 10 * S}, processes=1)
    got = {r.request_id: str(r.outcome) for r in filled}
    assert got == {
        0: "cancelled", 1: "cancelled", 2: "not_sent",
        4: "cancelled", 5: "not_sent", 7: "not_sent",
        9: "cancelled", 10: "cancelled", 11: "not_sent",
    }  # fmt: skip
    assert {r.request_id: r.intended_ns for r in filled}[4] == 9 * S  # when it was due
    two = fill_unrecorded(work, frame, {0: 10 * S, 1: 0}, processes=2)  # worker 1 died at t0
    assert {r.request_id: str(r.outcome) for r in two}[1] == "not_sent"  # worker 1's share


# --- no orphans ----------------------------------------------------------------------------

SIM_WORKLOAD = """
name: orphans
target: {api: openai-chat, model: sim}
sim: {speed: 1}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 10}
    requests: 100
    prompt_tokens: {dist: fixed, value: 20}
    output_tokens: {dist: fixed, value: 200}
    slo: {ttft_ms: 2000, percentile: 50}
"""


def start_sim_run(tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    """`loadgen run` against the built-in simulator (no --url), until its run.json is written."""
    workload = workload_file(tmp_path, SIM_WORKLOAD, "sim.yaml")
    command = [sys.executable, "-m", "loadgen", "run", str(workload), "--out", str(tmp_path),
               "--run-id", "s", "--lag-bound-ms", "1000", *extra]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(process, lambda: (tmp_path / "s" / "run.json").exists())
    time.sleep(1.0)  # requests in flight on the simulator
    return process


def reap(helpers: list[int]) -> list[str]:
    """The helpers still running once they had time to die (killed then, so that a failing
    test leaves no orphans behind either)."""
    left = wait_until_gone(helpers)
    for pid in helpers:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


def helper_commands(pids: list[int]) -> list[str]:
    """Each process's command line."""
    return [Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace") for p in pids]


@LINUX_PROC
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.slow  # ~4 s on 2 cores: left to .ci/run's second part
def test_no_simulator_or_worker_outlives_a_killed_run(tmp_path: Path, workers: int) -> None:
    """SIGKILL of `loadgen run` (1 and 2 workers): the simulator and every worker it started
    are gone from the process table (they die with their parent), and recover finds every plan."""
    process = start_sim_run(tmp_path, "--workers", str(workers))
    helpers = descendants(process.pid)
    commands = helper_commands(helpers)
    assert sum("loadgen.sim" in c for c in commands) == 1
    assert sum("spawn_main" in c for c in commands) == (workers if workers > 1 else 0)
    process.kill()
    process.communicate(timeout=60)
    assert reap(helpers) == []
    result = recover(tmp_path / "s", tmp_path)
    assert result.returncode == 5, result.stderr
    assert json.loads(result.stdout)["generator"]["recorded"] == 100


@LINUX_PROC
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_no_simulator_or_worker_outlives_a_double_ctrl_c(tmp_path: Path, workers: int) -> None:
    """Two SIGINTs (the second exits at once, skipping clean-up): exit 130, and the simulator
    and workers are gone from the process table all the same."""
    process = start_sim_run(tmp_path, "--workers", str(workers), "--grace", "60")
    helpers = descendants(process.pid)
    assert sum("loadgen.sim" in c for c in helper_commands(helpers)) == 1
    process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr.decode()
    assert reap(helpers) == []


def test_a_spill_cancelled_before_its_write_keeps_the_batch(tmp_path: Path) -> None:
    """The run ends (its tasks cancelled) just as a batch was taken for writing: the batch goes
    back to the writer and the final flush writes it, once; an uncancelled spill writes once."""
    from loadgen.results.records import Outcome, RequestRecord
    from loadgen.results.write import RecordWriter
    from loadgen.run.outputs.records import spill

    def batch(first: int) -> list[RequestRecord]:
        return [RequestRecord(request_id=i, class_name="chat", intended_ns=i,
                              outcome=Outcome.CANCELLED) for i in range(first, first + 5)]  # fmt: skip

    writer = RecordWriter(tmp_path)
    failures: list[OSError] = []

    async def spill_both() -> None:
        await spill(writer, batch(0), failures.append)
        with anyio.CancelScope() as scope:
            scope.cancel()  # cancelled before the thread takes the batch
            await spill(writer, batch(5), failures.append)

    anyio.run(spill_both)
    frame = writer.close()
    assert frame["request_id"].to_list() == list(range(10))
    assert failures == []
