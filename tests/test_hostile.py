"""Hostile servers: every misbehaviour ends as a classified outcome, one record per planned
request, with bounded memory and time, in the run and in the preflight."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from time import monotonic, perf_counter, sleep

import polars as pl
import pytest
from click.testing import CliRunner, Result

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.cli import cli
from loadgen.engine.preflight import preflight
from loadgen.engine.transport import make_endpoint
from loadgen.errors import RunBusy, TargetError
from loadgen.results.liveness import LOCK_FILE, live_writer, run_lock
from loadgen.results.records import HEARTBEAT, PARTS_DIR, Outcome
from loadgen.testing import ScriptedServer, chat_chunk, simple_chat, stream_steps
from loadgen.testing.builders import chat_workload, workload_file
from loadgen.testing.hostile import CASES, DEADLINES, HostileCase

REQUESTS = 3
DEADLINE_FLOW = (f"{{first_token_s: {DEADLINES.first_token_s:g}, stall_s: {DEADLINES.stall_s:g}, "
                 f"total_s: {DEADLINES.total_s:g}}}")  # fmt: skip
WORKLOAD = chat_workload("hostile", rate_per_s=20, requests=REQUESTS, deadlines=DEADLINE_FLOW)
# A run of 3 requests 50 ms apart, each ended by its 2 s total deadline at the latest, plus
# the run's own work (writing records and summary): far under this on any machine, and
# far over it for a client that waits on the server (one byte a second is minutes; the
# heartbeats never end).
RUN_BOUND_S = DEADLINES.total_s + 20.0
PREFLIGHT_S = 1.0
PREFLIGHT_BOUND_S = PREFLIGHT_S + 10.0
# Peak RSS over a warm healthy run: the caps hold a few MiB per stream (1 MiB event, one
# 256 KiB read). Buffering the 100 MiB line (or 20 MiB of headers) would pass this 4 times
# over, however the machine is loaded.
RSS_BOUND_MIB = 48


def peak_rss_growth_mib(action: Callable[[], object]) -> float | None:
    """MiB the process's peak RSS rose above its RSS before `action` (None off Linux)."""
    status = Path("/proc/self/status")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: reset the peak to now
    except OSError:
        return None

    def kib(field: str) -> int:
        return int(re.search(rf"{field}:\s+(\d+) kB", status.read_text()).group(1))  # type: ignore[union-attr]

    before = kib("VmRSS")
    action()
    return (kib("VmHWM") - before) / 1024


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's workload, after one healthy run has warmed the process up (imports,
    allocator pools), so RSS growth measures the case, not the first run."""
    path = workload_file(tmp_path_factory.mktemp("hostile"), WORKLOAD, "hostile.yaml")
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        out = path.parent / "warm"
        result = invoke(path, server.url, out)
    assert result.exit_code == 0, result.output
    return path


def invoke(path: Path, url: str, out: Path, *extra: str) -> Result:
    return CliRunner().invoke(
        cli, ["run", str(path), "--url", url, "--out", str(out), "--run-id", "r", "-q",
              "--lag-bound-ms", "1000", "--no-preflight", *extra],
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_hostile_server_gives_classified_records_in_bounded_memory_and_time(
    case: HostileCase, workload: Path, tmp_path: Path
) -> None:
    """Each request against the case ends with its outcome and reason, planned == recorded,
    and the run ends within its deadlines with peak RSS near a healthy run's."""
    got = {}

    def run() -> None:
        with ScriptedServer(case.script) as server:
            started = perf_counter()
            got["result"] = invoke(workload, server.url, tmp_path)
            got["wall_s"] = perf_counter() - started

    growth = peak_rss_growth_mib(run)
    result = got["result"]
    assert result.exit_code == (0 if case.outcome is Outcome.OK else 2), result.output
    assert "Traceback" not in result.output
    records = pl.read_parquet(tmp_path / "r" / "records.parquet")
    assert records.height == REQUESTS  # planned == recorded
    assert set(records["outcome"]) == {case.outcome.value}, records["error"].to_list()
    if case.error:
        assert all(case.error in e for e in records["error"]), records["error"].to_list()
    assert got["wall_s"] < RUN_BOUND_S
    if sys.platform == "linux":
        assert growth is not None, "peak RSS is measurable on Linux (/proc/self/clear_refs)"
    if growth is not None:
        assert growth < RSS_BOUND_MIB, f"peak RSS grew {growth:.0f} MiB"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_preflight_ends_by_its_deadline_with_what_went_wrong(case: HostileCase) -> None:
    """Against each case the preflight passes or says what was wrong, within its deadline."""
    adapter = adapter_for("openai-chat")
    got = {"message": ""}

    def check() -> None:
        with ScriptedServer(case.script) as server:
            endpoint = make_endpoint(server.url, adapter.default_path, {})
            started = perf_counter()
            try:
                preflight(endpoint, adapter, BodyOptions(model="m"), timeout_s=PREFLIGHT_S)
            except TargetError as exc:
                got["message"] = str(exc)
            got["elapsed_s"] = perf_counter() - started

    growth = peak_rss_growth_mib(check)
    assert got["elapsed_s"] < PREFLIGHT_BOUND_S
    if case.preflight:
        assert case.preflight in got["message"]
    else:
        assert got["message"] == ""
    if growth is not None:
        assert growth < RSS_BOUND_MIB, f"peak RSS grew {growth:.0f} MiB"


