"""Calibration: expected peak load, the saved envelope per host, and the run warning."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.analysis.calibration import Ladder, Level, Thresholds
from loadgen.cli import cli
from loadgen.engine.transport import KERNEL_STAMPS_AVAILABLE, Connection, Pool, make_endpoint
from loadgen.results.records import Outcome, RequestRecord
from loadgen.run.envelope import (
    Envelope,
    Load,
    envelope_warning,
    expected_peak_load,
    host_name,
    last_envelope,
    save_calibration,
)
from loadgen.run.processes.simulator import running_sim
from loadgen.studies.calibrate import calibrate, compare, level_plans, run_engine, sim_args
from loadgen.workload.plans import RequestPlan
from loadgen.workload.spec import Deadlines, WorkloadSpec, loads

SPEC = """
name: t
target: {api: openai-chat, model: m}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 10}
    requests: 10
    prompt_tokens: {dist: fixed, value: 10}
    output_tokens: {dist: fixed, value: 100}
    slo: {ttft_ms: 1000, tpot_ms: 50}
"""


def spec() -> WorkloadSpec:
    return loads(SPEC)


def plan(request_id: int, at_s: float, tokens: int) -> RequestPlan:
    return RequestPlan(
        request_id=request_id,
        class_name="chat",
        intended_ns=int(at_s * 1e9),
        prompt_tokens=10,
        output_tokens=tokens,
        deadlines=Deadlines(),
    )


def result(host: str, processes: int, streams: int | None, at: str) -> dict[str, object]:
    envelope = None if streams is None else {"streams": streams, "chunks_per_s": streams * 50.0}
    return {"host": host, "processes": processes, "measured_at": at, "envelope": envelope}


def test_peak_load_counts_overlapping_streams_at_their_tpot() -> None:
    """Three 5 s streams started 1 s apart overlap 3 deep, each at 1000/tpot chunks/s."""
    plans = [plan(i, i * 1.0, 100) for i in range(3)]  # 100 tokens × 50 ms = 5 s each
    assert expected_peak_load(spec(), plans) == Load(streams=3, chunks_per_s=60.0)


def test_peak_load_of_back_to_back_streams_is_one() -> None:
    """A stream that starts as the previous one ends does not overlap it."""
    plans = [plan(i, i * 5.0, 100) for i in range(4)]
    assert expected_peak_load(spec(), plans) == Load(streams=1, chunks_per_s=20.0)


def test_peak_load_of_the_parsed_workload_matches_rate_times_duration() -> None:
    """A constant 10/s with 5 s streams holds ~50 open (Little's law) once it is steady."""
    from loadgen.workload.plans import plan_work

    long = loads(SPEC.replace("requests: 10", "requests: 200"))
    peak = expected_peak_load(long, plan_work(long, 0).plans)
    assert 49 <= peak.streams <= 51
    assert peak.chunks_per_s == pytest.approx(peak.streams * 20.0)


def test_last_envelope_is_this_hosts_most_recent(tmp_path: Path) -> None:
    """Other hosts are ignored; the newest entry wins unless a process count is asked for."""
    path = tmp_path / "calibration.json"
    save_calibration(result(host_name(), 1, 256, "2026-01-01T00:00:00+00:00"), path)
    save_calibration(result(host_name(), 2, 512, "2026-01-02T00:00:00+00:00"), path)
    save_calibration(result("elsewhere", 1, 4096, "2026-01-03T00:00:00+00:00"), path)
    newest = last_envelope(path)
    assert newest is not None
    assert newest.processes == 2
    assert newest.load == Load(streams=512, chunks_per_s=25600.0)
    one = last_envelope(path, processes=1)
    assert one == Envelope(
        load=Load(streams=256, chunks_per_s=12800.0),
        processes=1,
        measured_at="2026-01-01T00:00:00+00:00",
        host=host_name(),
    )


def test_no_calibration_means_no_envelope_and_no_warning(tmp_path: Path) -> None:
    """A missing or corrupt file is treated as never calibrated."""
    path = tmp_path / "calibration.json"
    assert last_envelope(path) is None
    path.write_text("{not json")
    assert last_envelope(path) is None
    assert envelope_warning(spec(), [plan(0, 0, 10)], path=path) is None


@pytest.mark.parametrize("bad", ["Infinity", "-Infinity", "NaN", "1e400", "-3", '"many"'])
@pytest.mark.parametrize("field", ["streams", "chunks_per_s", "processes"])
def test_an_entry_that_is_no_count_is_ignored_not_a_traceback(
    field: str, bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edited cache whose envelope holds Infinity (made every `run` fail: OverflowError
    converting it to int), NaN, a negative or a word: that entry is no envelope (ignored,
    as a corrupt file is), this host's good entry still is, and `loadgen run` runs."""
    path = tmp_path / "calibration.json"
    save_calibration(result(host_name(), 2, 512, "2026-01-01T00:00:00+00:00"), path)
    entry = result(host_name(), 1, 256, "2026-01-02T00:00:00+00:00")
    target = entry if field == "processes" else entry["envelope"]
    target[field] = "BAD"  # type: ignore[index]
    data = json.loads(path.read_text())
    data["hosts"][host_name()]["1"] = entry
    path.write_text(json.dumps(data).replace('"BAD"', bad))
    envelope = last_envelope(path)
    assert envelope is not None
    assert envelope.processes == 2  # the newer entry is no envelope: the older one stands
    monkeypatch.setenv("LOADGEN_CALIBRATION", str(path))
    assert envelope_warning(spec(), [plan(0, 0, 10)]) is None
    workload = tmp_path / "w.yaml"
    workload.write_text(SPEC)
    result_ = CliRunner().invoke(cli, ["run", str(workload), "--dry-run"])
    assert result_.exit_code == 0, result_.output


def test_env_var_chooses_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LOADGEN_CALIBRATION overrides the default cache location for saving and reading."""
    path = tmp_path / "elsewhere.json"
    monkeypatch.setenv("LOADGEN_CALIBRATION", str(path))
    save_calibration(result(host_name(), 1, 64, "2026-01-01T00:00:00+00:00"))
    assert json.loads(path.read_text())["hosts"][host_name()]["1"]["envelope"]["streams"] == 64
    assert last_envelope() is not None


def test_run_warns_only_above_the_envelope(tmp_path: Path) -> None:
    """The warning names the peak and the envelope; a load within it gets none."""
    path = tmp_path / "calibration.json"
    save_calibration(result(host_name(), 1, 2, "2026-01-01T00:00:00+00:00"), path)
    two = [plan(i, i * 1.0, 100) for i in range(2)]
    three = [plan(i, i * 1.0, 100) for i in range(3)]
    assert envelope_warning(spec(), two, path=path) is None
    warning = envelope_warning(spec(), three, path=path)
    assert warning is not None
    assert "3 streams" in warning
    assert "2 streams" in warning
    assert envelope_warning(spec(), three, path=path, processes=2) is None


def test_a_calibration_where_nothing_passed_warns_for_any_load(tmp_path: Path) -> None:
    """No passing level is an envelope of zero, not an absent calibration."""
    path = tmp_path / "calibration.json"
    save_calibration(result(host_name(), 1, None, "2026-01-01T00:00:00+00:00"), path)
    assert envelope_warning(spec(), [plan(0, 0, 10)], path=path) is not None


def fake_level(streams: int, *, met: bool, processes: int = 1) -> Level:
    return Level(
        streams=streams, tokens_per_s=50.0, processes=processes, chunks_per_s=streams * 50.0,
        chunks=streams * 200, expected_chunks=streams * 200, failed=0, cpu_us_per_chunk=20.0,
        timestamp_err_p50_ms=0.5, timestamp_err_p99_ms=1.0 if met else 9.0,
        timestamp_err_max_ms=12.0, ttft_err_p99_ms=1.0, send_lag_p99_ms=1.0,
        steal_ms=0.0, cpu_stall_ms=0.0, load_avg_1m=0.5, misses=() if met else ("ts p99",),
    )  # fmt: skip


def fake_measure(knee: int):  # type: ignore[no-untyped-def]
    """A level measurer that meets the thresholds up to `knee` streams; records what it ran."""
    asked: list[int] = []

    def measure(streams: int, ladder: Ladder, thresholds: Thresholds) -> Level:
        asked.append(streams)
        return fake_level(streams, met=streams <= knee, processes=ladder.processes)

    return measure, asked


def test_envelope_is_the_last_level_before_the_first_miss() -> None:
    """The ladder stops at the first miss; the envelope is per process."""
    measure, asked = fake_measure(256)
    ladder = Ladder(streams=(512, 64, 128, 256, 1024), processes=2)
    found = calibrate(ladder, Thresholds(), measure=measure)
    assert asked == [64, 128, 256, 512]
    assert found["envelope_total"] == {"streams": 256, "chunks_per_s": 12800.0}
    assert found["envelope"] == {"streams": 128, "chunks_per_s": 6400.0}
    assert [lv["met"] for lv in found["levels"]] == [True, True, True, False]


def test_a_pass_above_a_miss_does_not_raise_the_envelope() -> None:
    """With --all-levels every level runs, but a lucky pass above a miss is not capacity."""
    asked: list[int] = []

    def measure(streams: int, ladder: Ladder, thresholds: Thresholds) -> Level:
        asked.append(streams)
        return fake_level(streams, met=streams != 128)

    found = calibrate(Ladder(streams=(64, 128, 256), all_levels=True), Thresholds(),
                      measure=measure)  # fmt: skip
    assert asked == [64, 128, 256]
    assert found["envelope_total"]["streams"] == 64


def test_compare_judges_against_the_servers_write_times() -> None:
    """Errors are client arrival (t0 + relative) minus server write; each threshold judged."""
    t0 = 1_000_000_000
    ladder = Ladder(streams=(2,), stream_s=0.04)  # 2 tokens per stream
    records = [
        RequestRecord(request_id=i, class_name="c", intended_ns=0, dispatched_ns=1_000_000,
                      outcome=Outcome.OK, first_token_ns=10_000_000 + i * 6_000_000,
                      chunk_ns=[10_000_000 + i * 6_000_000, 30_000_000])
        for i in range(2)
    ]  # fmt: skip
    trace = {f"loadgen-{i}": [t0 + 10_000_000, t0 + 29_000_000] for i in range(2)}
    level = compare(2, ladder, Thresholds(), records, 0.004, t0, trace)
    assert level.chunks == level.expected_chunks == 4
    assert level.timestamp_err_max_ms == pytest.approx(6.0)
    assert level.cpu_us_per_chunk == pytest.approx(1000.0)
    assert level.misses == ("ts p99", "TTFT p99")
    loose = compare(2, ladder, Thresholds(timestamp_p99_ms=7, ttft_p99_ms=7), records, 0.0, t0,
                    trace)  # fmt: skip
    assert loose.met


def test_compare_figures_are_nearest_rank_percentiles() -> None:
    """Timestamp errors of 1, 2, ..., 10 ms: p50 is the 5th (5 ms, not the interpolated
    5.5) and p99 the 10th (10 ms, not 9.91), as every percentile in loadgen."""
    t0 = 1_000_000_000
    ladder = Ladder(streams=(10,), stream_s=0.02)  # 1 token per stream
    records = [
        RequestRecord(request_id=i, class_name="c", intended_ns=0, dispatched_ns=i * 1_000_000,
                      outcome=Outcome.OK, first_token_ns=(i + 1) * 1_000_000,
                      chunk_ns=[(i + 1) * 1_000_000])
        for i in range(10)
    ]  # fmt: skip
    trace = {f"loadgen-{i}": [t0] for i in range(10)}
    level = compare(10, ladder, Thresholds(), records, 0.0, t0, trace)
    assert (level.timestamp_err_p50_ms, level.timestamp_err_p99_ms) == (5.0, 10.0)
    assert level.ttft_err_p99_ms == 10.0
    assert level.send_lag_p99_ms == 9.0  # lags 0..9 ms


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_quick_calibration_measures_every_chunk_against_the_simulator(tmp_path: Path) -> None:
    """`loadgen calibrate --quick` runs the simulator and engine and saves a full result."""
    from click.testing import CliRunner

    from loadgen.cli import cli

    path = tmp_path / "calibration.json"
    out = CliRunner().invoke(cli, ["calibrate", "--quick", "--format", "json", "--save", str(path)])
    assert out.exit_code in (0, 2), out.output
    found = json.loads(out.output)
    assert [lv["streams"] for lv in found["levels"]][:1] == [8]
    for level in found["levels"]:
        assert level["chunks"] == level["expected_chunks"] == level["streams"] * 50
        assert level["failed"] == 0
        assert level["timestamp_err_p50_ms"] is not None
        assert level["cpu_us_per_chunk"] > 0
    saved = json.loads(path.read_text())["hosts"][host_name()]["1"]
    assert saved["levels"] == found["levels"]
    assert saved["quick"] is True  # saved because --save was given, and says what it was
    assert saved["ladder"] == {"levels": [8, 16], "tokens_per_s": 50.0, "stream_s": 1.0,
                               "ramp_s": 0.2, "processes": 1, "all_levels": False}  # fmt: skip


def test_calibration_opens_its_connections_before_t0_as_a_run_does() -> None:
    """A level's streams go out on connections warmed before t0 (`--warm-connections
    auto`, what `loadgen run` does), so connection setup is in none of its figures: no
    request opened its own (`new`, every one of them, before): each took a warm one, or
    one a finished stream had given back (`reused`)."""
    with running_sim(sim_args(8, 50.0)) as sim:
        t0_ns = time.perf_counter_ns() + 200_000_000
        records, cpu_s = run_engine(level_plans(8, 5, 0.1), sim.url, t0_ns)
    assert [r.outcome for r in records] == [Outcome.OK] * 8
    used = [r.connection for r in records]
    assert used[0] == "warm"
    assert "new" not in used, used
    assert cpu_s > 0


@pytest.mark.slow  # ~6 s on 2 cores: left to .ci/run's second part
def test_quick_calibration_on_two_engine_processes_measures_every_chunk() -> None:
    """`calibrate --quick --processes 2`: each level's streams are split over two spawned
    engine processes started at one t0, and every chunk of both is measured."""
    from click.testing import CliRunner

    from loadgen.cli import cli

    out = CliRunner().invoke(
        cli, ["calibrate", "--quick", "--processes", "2", "--format", "json", "--no-save"]
    )
    assert out.exit_code in (0, 2), out.output
    found = json.loads(out.output)
    assert found["processes"] == 2
    for level in found["levels"]:
        assert level["processes"] == 2
        assert level["chunks"] == level["expected_chunks"] == level["streams"] * 50
        assert level["failed"] == 0


@pytest.mark.parametrize(
    ("args", "saved"),
    [
        (["--quick"], False),  # a smoke check is not this host's envelope
        (["--quick", "--save"], True),  # unless asked
        ([], True),  # the full ladder saves by default
        (["--no-save"], False),
    ],
)
def test_quick_saves_only_with_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], saved: bool
) -> None:
    """`--quick` leaves the calibration file alone unless `--save` (with or without a PATH)
    is given; a saved entry records its ladder and whether it was quick."""
    from click.testing import CliRunner

    import loadgen.cli.calibrate as cli_calibrate
    from loadgen.cli import cli
    from loadgen.studies.calibrate import calibrate as real_calibrate

    path = tmp_path / "calibration.json"
    monkeypatch.setenv("LOADGEN_CALIBRATION", str(path))
    monkeypatch.setattr(
        cli_calibrate, "run_calibration",
        lambda ladder, thresholds, progress, **_: real_calibrate(
            ladder, thresholds, progress, measure=lambda n, _l, _t: fake_level(n, met=True)),
    )  # fmt: skip
    out = CliRunner().invoke(cli, ["calibrate", *args])
    assert out.exit_code == 0, out.output
    assert path.exists() is saved
    if "--quick" in args and not saved:
        assert "not saved: --quick is a smoke check" in out.output
    if saved:
        entry = json.loads(path.read_text())["hosts"][host_name()]["1"]
        assert entry["quick"] is ("--quick" in args)
        assert entry["ladder"]["levels"] == ([8, 16] if "--quick" in args else
                                             [64, 128, 256, 512, 1024])  # fmt: skip


def test_save_and_no_save_together_are_refused(tmp_path: Path) -> None:
    """--save PATH --no-save is a usage error (exit 1), nothing measured."""
    from click.testing import CliRunner

    from loadgen.cli import cli

    out = CliRunner().invoke(cli, ["calibrate", "--save", str(tmp_path / "c.json"), "--no-save"])
    assert out.exit_code == 1
    assert "--save/--no-save" in out.output
    assert not (tmp_path / "c.json").exists()


def test_the_warning_says_when_the_envelope_came_from_a_quick_check(tmp_path: Path) -> None:
    """An envelope saved from --quick is used, and the warning says it was a smoke check."""
    path = tmp_path / "calibration.json"
    save_calibration({**result(host_name(), 1, 16, "2026-11-01T00:00:00+00:00"), "quick": True},
                     path)  # fmt: skip
    envelope = last_envelope(path)
    assert envelope is not None
    assert envelope.quick
    plans = [plan(i, i * 0.01, 100) for i in range(200)]
    warning = envelope_warning(spec(), plans, path=path)
    assert warning is not None
    assert "--quick, a smoke check" in warning


@pytest.mark.skipif(not KERNEL_STAMPS_AVAILABLE, reason="SO_TIMESTAMPNS is Linux-only")
def test_kernel_stamps_are_the_arrival_not_the_read() -> None:
    """Bytes that arrive while the loop is blocked are stamped when they arrived, not read."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stamps: dict[str, int] = {}

    class Sink:
        def on_head(self, status: int, headers: object, t_ns: int) -> None:
            stamps["head"] = t_ns

        def on_body(self, data: bytes, t_ns: int) -> None:
            stamps["body"] = t_ns

        def on_end(self, t_ns: int) -> None:
            stamps["end"] = t_ns

        def on_lost(self, reason: str, got_response_bytes: bool, t_ns: int) -> None:
            stamps["lost"] = t_ns

    async def main() -> tuple[int, int]:
        pool = Pool(make_endpoint(f"http://127.0.0.1:{port}", "/v1", {}), kernel_stamps=True)
        time.sleep(0.1)  # Linux turns packet stamping on asynchronously (the pool asked for it)
        conn = await pool.connect()
        server, _ = listener.accept()
        conn.send(Sink(), b"GET / HTTP/1.1\r\n\r\n")
        server.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        written_ns = time.perf_counter_ns()  # the kernel stamped the bytes before this
        time.sleep(0.05)  # the loop is blocked: a user-space stamp would come after this
        blocked_until_ns = time.perf_counter_ns()
        while "end" not in stamps and "lost" not in stamps:
            await asyncio.sleep(0.001)
        server.close()
        pool.close()
        return written_ns, blocked_until_ns

    written_ns, blocked_until_ns = asyncio.run(main())
    listener.close()
    assert "lost" not in stamps
    assert stamps["head"] == stamps["body"] == stamps["end"]
    assert stamps["body"] <= written_ns + 1_000_000  # clock conversion: well under 1 ms
    assert stamps["body"] < blocked_until_ns


def test_read_stamps_never_go_back_in_time_on_a_connection() -> None:
    """A stamp moved wrongly between clocks is floored: never before the request was written,
    never before the previous read, so no latency or gap can come out negative."""
    seen: list[int] = []

    class Sink:
        def on_head(self, status: int, headers: object, t_ns: int) -> None:
            seen.append(t_ns)

        def on_body(self, data: bytes, t_ns: int) -> None:
            seen.append(t_ns)

        def on_end(self, t_ns: int) -> None:
            seen.append(t_ns)

        def on_lost(self, reason: str, got_response_bytes: bool, t_ns: int) -> None:
            raise AssertionError(reason)

    class Wire:
        def write(self, data: bytes) -> None:
            pass

    async def main() -> int:
        conn = Connection(Pool(make_endpoint("http://127.0.0.1:9", "/v1", {})))
        conn.transport = Wire()  # type: ignore[assignment]  # only write() is used
        conn.send(Sink(), b"GET / HTTP/1.1\r\n\r\n")
        sent_ns = time.perf_counter_ns()
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        conn.received(head, sent_ns - 5_000_000)  # "before the request was written"
        conn.received(b"5\r\nhello\r\n", sent_ns + 2_000_000)
        conn.received(b"5\r\nworld\r\n", sent_ns + 1_000_000)  # before the previous read
        conn.received(b"0\r\n\r\n", sent_ns + 3_000_000)
        conn.process()
        return sent_ns

    sent_ns = asyncio.run(main())
    assert len(seen) == 4
    assert seen[0] >= sent_ns - 1_000_000  # floored at the send (taken just before sent_ns)
    assert seen[0] <= sent_ns
    assert seen[1:] == [sent_ns + 2_000_000, sent_ns + 2_000_000, sent_ns + 3_000_000]


INTERRUPTED_LEVEL = """
import sys
from loadgen.studies.calibrate import level_plans, run_processes
try:
    run_processes(level_plans(4, 2000, 0.2), sys.argv[1], 2)  # 2000 tokens: 100 s streams
except KeyboardInterrupt:
    sys.exit(130)
"""


def sim_running(url: str) -> float:
    """The simulator's own count of streams it is serving (its vllm:num_requests_running)."""
    import httpx

    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.split()[-1])
    raise AssertionError("the simulator exposes no vllm:num_requests_running")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_an_interrupted_multi_process_level_stops_every_engine_process() -> None:
    """SIGINT while two calibrate engine processes stream a level: the interrupt policy of
    every run stops both (their streams end on the server, long before the 100 s they were
    planned for), the parent ends with KeyboardInterrupt, and no engine process is left."""
    import signal
    import subprocess
    import sys

    from loadgen.testing.crashtest import descendants, wait_for, wait_until_gone

    with running_sim(sim_args(4, 20.0)) as sim:  # 50 ms a token
        process = subprocess.Popen([sys.executable, "-c", INTERRUPTED_LEVEL, sim.url],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        try:
            wait_for(process, lambda: sim_running(sim.url) == 4, timeout_s=120)
            helpers = descendants(process.pid)  # the engines, multiprocessing's tracker
            commands = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in helpers]
            assert sum(b"spawn_main" in c for c in commands) == 2, commands
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=60)  # unstopped, the level lasts 100 s
        finally:
            process.kill()
        assert process.returncode == 130, stderr.decode()
        assert "interrupted: no new requests" in stderr.decode()
        assert wait_until_gone(helpers) == []
        deadline = time.monotonic() + 30
        while sim_running(sim.url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sim_running(sim.url) == 0
