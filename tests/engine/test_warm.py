"""Warm connections, bursts of sends, the closed loop's turnaround (issue #19).

Most run in virtual time (`loadgen.testing.virtual`), where each connect takes exactly
`CONNECT_S` and each script's pauses are exact: a latency that holds a connection's setup
shows it to the nanosecond, and one that does not shows none of it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.analysis.connections import connection_use
from loadgen.cli import cli
from loadgen.engine import harness
from loadgen.engine.runner import Engine
from loadgen.engine.transport import Connection, Pool, WarmReport, make_endpoint
from loadgen.engine.transport import pool as transport_pool
from loadgen.engine.warmup import (
    AUTO_CAP,
    MAX_WARM,
    auto_count,
    peak_in_flight,
    warm_capped_note,
    warm_count,
)
from loadgen.results.records import RequestRecord, to_frame
from loadgen.testing import (
    CLOSE,
    LAST_CHUNK,
    PlanFactory,
    ReceivedRequest,
    ScriptedServer,
    Step,
    chat_chunk,
    chunk,
    engine_config,
    head,
    simple_chat,
    sse,
)
from loadgen.testing.builders import chat_workload, workload_file
from loadgen.testing.virtual import ScriptedPool, VirtualClock, VirtualLoop, run_scripted
from loadgen.workload.plans import Flow, RequestPlan, Work

CONNECT_S = 0.05
FIRST_S = 0.2
CONNECT_NS, FIRST_NS = int(CONNECT_S * 1e9), int(FIRST_S * 1e9)
TOLERANCE_NS = 1_000  # the loop's timers are float seconds: exact to well under 1 µs


def reply(_: ReceivedRequest) -> list[Step]:
    return simple_chat(3, first_delay_s=FIRST_S)


def burst(count: int) -> list[RequestPlan]:
    return PlanFactory().at(*[0.0] * count)


def send_lag_ns(record: RequestRecord) -> int:
    assert record.sent_ns is not None
    return record.sent_ns - record.intended_ns


def ttft_ns(record: RequestRecord) -> int:
    assert record.first_token_ns is not None
    return record.first_token_ns - record.intended_ns


def test_cold_start_charges_each_request_its_connection_setup() -> None:
    """With no warm connections, a burst's send lag and TTFT each hold the connect time."""
    records, pool = run_scripted(burst(8), reply, connect_s=CONNECT_S)
    assert (pool.opened, pool.warm_opened) == (8, 0)
    for record in records:
        assert record.connection == "new"
        assert abs(send_lag_ns(record) - CONNECT_NS) < TOLERANCE_NS
        assert abs(ttft_ns(record) - (CONNECT_NS + FIRST_NS)) < TOLERANCE_NS


def test_warm_connections_keep_setup_out_of_every_latency() -> None:
    """Warmed before t0, the burst is written at its intended time and TTFT is the server's."""
    records, pool = run_scripted(burst(8), reply, connect_s=CONNECT_S, warm=8)
    assert pool.opened == pool.warm_opened == 8  # none opened during the run
    for record in records:
        assert record.connection == "warm"
        assert abs(send_lag_ns(record)) < TOLERANCE_NS
        assert abs(ttft_ns(record) - FIRST_NS) < TOLERANCE_NS


def test_fewer_warm_connections_than_the_burst_cold_starts_the_rest() -> None:
    """4 warm for 8 sends: 4 carry no setup, 4 open their own and carry it, exactly."""
    records, pool = run_scripted(burst(8), reply, connect_s=CONNECT_S, warm=4)
    kinds = sorted(r.connection or "" for r in records)
    assert kinds == ["new"] * 4 + ["warm"] * 4
    assert (pool.opened, pool.warm_opened) == (8, 4)
    for record in records:
        expected = CONNECT_NS if record.connection == "new" else 0
        assert abs(send_lag_ns(record) - expected) < TOLERANCE_NS


def test_a_warm_connection_the_server_dropped_is_retried_once_on_a_fresh_one() -> None:
    """A warm connection closed before it answered is retried, as a kept-alive one is."""
    calls: list[int] = []

    def close_first(request: ReceivedRequest) -> list[Step]:
        calls.append(request.connection)
        return [CLOSE] if len(calls) == 1 else simple_chat(2)

    records, pool = run_scripted(burst(1), close_first, warm=1)
    (record,) = records
    assert (record.outcome, record.retries) == ("ok", 1)
    assert record.connection == "new"  # the attempt that answered was on a fresh connection
    assert pool.opened == 2


