"""`run --otlp-receiver` on the built-in simulator: the known-answer join (every ok request
joined, each span's queue and prefill the simulator's own engine times)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.analysis.join import anchor_unix_ns, server_fields
from loadgen.cli import cli
from loadgen.results.runfolder import SIM_TRACE_FILE, SPANS_FILE, read_records, read_run_info
from loadgen.testing.builders import workload_file

SPEED = 5.0
PROMPT = 800
# One batch slot, 800-token prompts (0.1 s of prefill at 8,000 tok/s) and 8 tokens each at
# a flat 20 ms step: ~52 ms a request at 5x, sent every 25 ms on average: a queue builds.
WORKLOAD = f"""
name: spans-known-answer
target: {{api: openai-chat, model: sim}}
sim: {{speed: {SPEED}, max_batch: 1, decode_table: "20"}}
classes:
  chat:
    arrival: {{process: poisson, rate_per_s: 40}}
    requests: 24
    prompt_tokens: {{dist: fixed, value: {PROMPT}}}
    output_tokens: {{dist: fixed, value: 8}}
    slo: {{ttft_ms: 60000, tpot_ms: 60000, percentile: 50}}
    deadlines: {{first_token_s: 30, stall_s: 30, total_s: 60}}
"""


@pytest.mark.slow
def test_every_ok_request_joins_its_span_with_the_engines_times(tmp_path: Path) -> None:
    """Every ok request is joined; each span's queue and prefill equal the simulator's trace
    (scheduled − queued, first token − scheduled, in real ms) to a nanosecond; the run
    says the join and keeps the spans."""
    workload = workload_file(tmp_path, WORKLOAD)
    out = tmp_path / "runs"
    ran = CliRunner().invoke(cli, ["run", str(workload), "--out", str(out), "--run-id", "r",
                                   "--otlp-receiver", "0", "--sim-trace", "--lag-bound-ms", "200"])  # fmt: skip
    assert ran.exit_code == 0, ran.output
    run_dir = out / "r"
    assert "otlp receiver: http://127.0.0.1:" in ran.output
    summary = json.loads((run_dir / "summary.json").read_text())["server_spans"]
    records = read_records(run_dir)
    ok = records.filter(pl.col("outcome") == "ok").height
    assert ok == 24
    assert (summary["ok"], summary["ok_joined"], summary["join_rate"]) == (ok, ok, 1.0)
    assert summary["by_trace_id"] == ok  # each request's own traceparent, under which its span is
    assert f"{ok} of {ok} ok requests joined" in ran.output
    assert summary["clocks"]["before_send"] == 0  # one host: no span starts before its send

    spans = pl.read_parquet(run_dir / SPANS_FILE)
    info = read_run_info(run_dir)
    assert info.t0 is not None
    joined = server_fields(records, spans, anchor_ns=anchor_unix_ns(info.t0))
    lines = [json.loads(line) for line in (run_dir / SIM_TRACE_FILE).read_text().splitlines()]
    served = {r["x_request_id"]: r for r in lines if r["type"] == "request"}
    engine_ms = 1e6 * SPEED
    waited = 0
    for record, row in zip(
        records.iter_rows(named=True), joined.iter_rows(named=True), strict=True
    ):
        line = served[record["request_id_sent"]]
        engine = line["engine"]
        assert row["queue_ms"] == pytest.approx(
            (engine["scheduled_sim_ns"] - engine["queued_sim_ns"]) / engine_ms, abs=1e-9
        )
        assert row["prefill_ms"] == pytest.approx(
            (engine["first_token_sim_ns"] - engine["scheduled_sim_ns"]) / engine_ms, abs=1e-9
        )
        # one slot: each prompt is prefilled alone, P / 8,000 s of engine time
        assert row["prefill_ms"] == pytest.approx(
            line["prompt_tokens"] / 8000 * 1000 / SPEED, abs=1e-6
        )
        assert row["prefill_tokens"] == line["prompt_tokens"] == record["prompt_tokens"]
        assert row["decode_tokens"] == record["output_tokens"] == 8
        # each span starts after its request was sent (the server's door, on one clock)
        assert row["span_start_ns"] >= record["sent_ns"]
        waited += row["queue_ms"] > 0
    assert waited >= 12  # one slot, arrivals twice as fast as service: most waited


@pytest.mark.slow
@pytest.mark.parametrize(
    ("listen", "hint"),
    [("0", "exporting http/protobuf (vLLM exports gRPC by default: listen with grpc:PORT)?"),
     ("grpc:0", "exporting OTLP/gRPC?")],
)  # fmt: skip
def test_a_server_that_sends_no_spans_is_said(
    tmp_path: Path, sim_url: str, listen: str, hint: str
) -> None:
    """A server not told where to send its spans, whichever protocol the receiver speaks:
    the run waits out the grace, says even with -q that none arrived and what to check, and
    its summary says 0 joined, from the receiver."""
    small = WORKLOAD.replace("requests: 24", "requests: 4").replace("sim: {", "# sim: {")
    workload = workload_file(tmp_path, small)
    out = tmp_path / "runs"
    ran = CliRunner().invoke(cli, ["run", str(workload), "--url", sim_url, "--out", str(out),
                                   "--run-id", "r", "-q", "--otlp-receiver", listen,
                                   "--otlp-receiver-grace", "0.5", "--lag-bound-ms", "200"])  # fmt: skip
    assert ran.exit_code in (0, 7), ran.output  # 4 requests may bound no percentile (7)
    assert "otlp receiver: no span arrived at http://127.0.0.1:" in ran.output
    assert hint in " ".join(ran.output.split())  # the terminal may wrap it
    summary = json.loads((out / "r" / "summary.json").read_text())["server_spans"]
    assert (summary["spans"], summary["ok"], summary["ok_joined"]) == (0, 4, 0)
    assert summary["source"] == "receiver"
    assert summary["unjoined"] == {"ok": 4}
