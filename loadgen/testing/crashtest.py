"""Crash test: SIGKILL a `loadgen run` at a chosen moment, recover it, and count what survived.

The promises checked: every request the server finished more than `margin_s` before the
kill is in the recovered records, as `ok`; every planned request has exactly one record;
a request recovered as `cancelled` (sent, unfinished) really reached the server. Records
go to Parquet parts at least once a second (and every 1,000 records), so one second is the
most a kill can take. The server here is a `ScriptedServer` in this process, so its
"finished" stamps and the kill share one clock.
Also the pieces the interrupt tests share (a run of 60 requests of which the first five
finish at once and the rest stream for 4 s; starting it; waiting for a condition; the
process table of a run, to show no helper outlives it).
Used by tests/run/test_interrupt.py, tests/run/test_workers.py and benchmarks/sigkill.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter_ns

import polars as pl

from loadgen.engine.request_ids import plan_number
from loadgen.results.runfolder import PARTS_DIR, RECORDS_FILE
from loadgen.testing import ReceivedRequest, ScriptedServer, Step, simple_chat

SPILL_TICK_S = 0.25  # how often the run checks for a due batch (run/drive.py's spill loop)

INTERRUPT_WORKLOAD = """
name: interrupt
target: {api: openai-chat, model: m}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 20}
    requests: 60
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 20}
    deadlines: {first_token_s: 30, stall_s: 30, total_s: 60}
    slo: {ttft_ms: 1000, percentile: 50}
"""


def slow_after_five(request: ReceivedRequest) -> list[Step]:
    """The first five requests finish at once; the rest stream slowly (20 tokens, 0.2 s apart)."""
    if (plan_number(request.headers.get("x-request-id")) or 0) < 5:
        return simple_chat(20)
    return simple_chat(20, gap_s=0.2)


def start_interrupt_run(tmp_path: Path, url: str, *extra: str) -> subprocess.Popen[bytes]:
    """`loadgen run` of INTERRUPT_WORKLOAD into tmp_path/r, in its own process."""
    workload = tmp_path / "w.yaml"
    workload.write_text(INTERRUPT_WORKLOAD)
    command = [sys.executable, "-m", "loadgen", "run", str(workload), "--url", url, "--out",
               str(tmp_path), "--run-id", "r", "-q", *extra]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(
    process: subprocess.Popen[bytes], condition: Callable[[], bool], timeout_s: float = 60.0
) -> None:
    """Poll until `condition()`; fail with the run's stderr if it ends or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            _, stderr = process.communicate()
            raise AssertionError(f"condition not reached; loadgen said: {stderr.decode()[-2000:]}")
        time.sleep(0.05)


WORKLOAD = """
name: crash
target: {{api: openai-chat, model: m}}
classes:
  chat:
    arrival: {{process: poisson, rate_per_s: {rate}}}
    requests: {requests}
    prompt_tokens: {{dist: fixed, value: 5}}
    output_tokens: {{dist: fixed, value: 10}}
    deadlines: {{first_token_s: 30, stall_s: 30, total_s: 60}}
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class KillResult:
    """What one killed run left behind."""

    kill_after_s: float  # after the first request reached the server
    finished_before: int  # requests the server finished more than margin_s before the kill
    planned: int
    recovered: int  # records in the recovered run (any outcome)
    recovered_ok: int  # of those, ok
    cancelled: int  # recovered as sent but unfinished
    not_sent: int  # recovered as never sent
    missing: tuple[int, ...]  # finished before the margin, yet not recovered as ok
    false_cancelled: tuple[int, ...]  # recovered as cancelled (sent), yet never reached the server
    interrupted: bool  # the recovered summary says so
    exit_code: int  # of `report --recover`
    status: str  # the recovered summary's verdict.status
    margin_s: float  # the margin `finished_before` used (see `kill_and_recover`)
    write_lag_s: float  # measured: longest from a part's newest record's end to the part on disk
    read_lag_s: float  # measured: longest from the server's end of a request to the client's


def varied_stream(request: ReceivedRequest) -> list[Step]:
    """The 10 tokens WORKLOAD forces, 10 to 48 ms apart: requests end at scattered moments
    (0.1 to 0.5 s). (Fewer tokens than forced is a `truncated` stream, not `ok`.)"""
    request_id = plan_number(request.headers.get("x-request-id")) or 0
    return simple_chat(10, gap_s=0.01 + 0.002 * (request_id % 20))


class _PartWatch:
    """Notes when each records part appears on disk (this process's monotonic clock)."""

    def __init__(self, parts_dir: Path) -> None:
        self.seen: dict[str, int] = {}
        self._parts_dir = parts_dir
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.01):
            for part in self._parts_dir.glob("part-*.parquet"):
                self.seen.setdefault(part.name, perf_counter_ns())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _lags(run_dir: Path, watch: _PartWatch, server_end_ns: dict[int, int]) -> tuple[float, float]:
    """(write lag, read lag) in s, measured on the parts a killed run left: per part, its
    appearance minus its newest record's end (the wait for the take plus the write), and
    per ok record, the client's end minus the server's (how late the client read it)."""
    t0_ns = json.loads((run_dir / "run.json").read_text())["t0"]["perf_counter_ns"]
    write_ns = read_ns = 0
    for name, seen_ns in watch.seen.items():
        part = pl.read_parquet(run_dir / PARTS_DIR / name, glob=False)
        ok = part.filter(pl.col("outcome") == "ok")
        if ok.height == 0:
            continue
        write_ns = max(write_ns, seen_ns - (t0_ns + int(ok["end_ns"].max())))  # type: ignore[arg-type]
        for request_id, end_ns in zip(ok["request_id"], ok["end_ns"], strict=True):
            if request_id in server_end_ns:
                read_ns = max(read_ns, t0_ns + end_ns - server_end_ns[request_id])
    return write_ns / 1e9, read_ns / 1e9


