"""Steady-state evidence of a load step: rates, in-flight counts, trends and their bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.analysis.steady import (
    Trend,
    in_flight_means,
    in_flight_spread,
    judged_window,
    steadiness,
    t_quantile,
)
from loadgen.results.records import Outcome, RequestRecord, to_frame

S = 1_000_000_000


@pytest.mark.parametrize(
    ("p", "dof", "expected"),
    [(0.975, 8, 2.306004), (0.999, 8, 4.500791), (0.99, 3, 4.540703), (0.95, 1, 6.313752),
     (0.995, 20, 2.845340)],
)  # fmt: skip
def test_t_quantile_matches_the_tables(p: float, dof: int, expected: float) -> None:
    """Student t quantiles agree with the printed tables to 1e-5."""
    assert t_quantile(p, dof) == pytest.approx(expected, abs=1e-5)


def test_in_flight_means_are_exact_time_averages() -> None:
    """[0, 2) and [1, 3) seconds: slice [0, 1) holds 1, [1, 2) holds 2, [2, 3) holds 1."""
    intended = np.array([0.0, 1.0]) * S
    ended = np.array([2.0, 3.0]) * S
    means = in_flight_means(intended, ended, np.array([0.0, 1.0, 2.0, 3.0]) * S)
    assert means.tolist() == pytest.approx([1.0, 2.0, 1.0])


def test_spread_is_taken_about_the_trend() -> None:
    """A queue growing by one request a second is a staircase about its line (spread
    1/√12, a count's rounding); one alternating between 1 and 3 in flight has a spread of 1."""
    growing = in_flight_spread(np.arange(100.0) * S, np.full(100, np.inf), 0, 100 * S)
    assert growing == pytest.approx(1 / 12**0.5, abs=0.01)
    starts = np.repeat(np.arange(0, 100, 2.0), 2) * S  # two requests every 2 s, each 1 s long
    intended = np.concatenate([starts, [0.0]])  # and one in flight the whole time
    ended = np.concatenate([starts + S, [np.inf]])
    assert in_flight_spread(intended, ended, 0, 100 * S) == pytest.approx(1.0, abs=0.01)


def _record(i: int, intended_s: float, end_s: float | None) -> RequestRecord:
    intended = round(intended_s * S)
    end = None if end_s is None else round(end_s * S)
    return RequestRecord(
        request_id=i, class_name="chat", intended_ns=intended, sent_ns=intended,
        outcome=Outcome.OK if end is not None else Outcome.CANCELLED,
        first_token_ns=None if end is None else intended + (end - intended) // 2,
        end_ns=end, last_token_ns=end,
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 100), st.floats(0.01, 30)), min_size=20, max_size=200),
    st.floats(0, 50),
)
def test_offered_minus_completed_is_the_in_flight_growth(
    requests: list[tuple[float, float]], cut_s: float
) -> None:
    """Over any judged part, offered − completed requests = L(end) − L(cut), exactly."""
    records = [_record(i, at, at + life) for i, (at, life) in enumerate(requests)]
    frame = to_frame(records)
    cut, end = round(cut_s * S), int(frame["intended_ns"].max())  # type: ignore[arg-type]
    if end <= cut:
        return
    steady = steadiness(frame, cut, end)
    window = steady.window_s
    intended = np.array([r.intended_ns for r in records], dtype=np.float64)
    ended = np.array([r.end_ns for r in records], dtype=np.float64)

    def in_flight(t: float) -> int:
        return int(((intended <= t) & (ended > t)).sum())

    offered = round(steady.offered_per_s * window)
    completed = round(steady.completed_per_s * window)
    arrivals_at_cut = int((intended == cut).sum())  # intended exactly at the cut count as judged
    assert offered - completed == in_flight(end) - in_flight(cut) + arrivals_at_cut


def test_a_steady_stream_is_flat_and_a_growing_queue_rises() -> None:
    """Constant arrivals served in 1 s: nothing rises. Arrivals twice as fast as a single
    server can take them: in flight and TTFT both rise beyond their bounds."""
    steady = [_record(i, i * 0.1, i * 0.1 + 1.0) for i in range(600)]
    frame = to_frame(steady)
    cut, end = judged_window(frame, None)
    flat = steadiness(frame, cut, end)
    assert not flat.rising()
    assert flat.completed_share == pytest.approx(1.0, abs=0.02)
    assert flat.lifetime_s == pytest.approx(1.0)
    assert flat.mean_in_flight == pytest.approx(10.0, abs=0.1)
    queue = [_record(i, i * 0.1, (i + 1) * 0.2) for i in range(600)]  # done at 5 req/s
    frame = to_frame(queue)
    cut, end = judged_window(frame, None)
    growing = steadiness(frame, cut, end)
    assert {t.series for t in growing.rising()} == {"in_flight", "ttft_ms"}
    assert growing.completed_share == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize(
    ("rise", "allowance", "floor", "rising"),
    [(5.0, 1.0, 1.0, True), (5.0, 6.0, 1.0, False), (0.5, 0.1, 1.0, False), (2.0, 0.0, 1.0, True)],
)
def test_a_rise_counts_only_beyond_noise_and_one_request(
    rise: float, allowance: float, floor: float, rising: bool
) -> None:
    """Rising means above the noise bound and above one request's worth, both."""
    trend = Trend(series="in_flight", slices=10, start=0.0, rise=rise, allowance=allowance,
                  floor=floor)  # fmt: skip
    assert trend.rising is rising