def closed_loop(concurrency: int, documents: int) -> Work:
    plans = tuple(
        RequestPlan(request_id=i, class_name="docs", intended_ns=0, prompt_tokens=8,
                    output_tokens=3, deadlines=PlanFactory().deadlines, session_id=0, turn=i)
        for i in range(documents)
    )  # fmt: skip
    flow = Flow(kind="batch", class_name="docs", session_id=0, start_ns=0, plans=plans,
                concurrency=concurrency)  # fmt: skip
    return Work(flows=[flow])


def run_virtual(
    work: Work, handler: Any, *, warm: int
) -> tuple[list[RequestRecord], ScriptedPool, list[int]]:
    """The engine in virtual time; also, per record, how many requests the server had
    received when that record was emitted."""
    config = engine_config()
    endpoint = make_endpoint("http://127.0.0.1:8000", config.adapter.default_path, {})
    clock = VirtualClock()
    pool = ScriptedPool(handler, endpoint, clock)
    records: list[RequestRecord] = []
    seen: list[int] = []

    def on_record(record: RequestRecord) -> None:
        records.append(record)
        seen.append(len(pool.requests))

    async def session(engine: Engine) -> None:
        await engine.connector.warm(warm)
        await engine.run(engine.clock.now_ns() + 20_000_000)

    harness.run_engine(work, pool, config, on_record, session, quiet=False,
                       loop_options={"loop_factory": lambda: VirtualLoop(clock)})  # fmt: skip
    return records, pool, seen


def test_closed_loop_sends_the_next_document_in_the_callback_that_ended_the_last() -> None:
    """Each later document is intended at its predecessor's end, written at that instant on
    the same connection, before the predecessor's record is even emitted."""
    records, pool, seen = run_virtual(closed_loop(2, 8), reply, warm=2)
    assert pool.opened == 2  # two connections carried all eight documents
    by_id = {r.request_id: r for r in records}
    ends = sorted(r.end_ns for r in records if r.end_ns is not None)
    for record in records:
        if record.request_id < 2:
            assert record.connection == "warm"
            assert abs(send_lag_ns(record)) < TOLERANCE_NS
            continue
        assert record.connection == "reused"
        assert record.intended_ns in ends  # due at an earlier document's end, to the ns
        assert send_lag_ns(record) == 0  # written in that same callback
        assert abs(ttft_ns(record) - FIRST_NS) < TOLERANCE_NS
    # When each record (but the last two) was emitted, its successor had already been sent.
    order = [r.request_id for r in records]
    for position, request_id in enumerate(order[:-2]):
        assert seen[position] >= position + 3, (request_id, seen)
    assert len(by_id) == 8


def done_then_hold(_: ReceivedRequest) -> Iterator[Step]:
    """A token, a stop, [DONE], then the chunked body stays open 5 s before its last chunk."""
    yield head()
    yield chunk(chat_chunk(" w"))
    yield chunk(chat_chunk(finish="stop"))
    yield chunk(sse("[DONE]"))
    yield 5.0
    yield LAST_CHUNK


def test_closed_loop_goes_on_when_a_stream_settles_but_its_connection_stays_open() -> None:
    """[DONE] with the body left open: the next document goes out on another connection
    at once (the worker sends it), not 5 s later when the old connection frees."""
    records, pool, _ = run_virtual(closed_loop(1, 3), done_then_hold, warm=1)
    assert [r.outcome for r in records] == ["ok"] * 3
    for record in records[1:]:
        assert record.connection == "new"
        assert send_lag_ns(record) < 1_000_000  # not the 5 s the old connection held
    assert pool.opened == 3


