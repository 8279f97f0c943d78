"""The generator-health rule (`analysis.health`): a run falls behind only when the client's
own time could have changed its verdict.

Known answers on the simulator's physics in virtual time (`virtual_server.lagged_frame`): one
server, run once by a quiet client and once by a busy one whose event loop is taken from it
40 ms of every 100 ms (sends due in a block leave at its end, chunks arriving in it are
stamped at its end). The server answers 100 ms after each send (a 1,000-token prompt at
10,000 tokens/s, 5 ms decode steps, 20 tokens), so the quiet client measures TTFT 100 ms and
TPOT 5 ms exactly; the busy one measures up to 140 ms and its TPOT stamps carry up to
±40/19 ms. Pure-function cases on built records cover the rate the sends kept, client
errors and the strict bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from virtual_server import busy_client, lagged_frame

from loadgen.analysis.audit import audit
from loadgen.analysis.health import RATE_TOLERANCE, health_text
from loadgen.analysis.objectives import Objective
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.summary import Summary
from loadgen.testing import streamed_record
from loadgen.workload import spec as specs
from loadgen.workload.spec import SloTargets

WORKLOAD = """
name: busy
target: {{api: openai-chat, model: sim}}
classes:
  chat:
    arrival: {{process: constant, rate_per_s: 2.3}}
    requests: {requests}
    prompt_tokens: {{dist: fixed, value: 1000}}
    output_tokens: {{dist: fixed, value: 20}}
    slo: {{ttft_ms: {ttft}, tpot_ms: {tpot}, percentile: 90}}
    deadlines: {{first_token_s: 600, stall_s: 600, total_s: 600}}
