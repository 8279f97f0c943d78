"""Capacity's step lines as people read them: plain numbers with units, never an exponent,
a bound said to be open or on a failure, never both at once; where TTFT went at each step
and which part moved it across the knee."""

from __future__ import annotations

import json
from typing import Any

from loadgen.analysis.audit import audit
from loadgen.analysis.capacity import ClassFigures, Search, Step, class_figures, step_json
from loadgen.analysis.objectives import Objective
from loadgen.analysis.steady import Steadiness, Trend
from loadgen.render.capacity_axis import LoadAxis
from loadgen.render.capacity_view import (
    bounds_lines,
    evidence_line,
    knee_split_lines,
    split_lines,
    steps_table,
)
from loadgen.results.records import to_frame
from loadgen.results.summary import SplitPoint
from loadgen.testing import split_record
from loadgen.workload.spec import SloTargets


def figures(**fields: Any) -> ClassFigures:
    """A chat class at p90 with a 1,000 ms TTFT SLO, judged over 400 requests."""
    base: dict[str, Any] = {
        "requests": 400, "required": 299, "percentile": 90.0, "attainment": 0.5, "met": False,
        "ttft_ms": None, "tpot_ms": None, "ttft_slo_ms": 1000.0, "tpot_slo_ms": None,
        "verdict": "missed", "confidence": 0.95,
    }  # fmt: skip
    return ClassFigures(**{**base, **fields})


def overloaded_step() -> Step:
    """A step whose TTFT from intended fell by 1,110 ms (noise bound 2,800 ms, floor 120 ms)
    and whose in-flight count moved by -0.004 (rounds to zero)."""
    trends = (
        Trend(series="in_flight", slices=10, start=4.0, rise=-0.004, allowance=0.51, floor=1.0),
        Trend(series="ttft_ms", slices=10, start=900.0, rise=-1110.0, allowance=2800.0,
              floor=120.0),
    )  # fmt: skip
    steady = Steadiness(window_s=60.0, offered=600, completed=560, offered_per_s=10.0,
                        completed_per_s=9.33, served_per_s=9.0, lifetime_s=1.5,
                        mean_in_flight=14.0, in_flight_sd=1.2, trends=trends)  # fmt: skip
    return Step(load=2.0, status="fail", requests=600, steady=steady,
                classes={"chat": figures(ttft_ms=1234.0, ttft_low_ms=1100.0)})  # fmt: skip


def test_a_trend_reads_as_plain_numbers_with_their_unit() -> None:
    """`TTFT -1,110 ms (bound 2,800 ms, floor 120 ms)`, not `-1.11e+03 ms (bound 2.8e+03,
    floor 1.2e+02)`; a rise that rounds to zero is `+0.00`, not `-0.00`."""
    line = evidence_line(overloaded_step())
    assert "TTFT -1,110 ms (bound 2,800 ms, floor 120 ms)" in line
    assert "in flight +0.00 (bound 0.51, floor 1.00)" in line
    assert "e+0" not in line
    cells = [str(c) for c in steps_table_rows(overloaded_step())]
    assert "+0.0" in cells
    assert "-1,110" in cells


def steps_table_rows(step: Step) -> list[object]:
    """The cells of the step's row in the steps table."""
    axis = LoadAxis(param="max_in_flight", scale=1.0, unit="", title="max in flight")
    table = steps_table(Search(steps=(step,), highest_pass=None, first_fail=step.load), axis)
    return [next(iter(column.cells)) for column in table.columns]


def test_a_bound_says_open_or_fail_never_open_slash_fail() -> None:
    """A percentile on a failure with its upper bound on one too reads `fail ... 1,100 ms–fail`;
    a bound the sample cannot reach reads `open`; nothing says `open/fail`."""
    on_failure = Step(load=3.0, status="fail", classes={"chat": figures(ttft_low_ms=1100.0)})
    assert bounds_lines(on_failure) == [
        "chat TTFT p90 fail (95% bounds 1,100 ms–fail) ≤ 1,000 ms: missed"
    ]
    few = figures(requests=20, ttft_ms=80.0, ttft_low_ms=70.0, ttft_high_open=True,
                  verdict="inconclusive")  # fmt: skip
    line = bounds_lines(Step(load=1.0, status="undecided", classes={"chat": few}))[0]
    assert line == "chat TTFT p90 80.0 ms (95% bounds 70.0 ms–open) ≤ 1,000 ms: inconclusive"