@pytest.mark.parametrize(
    ("singles_s", "batches", "sessions", "expected"),
    [
        ([0.0, 0.5, 0.999], [], 0, 3),  # every single of the first second
        ([0.0, 1.0, 2.0], [], 0, 1),  # 1.0 s is the second second
        ([], [(0.0, 16, 40), (0.5, 8, 4)], 0, 20),  # batch concurrency, at most its docs
        ([], [(2.0, 16, 40)], 2, 2),  # a later batch: none; each session: one
    ],
)
def test_auto_warm_count_is_what_can_be_in_flight_in_the_first_second(
    singles_s: list[float], batches: list[tuple[float, int, int]], sessions: int, expected: int
) -> None:
    """auto = singles and flows starting in [0, 1 s), batches by their concurrency."""
    flows = [
        Flow(kind="batch", class_name="d", session_id=i, start_ns=int(at * 1e9),
             plans=tuple(PlanFactory().at(*[at] * docs)), concurrency=cap)
        for i, (at, cap, docs) in enumerate(batches)
    ]  # fmt: skip
    flows += [
        Flow(kind="session", class_name="c", session_id=100 + i, start_ns=0,
             plans=tuple(PlanFactory().at(0.0)))
        for i in range(sessions)
    ]  # fmt: skip
    assert auto_count(Work(singles=PlanFactory().at(*singles_s), flows=flows)) == expected


def test_warm_count_never_passes_the_plans_peak_concurrency() -> None:
    """Peak concurrency: every single, a batch's concurrency (at most its documents), a
    session's 1, an agent fan-out's branches; the flag is capped by it and by MAX_WARM."""
    factory = PlanFactory()
    batch = Flow(kind="batch", class_name="d", session_id=100, start_ns=0,
                 plans=tuple(factory.at(0.0, 0.0, 0.0)), concurrency=8)  # fmt: skip
    fan = tuple(replace(p, turn=t) for p, t in zip(factory.at(0.0, 0.0, 0.0, 0.0), [0, 1, 1, 1],
                                                   strict=True))  # fmt: skip
    agent = Flow(kind="trajectory", class_name="a", session_id=200, start_ns=0, plans=fan)
    work = Work(singles=factory.at(0.0, 5.0), flows=[batch, agent])
    assert peak_in_flight(work) == 2 + 3 + 3
    assert warm_count(work, 100_000, None) == 8
    assert warm_count(work, 100_000, None, max_in_flight=5) == 5
    assert "capped at 5 (--max-in-flight)" in (warm_capped_note(work, 9, None, 5) or "")
    assert warm_capped_note(work, 8, None) is None
    many = Work(singles=factory.at(*[0.0] * (MAX_WARM + 1)))
    assert warm_count(many, 10**6, None) == MAX_WARM


def test_warm_count_caps_auto_and_leaves_file_descriptor_headroom() -> None:
    """auto stops at AUTO_CAP; no count takes the last 64 descriptors; 0 is a cold start."""
    work = Work(singles=PlanFactory().at(*[0.0] * (AUTO_CAP + 10)))
    assert warm_count(work, None, None) == AUTO_CAP
    assert warm_count(work, 5000, 1024) == 1024 - 64
    assert warm_count(work, 0, None) == 0


