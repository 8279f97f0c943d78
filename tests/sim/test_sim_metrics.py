"""The simulator's own account in the stream, as vLLM's `--enable-per-request-metrics` gives
it, read by the client into `server_timings`: its exact queue and prefill times, known
answers from the seed's physics (8,000 tok/s prefill, the decode table) and from its trace.

Every figure here is the engine's (simulated time divided by the speed factor), not a
clock reading of the machine, so the equalities are exact whatever the machine's load.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from loadgen.engine.traceparent import trace_id_of
from loadgen.results.records import Outcome, RequestRecord
from loadgen.run.processes.simulator import running_sim
from loadgen.testing import PlanFactory, run_engine
from loadgen.workload.plans import RequestPlan
from loadgen.workload.spec import Deadlines

SPEED = 4.0
MS = 1_000_000
PREFILL_TOKENS_PER_S = 8000.0
DEADLINES = Deadlines(first_token_s=20, stall_s=10, total_s=30)


def run(
    plans: Sequence[RequestPlan], args: list[str], trace_file: Path, **engine: Any
) -> tuple[list[RequestRecord], dict[str, dict[str, Any]]]:
    """The plans through the engine against a simulator at SPEED; the records, and the
    simulator's trace records by the request id they carried."""
    with running_sim(["--speed", str(SPEED), *args], trace_file=trace_file) as sim:
        records = run_engine(plans, sim.url, t0_ns=time.perf_counter_ns() + 50 * MS, **engine)
    lines = [json.loads(line) for line in trace_file.read_text().splitlines()]
    served = {line["x_request_id"]: line for line in lines if line["type"] == "request"}
    assert {r.outcome for r in records} == {Outcome.OK}, [r.error for r in records]
    return records, served


def engine_ms(line: dict[str, Any], start: str, end: str) -> float:
    """An interval of the simulator's engine, from its trace, on the client's clock (ms)."""
    engine = line["engine"]
    return (engine[end] - engine[start]) / SPEED / MS


def test_alone_on_an_idle_simulator_prefill_is_p_over_8000(tmp_path: Path) -> None:
    """A lone 2,000-token prompt: queue 0, prefill 2000/8000 s = 250 ms, each gap one decode
    step of a batch of 1 (20 ms), all ÷ the speed factor; TTFT = queue + prefill."""
    plans = PlanFactory(prompt_tokens=2000, output_tokens=5, deadlines=DEADLINES).at(0.0)
    (record,), _ = run(plans, ["--per-request-metrics"], tmp_path / "trace.jsonl")
    timings = record.server_timings
    assert timings is not None
    prefill = 2000 / PREFILL_TOKENS_PER_S * 1000 / SPEED  # 62.5 ms
    assert timings.queue_ms == 0.0
    assert timings.prefill_ms == pytest.approx(prefill, abs=1e-9)
    assert timings.ttft_ms == pytest.approx(prefill, abs=1e-9)
    assert timings.itl_ms == pytest.approx(20 / SPEED, abs=1e-9)
    assert timings.decode_ms == pytest.approx(4 * 20 / SPEED, abs=1e-9)