def test_each_class_has_its_own_event_cap(tmp_path: Path) -> None:
    """10 KiB tokens pass the default 1 MiB cap and fail a class capped at 4 KiB, whose
    records name its cap and key."""
    path = tmp_path / "w.yaml"
    small = WORKLOAD.split("classes:\n", 1)[1].replace("chat:", "small:")
    small = small.replace("    deadlines:", "    limits: {max_event_bytes: 4096}\n    deadlines:")
    path.write_text(WORKLOAD + small)
    big_token = chat_chunk("x" * 10_240)
    with ScriptedServer(
        lambda r: stream_steps(
            [chat_chunk(role="assistant"), big_token, chat_chunk(finish="length")]
        )
    ) as server:
        result = invoke(path, server.url, tmp_path)
    assert result.exit_code == 2, result.output
    records = pl.read_parquet(tmp_path / "r" / "records.parquet")
    by_class = {name: set(group["outcome"]) for (name,), group in records.group_by("class")}
    assert by_class == {"chat": {"ok"}, "small": {"stream_error"}}
    errors = set(records.filter(pl.col("class") == "small")["error"])
    assert errors == {
        "a stream event over the 4 KiB cap (limits.max_event_bytes of class small): "
        "connection closed"
    }


# -- one writer per run folder -------------------------------------------------------------
SMOKE = Path(__file__).resolve().parents[1] / "workloads" / "chat-smoke.yaml"


def loadgen_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True,
                          text=True, timeout=timeout_s)  # fmt: skip


def test_recover_refuses_a_live_run_and_waits_for_it_with_wait(tmp_path: Path) -> None:
    """`report --recover` and `report` of a run still running exit 6 saying it is running,
    and the run goes on to record all 60 plans; `--recover --wait` waits for its end."""
    command = [sys.executable, "-m", "loadgen", "run", str(SMOKE), "--requests", "60",
               "--out", str(tmp_path), "--run-id", "live", "-q", "--lag-bound-ms", "1000"]  # fmt: skip
    live = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "live"
    try:
        give_up = monotonic() + 120  # a generous wait for a state, not a timing claim
        while not list((run_dir / "records.parts").glob("part-*.parquet")):
            assert live.poll() is None and monotonic() < give_up, "the run never wrote a part"
            sleep(0.1)
        refused = loadgen_cli("report", "--recover", str(run_dir))
        reported = loadgen_cli("report", str(run_dir))
        waited = loadgen_cli("report", "--recover", "--wait", str(run_dir), "--format", "json")
    finally:
        _, stderr = live.communicate(timeout=120)
    assert refused.returncode == 6, refused.stderr
    assert f"{run_dir} is running: its lock (run.lock) is held by pid {live.pid}" in refused.stderr
    assert reported.returncode == 6 and "is running" in reported.stderr, reported.stderr
    assert "killed" not in reported.stdout + reported.stderr
    assert live.returncode in (0, 2), stderr  # the live run was not broken by the attempts
    info = json.loads((run_dir / "run.json").read_text())
    assert info["finished"] is True and info.get("client_failure") is None
    assert not info.get("recovered")
    assert pl.read_parquet(run_dir / "records.parquet").height == 60
    assert "waiting:" in waited.stderr and "nothing to recover" in waited.stderr
    assert waited.returncode == live.returncode
    assert not (run_dir / "run.lock").exists()


def test_a_fresh_heartbeat_without_a_settling_lock_is_a_live_run(tmp_path: Path) -> None:
    """No lock file (another host, an older loadgen): a heartbeat touched a moment ago is a
    live run, one 10 s old is not; a free lock taken on this host settles it whatever the
    heartbeat says (a run killed a moment ago is recoverable at once)."""
    parts = tmp_path / PARTS_DIR
    parts.mkdir()
    beat = parts / f"{HEARTBEAT}-w001"
    beat.touch()
    assert "heartbeat was touched" in (live_writer(tmp_path) or "")
    old = time.time() - 10
    os.utime(beat, (old, old))
    assert live_writer(tmp_path) is None
    beat.touch()
    (tmp_path / LOCK_FILE).write_text(f"1 {socket.gethostname()}\n")  # its holder died
    assert live_writer(tmp_path) is None
    (tmp_path / LOCK_FILE).write_text("1 another-host\n")
    assert live_writer(tmp_path) is not None
    with run_lock(tmp_path, doing="test"):
        assert f"held by pid {os.getpid()}" in (live_writer(tmp_path) or "")
        with pytest.raises(RunBusy, match="is running"):
            with run_lock(tmp_path, doing="recover"):
                pass
