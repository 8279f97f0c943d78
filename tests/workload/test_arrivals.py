"""Arrivals and plans: pure, seeded, monotone, and converging to their stated rate and CV."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.workload.arrivals import class_times_s, schedule
from loadgen.workload.plans import plan_run
from loadgen.workload.spec import loads


def workload(
    arrival: str, count: str = "requests: 2000", lengths: str = "{dist: fixed, value: 5}"
) -> str:
    return f"""
name: t
classes:
  a:
    arrival: {arrival}
    {count}
    prompt_tokens: {lengths}
    output_tokens: {{dist: fixed, value: 3}}
"""


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    """The schedule is a pure function of spec and seed."""
    spec = loads(workload("{process: poisson, rate_per_s: 10}"), "w")
    first, again, other = schedule(spec, 1), schedule(spec, 1), schedule(spec, 2)
    assert first == again
    assert [a.intended_ns for a in first] != [a.intended_ns for a in other]


@settings(max_examples=60, deadline=None)
@given(
    process=st.sampled_from(["constant", "poisson", "gamma"]),
    rate=st.floats(0.1, 500),
    cv=st.floats(0.2, 5),
    n=st.integers(1, 300),
    seed=st.integers(0, 2**40),
)
def test_schedules_are_monotone_and_complete(
    process: str, rate: float, cv: float, n: int, seed: int
) -> None:
    """Every process yields exactly n non-decreasing times starting at start_s."""
    cv_text = f", cv: {cv}" if process == "gamma" else ""
    spec = loads(
        workload(
            f"{{process: {process}, rate_per_s: {rate}{cv_text}, start_s: 1.5}}", f"requests: {n}"
        ),
        "w",
    )
    times = [a.intended_ns for a in schedule(spec, seed)]
    assert len(times) == n
    assert times[0] == 1_500_000_000
    assert all(b >= a for a, b in itertools.pairwise(times))


@pytest.mark.parametrize(("process", "cv"), [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_rate_and_cv_converge(process: str, cv: float) -> None:
    """Mean gap → 1/rate and gap CV → cv, within 6 standard errors of the estimate."""
    n, rate = 40_000, 20.0
    cv_text = f", cv: {cv}" if process == "gamma" else ""
    spec = loads(
        workload(f"{{process: {process}, rate_per_s: {rate}{cv_text}}}", f"requests: {n}"), "w"
    )
    gaps = np.diff(class_times_s(spec.classes["a"], seed=7))
    mean_gap = 1 / rate
    assert abs(gaps.mean() - mean_gap) < 6 * cv * mean_gap / math.sqrt(n)
    # The CV estimate's standard error for gamma gaps is about cv·sqrt((1 + 1.5 cv²)/ n)... bounded loosely:
    sample_cv = gaps.std() / gaps.mean()
    assert abs(sample_cv - cv) < 6 * cv * math.sqrt((1 + 1.5 * cv**2) / n) + 0.01


def test_constant_gaps_are_exact() -> None:
    """A constant process at 4 req/s sends every 250 ms."""
    spec = loads(workload("{process: constant, rate_per_s: 4}", "requests: 5"), "w")
    assert [a.intended_ns for a in schedule(spec)] == [
        0,
        250_000_000,
        500_000_000,
        750_000_000,
        1_000_000_000,
    ]


def test_duration_bounds_the_schedule() -> None:
    """A duration class sends only while t < start + duration, at about rate × duration requests."""
    spec = loads(workload("{process: poisson, rate_per_s: 50, start_s: 2}", "duration_s: 40"), "w")
    times = np.array([a.intended_ns for a in schedule(spec, 3)]) / 1e9
    assert times.min() == 2.0
    assert times.max() < 42.0
    expected = 50 * 40
    assert abs(len(times) - expected) < 6 * math.sqrt(expected)


def test_adding_a_class_keeps_the_other_class_schedule() -> None:
    """Each class has its own random stream: another class does not shift its arrivals."""
    one = loads(workload("{process: poisson, rate_per_s: 5}", "requests: 50"), "w")
    two_text = (
        workload("{process: poisson, rate_per_s: 5}", "requests: 50")
        + """
  b:
    arrival: {process: poisson, rate_per_s: 9}
    requests: 30
    prompt_tokens: {dist: fixed, value: 1}
    output_tokens: {dist: fixed, value: 1}
