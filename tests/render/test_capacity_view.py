"""Capacity's step lines as people read them: plain numbers with units, never an exponent,
a bound said to be open or on a failure, never both at once."""

from __future__ import annotations

from typing import Any

from loadgen.analysis.capacity import ClassFigures, Search, Step
from loadgen.analysis.steady import Steadiness, Trend
from loadgen.render.capacity_axis import LoadAxis
from loadgen.render.capacity_view import bounds_lines, evidence_line, steps_table


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