def split(queue_ms: float, prefill_ms: float, outside_ms: float = 5.0) -> SplitPoint:
    """A p90 split of queue, prefill and outside the engine (their sum the TTFT)."""
    parts = {"queue_ms": queue_ms, "prefill_ms": prefill_ms, "outside_ms": outside_ms}
    return SplitPoint(percentile=90.0, requests=5, ttft_ms=sum(parts.values()), send_lag_ms=0.0,
                      intake_ms=0.0, cause=max(parts, key=lambda k: parts[k]), **parts)  # fmt: skip


def knee_search(below: SplitPoint, above: SplitPoint) -> Search:
    """A pass at 2 req/s and a fail at 3 req/s, each class's TTFT split as given."""
    passed = Step(load=2.0, status="pass", classes={"chat": figures(ttft_split=below)})
    failed = Step(load=3.0, status="fail", classes={"chat": figures(ttft_split=above)})
    return Search(steps=(passed, failed), highest_pass=2.0, first_fail=3.0)


RATE_AXIS = LoadAxis(param="rate", scale=1.0, unit="req/s", title="rate")


def test_each_step_says_where_ttft_went() -> None:
    """A step whose server said: `chat TTFT p90 1,150 ms went to queue 864 (75%), …`."""
    step = Step(load=3.0, status="fail", classes={"chat": figures(ttft_split=split(864, 270, 16))})
    assert split_lines(step) == [
        "chat TTFT p90 1,150 ms went to queue 864 (75%), prefill 270 (23%), outside the engine "
        "16 (1%)"
    ]
    assert split_lines(Step(load=1.0, status="pass", classes={"chat": figures()})) == []


def test_the_knee_names_queueing_when_the_queue_grew_most() -> None:
    """Prefill 250 → 300 and queue 20 → 900 across the knee: queueing broke it."""
    lines = [str(t) for t in knee_split_lines(knee_search(split(20, 250), split(900, 300)),
                                              RATE_AXIS)]  # fmt: skip
    assert len(lines) == 1
    assert lines[0].startswith("where chat's TTFT p90 went across the knee, ")
    assert lines[0].endswith(
        "queue 20 → 900 (+880), prefill 250 → 300 (+50), outside the engine 5.0 → 5.0 (+0.0); "
        "queue moved most → queueing: lower the admission limit or add replicas"
    )


def test_the_knee_names_prefill_when_prefill_grew_most() -> None:
    """Queue 100 → 150 and prefill 250 → 700 (prompts batched into one long prefill step):
    prefill broke it, though queue is not small; the same prompts at a higher load, so it
    points to contention for the prefill steps, not to the prompts' length."""
    line = str(knee_split_lines(knee_search(split(100, 250), split(150, 700)), RATE_AXIS)[0])
    assert line.endswith("prefill moved most → prefill contention: the same prompts took "
                         "longer because other requests' prefill shared their steps (the "
                         "prefill chunk budget, disaggregated prefill, or a lower admission "
                         "limit)")  # fmt: skip
    assert "prompt length" not in line


def test_capacity_json_carries_each_steps_split() -> None:
    """capacity.json's step classes hold the split as an object (JSON-ready)."""
    data = step_json(knee_search(split(20, 250), split(900, 300)).steps[1])
    assert data["classes"]["chat"]["ttft_split"]["queue_ms"] == 900
    assert json.loads(json.dumps(data))["classes"]["chat"]["ttft_split"]["cause"] == "queue_ms"


def test_a_step_judged_from_records_keeps_the_split_at_the_target_percentile() -> None:
    """The class figures of an audited class carry its split at the TTFT target's p90."""
    records = [split_record(i, outside_ms=10, queue_ms=float(i), prefill_ms=150,
                            intended_ms=10.0 * i) for i in range(200)]  # fmt: skip
    slo = SloTargets(ttft_ms=300, percentile=90)
    summary = audit(to_frame(records), run_id="s", planned=200,
                    objectives={"chat": Objective(name="chat", slo=slo)})  # fmt: skip
    found = class_figures(summary.classes["chat"], 200).ttft_split
    assert found is not None
    assert (found.percentile, found.queue_ms, found.prefill_ms) == (90.0, 179.0, 150.0)