sim: {{max_batch: 32, decode_step_ms: 5, prefill_tokens_per_s: 10000}}
"""
Late = Callable[[int], int]  # t ↦ how late (ns) the client does what is due at t
QUIET = busy_client(100, 0)
BUSY = busy_client(100, 40)


def judged(
    ttft: float, tpot: float, late: Late, stamp_late: Late | None = None, requests: int = 200
) -> Summary:
    """The audit of the workload at these targets, sent by a client late by `late(t)`."""
    spec = specs.loads(WORKLOAD.format(ttft=ttft, tpot=tpot, requests=requests), "busy.yaml")
    frame = lagged_frame(spec, 1, late, stamp_late)
    objectives = {name: Objective.of(cls) for name, cls in spec.classes.items()}
    return audit(frame, run_id="busy", objectives=objectives, planned=frame.height)


def test_the_server_and_the_clients_are_as_the_module_says() -> None:
    """The quiet client measures the server's 100 ms TTFT and 5 ms TPOT; the busy one sends
    40 % of its requests up to 40 ms late (lag p99 40 ms) and measures up to 140 ms."""
    quiet, busy = judged(1000, 150, QUIET), judged(1000, 150, BUSY)
    checks = {c.metric: c for c in quiet.classes["chat"].slo.checks}
    assert (checks["ttft_ms"].value_ms, checks["tpot_ms"].value_ms) == (100.0, 5.0)
    assert quiet.generator.lag_ms.p99 == 0.0
    assert busy.generator.lag_ms.p99 == pytest.approx(40.0, abs=0.5)
    ttft = next(c for c in busy.classes["chat"].slo.checks if c.metric == "ttft_ms")
    assert 120 < (ttft.value_ms or 0) <= 140.001


@pytest.mark.parametrize("ttft", [1000.0, 140.0])
def test_a_met_that_holds_with_the_lag_charged_stands(ttft: float) -> None:
    """Targets the busy client's 140 ms worst meets: MET, exit 0, the same as the quiet
    client's, though 40 % of its sends left up to 40 ms late (the older rule, more than 1 %
    of sends later than 5 ms, called this run invalid: exit 3)."""
    busy = judged(ttft, 150, BUSY)
    assert judged(ttft, 150, QUIET).verdict.exit_code == 0
    assert busy.verdict.exit_code == 0
    assert busy.generator.fell_behind is False
    assert busy.generator.client is not None
    assert (busy.generator.client.client_out, busy.generator.client.stamps_worst) == ("met",) * 2
    assert health_text(busy.generator).startswith(
        "the client's own time could not change the verdict: send lag p99 40 ms"
    )


def test_a_miss_within_the_lag_it_carries_is_the_clients() -> None:
    """TTFT ≤ 120 ms: the quiet client MET it (the server's 100 ms); the busy client measures
    a MISSED (its p90's lower bound ~127 ms), which its own lag explains: exit 3, the reason
    naming the check, MET with the client's time taken out."""
    assert judged(120, 150, QUIET).verdict.exit_code == 0
    busy = judged(120, 150, BUSY)
    assert busy.classes["chat"].slo.judged == "missed"
    assert busy.verdict.exit_code == 3
    assert busy.verdict.status == "fell_behind"
    reason = busy.generator.reason or ""
    assert "chat TTFT p90: MISSED as measured" in reason
    assert "MET with the client's time taken out" in reason


def test_a_miss_beyond_the_clients_time_is_the_servers() -> None:
    """TTFT ≤ 20 ms: the server's 100 ms misses it by more than any lag and stamp error of
    the busy client (at best 131 − 40 − 40 ms at its p90): MISSED stands, exit 2."""
    busy = judged(20, 150, BUSY)
    assert judged(20, 150, QUIET).verdict.exit_code == 2
    assert busy.verdict.exit_code == 2
    assert busy.generator.fell_behind is False
    assert busy.generator.client is not None
    assert busy.generator.client.client_out == "missed"


def test_a_tpot_met_within_the_stamp_error_is_not_shown() -> None:
    """TPOT ≤ 6 ms: 5 ms measured quietly; the busy client measures 5.26 ms, but its stamps
    may be 40 ms late, ±40/19 = 2.1 ms on a 20-token TPOT, so the MET may be its own: exit
    3. TPOT ≤ 8 ms is beyond that: MET stands."""
    busy = judged(1000, 6, BUSY)
    assert judged(1000, 6, QUIET).verdict.exit_code == 0
    assert busy.verdict.exit_code == 3
    assert "chat TPOT p90: MET as measured" in (busy.generator.reason or "")
    assert "MISSED with its stamps at their worst" in (busy.generator.reason or "")
    assert judged(1000, 8, BUSY).verdict.exit_code == 0


def test_sends_slower_than_scheduled_invalidate_a_met() -> None:
    """A client whose send lag grows 5 % of the schedule (its stamps on time): it offered the
    server 4.8 % less than scheduled, more than the 3 % allowed, so its MET (lag charged)
    may hide a miss at the load asked: exit 3, saying so."""
    growing = judged(1000, 150, lambda t: t // 20, QUIET, requests=40)
    assert growing.generator.rate_shortfall == pytest.approx(1 - 1 / 1.05, abs=1e-3)
    assert (growing.generator.rate_shortfall or 0) > RATE_TOLERANCE
    assert growing.classes["chat"].slo.judged == "met"
    assert growing.verdict.exit_code == 3
    assert "sent 4.8% slower than scheduled" in (growing.generator.reason or "")


def summarize(records: list[RequestRecord], ttft_ms: float, **kwargs: Any) -> Summary:
    """The audit of built records against one TTFT target at p50."""
    objectives = {"chat": Objective(name="chat", slo=SloTargets(ttft_ms=ttft_ms, percentile=50))}
    return audit(to_frame(records), run_id="r", objectives=objectives, planned=len(records),
                 **kwargs)  # fmt: skip


def test_a_miss_at_a_lighter_load_than_asked_stands() -> None:
    """Sends whose lag grows 40 ms over a second (4 % slow) to a server answering 2 s after
    the send, against 100 ms: a miss no lag explains, at a load lighter than asked, is a
    miss at the load asked too: MISSED, exit 2."""
    records = [streamed_record(i, intended_ms=100.0 * i, lag_ms=4.0 * i, ttft_ms=2000.0,
                               from_send=True) for i in range(11)]  # fmt: skip
    summary = summarize(records, 100.0)
    assert (summary.generator.rate_shortfall or 0) > RATE_TOLERANCE
    assert summary.verdict.exit_code == 2


def test_client_errors_and_a_strict_bound_invalidate_whatever_the_verdict() -> None:
    """A request that failed in the client itself, or a lag p99 above a given
    --lag-bound-ms, makes a MET run fall behind; without a bound the same lag stands."""
    on_time = [streamed_record(i, intended_ms=100.0 * i, lag_ms=8.0, from_send=True)
               for i in range(6)]  # fmt: skip
    assert summarize(on_time, 1000.0).verdict.exit_code == 0
    bounded = summarize(on_time, 1000.0, lag_bound_ms=5.0)
    assert bounded.verdict.exit_code == 3
    assert bounded.generator.reason == "the send lag p99 8 ms is above --lag-bound-ms 5"
    broken = [*on_time[:5], replace(on_time[5], outcome=Outcome.CLIENT_ERROR)]
    failed = summarize(broken, 1000.0)
    assert failed.verdict.exit_code == 3
    assert (failed.generator.reason or "").startswith("1 requests failed in the client itself")


def test_a_stopped_run_is_not_judged_by_the_rule() -> None:
    """An interrupted run has no verdict for the client to change: no effect is recorded."""
    records = [streamed_record(i, intended_ms=100.0 * i, lag_ms=80.0) for i in range(6)]
    summary = summarize(records, 10.0, stopped="interrupted")
    assert (summary.generator.client, summary.generator.fell_behind) == (None, False)
    assert summary.verdict.exit_code == 130