def kill_and_recover(
    work_dir: Path,
    kill_after_s: float,
    *,
    margin_s: float = 1.0,
    rate_per_s: float = 20.0,
    requests: int = 400,
    measured_margin: bool = False,
) -> KillResult:
    """Run, SIGKILL `kill_after_s` after the first request arrives, `report --recover`, count.

    With `measured_margin`, a request counts as finished before the kill when it finished
    more than margin_s + SPILL_TICK_S + the run's measured write and read lags before it:
    a record is taken for a part at the first check at least margin_s (the flush interval)
    after the last take, then written, and the client stamps its end only when it reads it.
    On a loaded machine the last two are the machine's; the promise is the rest."""
    workload = work_dir / "crash.yaml"
    workload.write_text(WORKLOAD.format(rate=rate_per_s, requests=requests))
    run_dir = work_dir / "run"
    with ScriptedServer(varied_stream) as server:
        command = [sys.executable, "-m", "loadgen", "run", str(workload), "--url", server.url,
                   "--out", str(work_dir), "--run-id", "run", "-q", "--lag-bound-ms", "1000",
                   "--no-preflight"]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        watch = _PartWatch(run_dir / PARTS_DIR)
        _wait_for_first_request(server, process)
        time.sleep(kill_after_s)
        kill_ns = perf_counter_ns()
        process.kill()
        process.communicate(timeout=60)
        watch.stop()
        server_end_ns = {
            number: end_ns
            for request_id, end_ns in server.finished.items()
            if (number := plan_number(request_id)) is not None
        }
        received = received_ids(server)
    write_lag_s, read_lag_s = _lags(run_dir, watch, server_end_ns)
    if measured_margin:
        margin_s += SPILL_TICK_S + write_lag_s + read_lag_s
    finished = {n for n, end_ns in server_end_ns.items() if end_ns < kill_ns - margin_s * 1e9}
    recovery = subprocess.run(
        [sys.executable, "-m", "loadgen", "report", "--recover", str(run_dir),
         "--out", str(work_dir / "report"), "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if not recovery.stdout.startswith("{"):
        raise AssertionError(f"recovery failed ({recovery.returncode}): {recovery.stderr[-2000:]}")
    summary = json.loads(recovery.stdout)
    records = pl.read_parquet(run_dir / RECORDS_FILE, glob=False)

    def ids(outcome: str) -> set[int]:
        return set(records.filter(pl.col("outcome") == outcome)["request_id"].to_list())

    ok, cancelled = ids("ok"), ids("cancelled")
    return KillResult(
        kill_after_s=kill_after_s,
        finished_before=len(finished),
        planned=requests,
        recovered=records.height,
        recovered_ok=len(ok),
        cancelled=len(cancelled),
        not_sent=len(ids("not_sent")),
        missing=tuple(sorted(finished - ok)),
        false_cancelled=tuple(sorted(cancelled - received)),
        interrupted=bool(summary.get("interrupted")),
        exit_code=recovery.returncode,
        status=str(summary["verdict"].get("status")),
        margin_s=margin_s,
        write_lag_s=write_lag_s,
        read_lag_s=read_lag_s,
    )


def received_ids(server: ScriptedServer) -> set[int]:
    """The request ids of every loadgen request the server received (not the preflight)."""
    return {
        number
        for r in server.requests
        if (number := plan_number(r.headers.get("x-request-id"))) is not None
    }


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (Linux /proc): the simulator, workers, their helpers."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:  # the task ended while we looked
                continue
            todo.extend(int(c) for c in children)
            found.extend(int(c) for c in children)
    return sorted(set(found))


def still_running(pids: list[int]) -> list[str]:
    """Of `pids`, those still running (a zombie waiting to be reaped is not), as
    `pid command` lines: the process table's view."""
    running = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            running.append(f"{pid} {command.strip()}")
    return running


def wait_until_gone(pids: list[int], timeout_s: float = 20.0) -> list[str]:
    """Poll until none of `pids` runs (or `timeout_s` passes); what still runs then."""
    deadline = time.monotonic() + timeout_s
    while (left := still_running(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _wait_for_first_request(server: ScriptedServer, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not server.requests:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            _, stderr = process.communicate()
            raise AssertionError(f"the run sent nothing; it said: {stderr.decode()[-2000:]}")
        time.sleep(0.01)