"""
    )
    two = loads(two_text, "w")
    a_only = [a.intended_ns for a in schedule(one, 4)]
    a_in_two = [a.intended_ns for a in schedule(two, 4) if a.class_name == "a"]
    assert a_only == a_in_two
    ids = [a.request_id for a in schedule(two, 4)]
    assert ids == list(range(80))


@pytest.mark.parametrize(
    ("lengths", "lo", "hi", "mean"),
    [
        ("{dist: uniform, min: 10, max: 20}", 10, 20, 15),
        ("{dist: lognormal, mean: 300, cv: 1.5, min: 1, max: 100000}", 1, 100000, 300),
        ("{dist: exponential, mean: 100, max: 100000}", 1, 100000, 100),
    ],
)
def test_lengths_stay_in_bounds_and_converge(lengths: str, lo: int, hi: int, mean: float) -> None:
    """Sampled token counts respect [min, max] and their mean converges (6 standard errors)."""
    spec = loads(workload("{process: constant, rate_per_s: 100}", "requests: 20000", lengths), "w")
    sizes = np.array([p.prompt_tokens for p in plan_run(spec, 11)])
    assert sizes.min() >= lo
    assert sizes.max() <= hi
    assert abs(sizes.mean() - mean) < 6 * sizes.std() / math.sqrt(len(sizes)) + 0.5


def test_onoff_rate_converges_to_its_duty_cycle_mean() -> None:
    """An on/off process averages (on_rate·on + off_rate·off)/(on + off) over a long run."""
    spec = loads(workload("{process: onoff, on_rate_per_s: 20, off_rate_per_s: 2, on_mean_s: 2, off_mean_s: 6}",
                          "duration_s: 4000"), "w")  # fmt: skip
    times = class_times_s(spec.classes["a"], seed=5)
    mean_rate = (20 * 2 + 2 * 6) / 8  # 6.5 req/s
    # Count variance of an alternating renewal-reward process: per 8 s cycle, the reward's
    # deviation (20 − 6.5)·on + (2 − 6.5)·off has variance 13.5²·2² + 4.5²·6² (exponential
    # periods), plus the Poisson count's own variance (6.5 · 8).
    cycles = 4000 / 8
    sigma = math.sqrt(cycles * (13.5**2 * 4 + 4.5**2 * 36 + 6.5 * 8))
    assert abs(len(times) - mean_rate * 4000) < 6 * sigma
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() > 1.2  # burstier than Poisson


def test_ramp_steps_send_at_each_step_rate() -> None:
    """A ramp sends about rate × duration requests in each of its steps, and stops at its end."""
    spec = loads(workload("{process: ramp, steps: [{rate_per_s: 10, duration_s: 100}, {rate_per_s: 40, duration_s: 100}]}",
                          "requests: 100000"), "w")  # fmt: skip
    times = class_times_s(spec.classes["a"], seed=5)
    first, second = (times < 100).sum(), ((times >= 100) & (times < 200)).sum()
    assert abs(first - 1000) < 6 * math.sqrt(1000)
    assert abs(second - 4000) < 6 * math.sqrt(4000)
    assert times.max() < 200


def test_ramp_without_a_count_runs_its_own_length() -> None:
    """A ramp with neither requests nor duration_s lasts the sum of its steps."""
    spec = loads(workload("{process: ramp, steps: [{rate_per_s: 5, duration_s: 10}]}", ""), "w")
    assert spec.classes["a"].duration_s == 10