def test_under_load_queue_is_the_engines_and_grows_by_one_service_time(tmp_path: Path) -> None:
    """Six requests at once on a batch of one: each waits for those before it; its queue and
    prefill in the stream are exactly its trace's (scheduled − queued, first token −
    scheduled), each is scheduled one service (400/8000 s prefill + 3 decode steps of 20 ms)
    after the one before, and its trace id is the one its traceparent carried."""
    plans = PlanFactory(prompt_tokens=400, output_tokens=4, deadlines=DEADLINES).at(*[0.0] * 6)
    records, served = run(plans, ["--per-request-metrics", "--max-batch", "1"],
                          tmp_path / "trace.jsonl")  # fmt: skip
    lines = [served[str(r.request_id_sent)] for r in records]
    for record, line in zip(records, lines, strict=True):
        timings = record.server_timings
        assert timings is not None
        assert timings.queue_ms == engine_ms(line, "queued_sim_ns", "scheduled_sim_ns")
        assert timings.prefill_ms == engine_ms(line, "scheduled_sim_ns", "first_token_sim_ns")
        assert timings.prefill_ms == pytest.approx(400 / PREFILL_TOKENS_PER_S * 1000 / SPEED)
        assert line["trace_id"] == trace_id_of(record.traceparent)
        assert line["trace_id"] is not None
    scheduled = sorted(line["engine"]["scheduled_sim_ns"] for line in lines)
    service_ns = round((400 / PREFILL_TOKENS_PER_S + 3 * 0.020) * 1e9)  # 110 ms, simulated
    assert [b - a for a, b in itertools.pairwise(scheduled)] == [service_ns] * 5
    # So the k-th to be scheduled waited k services from the first's arrival, less the time
    # it arrived after it: its queue is that, exactly.
    order = sorted(
        zip(lines, records, strict=True), key=lambda p: p[0]["engine"]["scheduled_sim_ns"]
    )
    for k, (line, record) in enumerate(order):
        assert record.server_timings is not None
        waited_ns = scheduled[0] + k * service_ns - line["engine"]["queued_sim_ns"]
        assert record.server_timings.queue_ms == pytest.approx(waited_ns / SPEED / MS, abs=1e-9)
    assert order[0][1].server_timings.queue_ms == 0.0  # the first is scheduled on arrival
    assert order[-1][1].server_timings.queue_ms > 0.0


def test_metrics_only_when_asked(tmp_path: Path) -> None:
    """Without the flag the stream carries no account (null), unless a request asks with
    X-Sim-Metrics: 1."""
    plans = PlanFactory(prompt_tokens=40, output_tokens=3, deadlines=DEADLINES).at(0.0, 0.05)
    asks = {0: {"X-Sim-Metrics": "1"}}
    records, _ = run(plans, [], tmp_path / "trace.jsonl",
                     headers_for=lambda p: asks.get(p.request_id, {}))  # fmt: skip
    assert records[0].server_timings is not None
    assert records[0].server_timings.queue_ms is not None
    assert records[1].server_timings is None


def test_a_run_on_the_built_in_simulator_keeps_its_account(tmp_path: Path) -> None:
    """`sim: {per_request_metrics: true}` in a workload: the built-in simulator sends its
    account, every ok record keeps it, and summary.json's server_timings_ms sums it up; its
    TTFT (queue + prefill) is never above the client's TTFT from send."""
    import polars as pl
    from click.testing import CliRunner

    from loadgen.cli import cli
    from loadgen.testing.builders import chat_workload, workload_file

    text = chat_workload("acct", rate_per_s=20, requests=8, prompt_tokens=200)
    path = workload_file(tmp_path, text + "sim: {per_request_metrics: true, speed: 4}\n")
    result = CliRunner().invoke(cli, ["run", str(path), "--out", str(tmp_path), "--run-id",
                                      "r", "-q", "--verdict", "point"])  # fmt: skip
    assert result.exit_code == 0, result.output
    frame = pl.read_parquet(tmp_path / "r" / "records.parquet")
    timings = frame["server_timings"].struct.unnest()
    assert timings["prefill_ms"].null_count() == 0
    # at least the prompt's prefill (more if its step also decoded another's token)
    assert (timings["prefill_ms"] >= 200 / PREFILL_TOKENS_PER_S * 1000 / SPEED - 1e-9).all()
    from_send = (frame["first_token_ns"] - frame["sent_ns"]) / MS
    assert (timings["ttft_ms"] <= from_send + 1e-3).all()  # the sim rounds real ns up
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    server = summary["classes"]["chat"]["server_timings_ms"]
    assert server["requests"] == 8
    assert server["queue_ms"]["count"] == 8
