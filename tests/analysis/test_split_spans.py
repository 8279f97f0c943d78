"""The TTFT split prefers the server's spans: a run's split taken again once its spans
arrive (`split_by_spans`), and a run on the simulator that sends only spans is split by
them alone, at the run's end and when `report` re-audits it."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.analysis.audit import audit, split_by_spans
from loadgen.analysis.objectives import Objective
from loadgen.cli import cli
from loadgen.results.records import to_frame
from loadgen.testing import split_record
from loadgen.testing.builders import workload_file
from loadgen.workload.spec import SloTargets


def test_spans_that_arrive_after_the_audit_take_the_split_over() -> None:
    """Four requests whose stream said queue 100 and prefill 150, three of them joined to a
    span saying queue 300, prefill 100 and TTFT 410 from arrival: the split is taken again
    from the spans where joined, at the class's own TTFT target (p50: its band holds all
    four, three by span and one by stream); the rest of the summary is unchanged."""
    records = [split_record(i, outside_ms=50, queue_ms=100, prefill_ms=150, intended_ms=i * 10.0)
               for i in range(4)]  # fmt: skip
    frame = to_frame(records)
    slo = SloTargets(ttft_ms=400, percentile=50)
    before = audit(frame, run_id="r", planned=4, objectives={"chat": Objective(name="chat",
                                                                               slo=slo)})  # fmt: skip
    joined = pl.DataFrame({"request_id": [0, 1, 2, 3], "queue_ms": [300.0, 300.0, 300.0, None],
                           "prefill_ms": [100.0, 100.0, 100.0, None],
                           "ttft_ms": [410.0, 410.0, 410.0, None]})  # fmt: skip
    after = split_by_spans(before, frame, joined)
    split = after.classes["chat"].ttft_split
    assert (split.requests, split.from_spans) == (4, 3)
    assert split.at_target is not None
    assert split.at_target.percentile == 50.0
    # the band holds all four: (3 × 300 + 100) / 4 queue, (3 × 100 + 150) / 4 prefill
    assert (split.at_target.queue_ms, split.at_target.prefill_ms) == (250.0, 112.5)
    assert split.at_target.intake_ms == 7.5  # 3 × 10 ms / 4
    assert split.breaching is None  # every TTFT is 300 ms, under the 400 ms threshold
    assert before.classes["chat"].ttft_split.from_spans == 0
    assert after.classes["chat"].slo == before.classes["chat"].slo


SPEED = 5.0
WORKLOAD = f"""
name: split-by-spans
target: {{api: openai-chat, model: sim}}
sim: {{speed: {SPEED}, max_batch: 1, decode_table: "20"}}
classes:
  chat:
    arrival: {{process: poisson, rate_per_s: 40}}
    requests: 16
    prompt_tokens: {{dist: fixed, value: 800}}
    output_tokens: {{dist: fixed, value: 4}}
    slo: {{ttft_ms: 60000, percentile: 50}}
    deadlines: {{first_token_s: 30, stall_s: 30, total_s: 60}}
"""


@pytest.mark.slow
def test_a_run_whose_server_sends_only_spans_is_split_by_them(tmp_path: Path) -> None:
    """The simulator sends spans, not per-request metrics: every ok request is split by its
    span, each prefill 800/8000 s ÷ 5 = 20 ms (one slot: each prompt alone), at the run's
    end and again when `report` re-audits the folder."""
    workload = workload_file(tmp_path, WORKLOAD)
    out = tmp_path / "runs"
    ran = CliRunner().invoke(cli, ["run", str(workload), "--out", str(out), "--run-id", "r",
                                   "--otlp-receiver", "0", "-q", "--lag-bound-ms", "200"])  # fmt: skip
    assert ran.exit_code == 0, ran.output
    split = json.loads((out / "r" / "summary.json").read_text())["classes"]["chat"]["ttft_split"]
    assert (split["requests"], split["ok"], split["from_spans"]) == (16, 16, 16)
    assert split["p50"]["prefill_ms"] == pytest.approx(20.0, abs=1e-6)
    reported = CliRunner().invoke(cli, ["report", str(out / "r"), "--out", str(tmp_path / "rep")])
    assert reported.exit_code == 0, reported.output
    again = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert again["classes"]["chat"]["ttft_split"] == split
    assert (tmp_path / "rep" / "chat-ttft_split.png").exists()
