"""The TTFT split of runs through the simulator with its per-request metrics on: its queue
and prefill parts are the engine's own intervals (its trace), prefill is P/8000 s, and the
parts add up to the client's TTFT. Every server figure is the engine's simulated time ÷ the
speed factor, so the equalities hold whatever the machine's load."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from loadgen.analysis.slo import per_request
from loadgen.analysis.split import PART_COLUMNS, ttft_split
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.run.processes.simulator import running_sim
from loadgen.testing import PlanFactory, run_engine
from loadgen.workload.spec import Deadlines

SPEED = 4.0
MS = 1_000_000
DEADLINES = Deadlines(first_token_s=20, stall_s=10, total_s=30)


def through_sim(
    prompt_tokens: int, at_s: list[float], args: list[str], trace: Path
) -> tuple[list[RequestRecord], dict[str, dict[str, Any]]]:
    """Requests of `prompt_tokens` sent at `at_s` to a simulator at SPEED with its metrics
    on; the records and its trace's request lines by the request id they carried."""
    plans = PlanFactory(prompt_tokens=prompt_tokens, output_tokens=4, deadlines=DEADLINES)
    with running_sim(["--speed", str(SPEED), "--per-request-metrics", *args],
                     trace_file=trace) as sim:  # fmt: skip
        records = run_engine(plans.at(*at_s), sim.url, t0_ns=time.perf_counter_ns() + 50 * MS)
    assert {r.outcome for r in records} == {Outcome.OK}, [r.error for r in records]
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    return records, {x["x_request_id"]: x for x in lines if x["type"] == "request"}


def engine_ms(line: dict[str, Any], start: str, end: str) -> float:
    """An interval of the engine's, from its trace, on the client's clock (ms)."""
    return (line["engine"][end] - line["engine"][start]) / SPEED / MS


def test_a_lone_prompt_splits_into_its_prefill_of_p_over_8000(tmp_path: Path) -> None:
    """One 2,000-token prompt on an idle simulator: queue 0, prefill 2000/8000 s ÷ 4 =
    62.5 ms, the rest of the client's TTFT outside the engine or before the send."""
    (record,), _ = through_sim(2000, [0.0], [], tmp_path / "trace.jsonl")
    split = ttft_split(per_request(to_frame([record])))
    assert split.p50 is not None
    assert (split.requests, split.p50.queue_ms, split.p50.prefill_ms) == (1, 0.0, 62.5)
    assert split.p50.cause == "prefill_ms"
    assert split.p50.outside_ms >= 0


def test_six_at_once_on_one_slot_split_into_the_engines_queue_and_prefill(tmp_path: Path) -> None:
    """Six 400-token prompts at once on a batch of one: each request's queue and prefill
    parts are its trace's (scheduled − queued, first token − scheduled), prefill 400/8000 s
    ÷ 4 = 12.5 ms each, the parts add up to its TTFT, and queueing is the cause at p99."""
    records, served = through_sim(400, [0.0] * 6, ["--max-batch", "1"], tmp_path / "t.jsonl")
    rows = per_request(to_frame(records))
    for record, row in zip(records, rows.iter_rows(named=True), strict=True):
        line = served[str(record.request_id_sent)]
        assert row["split_queue_ms"] == engine_ms(line, "queued_sim_ns", "scheduled_sim_ns")
        assert row["split_prefill_ms"] == engine_ms(line, "scheduled_sim_ns", "first_token_sim_ns")
        assert row["split_prefill_ms"] == pytest.approx(12.5, abs=1e-9)
        assert sum(row[c] for c in PART_COLUMNS) == pytest.approx(row["ttft_ms"], abs=1e-6)
    split = ttft_split(rows)
    assert split.p99 is not None
    assert (split.requests, split.p99.cause) == (6, "queue_ms")
    assert split.p99.queue_ms > 4 * split.p99.prefill_ms