def test_warming_counts_a_server_that_closes_each_connection_at_once_as_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connections a server accepts and closes straight away are not kept as warm."""
    monkeypatch.setattr(transport_pool, "WARM_GRACE_S", 0.2)  # ample on a loaded machine

    async def main() -> WarmReport:
        async def close_at_once(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(make_endpoint(f"http://127.0.0.1:{port}", "/v1/chat/completions", {}))
        try:
            return await pool.warm(4)
        finally:
            pool.close()
            server.close()

    report = anyio.run(main)
    assert (report.requested, report.opened, report.failed) == (4, 0, 4)
    assert report.error is not None


def test_run_reports_warm_connections_in_run_json_records_and_summary(tmp_path: Path) -> None:
    """`--warm-connections 2`: run.json counts them, records name them, the summary adds up."""
    workload = workload_file(tmp_path, chat_workload("warm", requests=6, deadlines=None))
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, [
            "run", str(workload), "--url", server.url, "--out", str(tmp_path), "--run-id", "w",
            "-q", "--lag-bound-ms", "1000", "--warm-connections", "2",
        ])  # fmt: skip
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "w" / "run.json").read_text())
    assert run["connections"]["warm_requested"] == 2
    assert run["connections"]["warm_opened"] == 2
    frame = pl.read_parquet(tmp_path / "w" / "records.parquet")
    used = frame.get_column("connection").to_list()
    assert used.count("new") == run["connections"]["opened_during_run"]
    assert 1 <= used.count("warm") <= 2
    summary = json.loads((tmp_path / "w" / "summary.json").read_text())
    block = summary["connections"]
    assert sum(block[k]["requests"] for k in ("new", "warm", "reused")) == 6
    assert "connections:" in result.output


@pytest.mark.parametrize("value", ["-1", "lots", "2.5"])
def test_a_bad_warm_connections_value_is_a_clear_error(value: str, tmp_path: Path) -> None:
    """Not auto or a count: exit 1, naming the flag and how to fix it, no traceback."""
    workload = workload_file(tmp_path, chat_workload("warm", requests=2, deadlines=None))
    result = CliRunner().invoke(cli, ["run", str(workload), "--warm-connections", value])
    assert result.exit_code == 1
    assert "--warm-connections" in result.output
    assert "e.g." in result.output
    assert "Traceback" not in result.output


def test_summary_connection_block_is_the_known_answer() -> None:
    """Per kind: requests, send lag and TTFT percentiles from the records, exactly."""
    ms = 1_000_000

    def record(i: int, kind: str, lag_ms: int, ttft_ms: int) -> RequestRecord:
        return RequestRecord(
            request_id=i, class_name="c", intended_ns=0, outcome="ok", sent_ns=lag_ms * ms,
            first_token_ns=ttft_ms * ms, end_ns=(ttft_ms + 1) * ms, connection=kind,
        )  # fmt: skip

    frame = to_frame([record(0, "new", 40, 240), record(1, "new", 60, 260),
                      record(2, "warm", 0, 200), record(3, "reused", 1, 201)])  # fmt: skip
    use = connection_use(frame)
    assert use is not None
    assert (use.new.requests, use.warm.requests, use.reused.requests) == (2, 1, 1)
    assert (use.new.send_lag_ms.p50, use.new.send_lag_ms.max) == (40.0, 60.0)
    assert (use.new.ttft_ms.p99, use.warm.ttft_ms.p50) == (260.0, 200.0)
    assert connection_use(frame.with_columns(pl.lit(None, pl.String).alias("connection"))) is None


def test_streams_ending_together_all_send_their_successors_before_any_record_is_built() -> None:
    """160 streams end in one step (five parse slices): all 160 next documents are written
    before the first record is built (`Connector.after_reads`), not two slices' worth
    (224 of 320 requests), then records, then the next slices."""
    assert 160 // transport_pool.DRAIN_SLICE < transport_pool.AFTER_EVERY_SLICES
    records, pool, seen = run_virtual(closed_loop(160, 320), reply, warm=160)
    assert [r.outcome for r in records] == ["ok"] * 320
    assert pool.opened == 160
    assert seen[0] == 320  # the first record: every one of the 320 requests already sent


def test_warming_gives_up_on_connects_that_do_not_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connect that never completes (SYNs dropped) is failed after the warm deadline."""
    monkeypatch.setattr(transport_pool, "WARM_TIMEOUT_S", 0.5)

    class Hanging(Pool):
        async def connect(self) -> Connection:
            await asyncio.sleep(3600)
            raise AssertionError("unreachable")

    async def main() -> WarmReport:
        pool = Hanging(make_endpoint("http://127.0.0.1:9", "/v1/chat/completions", {}))
        return await pool.warm(3)

    report = anyio.run(main)
    assert (report.opened, report.failed) == (0, 3)
    assert report.error is not None
    assert "not connected within 0.5 s" in report.error


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ([], "2 opened before t0 (auto)"),
        (["--warm-connections", "1"], "1 opened before t0 (--warm-connections)"),
        (["--warm-connections", "7"], "2 opened before t0 (--warm-connections 7: capped at 2 "
         "(the plan's peak concurrency: the most requests it can have in flight at once)"),
    ],
)  # fmt: skip
def test_dry_run_says_how_many_connections_it_would_warm(
    flag: list[str], expected: str, tmp_path: Path
) -> None:
    """The dry run names the warm count: auto from the plan (2 requests in the first
    second), or the flag's, capped by the plan's peak concurrency (2 requests: 2)."""
    workload = workload_file(tmp_path, chat_workload("warm", requests=2, rate_per_s=50))
    result = CliRunner().invoke(cli, ["run", str(workload), "--dry-run", *flag])
    assert result.exit_code == 0, result.output
    assert f"warm connections: {expected}" in result.output
