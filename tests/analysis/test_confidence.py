"""The verdict's confidence, by known answers: the sample sizes a percentile needs, the
bounds of small constructed samples, and over 2,000 simulated runs per cell the coverage
of the bounds and the rate of wrong verdicts, against the level they state.

The point-estimate rule is put through the same simulation to show the test can fail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.analysis.confidence import (
    INCONCLUSIVE,
    MET,
    MISSED,
    judge_clustered,
    judge_percentile,
    judge_share,
    one_sided_ranks,
    samples_needed,
    share_bounds,
    worst,
)
from loadgen.testing.coverage import LATENCIES, cell, itl_cell, table


@pytest.mark.parametrize(("p", "level", "needed"), [
    (99.0, 0.95, 299), (90.0, 0.95, 29), (50.0, 0.95, 5), (99.0, 0.99, 459), (95.0, 0.95, 59),
])  # fmt: skip
def test_samples_needed_is_the_smallest_n_with_q_to_the_n_within_the_level(
    p: float, level: float, needed: int
) -> None:
    """0.99^n <= 0.05 first at n = 299; 0.9^n at 29 (the issue's figures), and so on."""
    q = p / 100
    assert samples_needed(p, level) == needed
    assert q**needed <= 1 - level < q ** (needed - 1)
    _, upper = one_sided_ranks(needed, q, level)
    assert upper == needed  # the maximum is the bound exactly at that size
    _, upper = one_sided_ranks(needed - 1, q, level)
    assert upper == needed  # one fewer: the bound is open (beyond the sample)


def test_p100_is_never_bounded_from_above() -> None:
    assert samples_needed(100.0, 0.95) is None
    judged = judge_percentile(np.arange(1.0, 1001.0), 100.0, 5000.0, 0.95)
    assert (judged.verdict, judged.high) == (INCONCLUSIVE, None)
    assert judge_percentile(np.arange(1.0, 1001.0), 100.0, 500.0, 0.95).verdict == MISSED


def test_forty_requests_cannot_meet_a_p99_target_however_fast() -> None:
    """chat-smoke's case: p99 of 40 is their maximum; 67 % of the time the truth is above."""
    fast = np.full(40, 10.0)
    judged = judge_percentile(fast, 99.0, 1000.0, 0.95)
    assert judged.verdict == INCONCLUSIVE
    assert (judged.value, judged.high, judged.needed) == (10.0, None, 299)
    assert judge_percentile(np.full(299, 10.0), 99.0, 1000.0, 0.95).verdict == MET
    assert judge_percentile(fast, 90.0, 1000.0, 0.95).verdict == MET  # p90 needs 29


def test_failures_rank_worst_and_can_miss_from_a_small_sample() -> None:
    """Ten requests, five failed: the p90 is a failure whatever the rest, and so is the
    lower bound (rank 7 of 10): MISSED from 10 samples, where MET would need 29. Three
    failures of ten leave the lower bound on an ok value: inconclusive."""
    assert one_sided_ranks(10, 0.9, 0.95)[0] == 7
    judged = judge_percentile(np.full(5, 5.0), 90.0, 1000.0, 0.95, failures=5)
    assert judged.value == math.inf
    assert judged.verdict == MISSED
    assert judged.low == math.inf
    three = judge_percentile(np.full(7, 5.0), 90.0, 1000.0, 0.95, failures=3)
    assert (three.value, three.low, three.verdict) == (math.inf, 5.0, INCONCLUSIVE)


def test_the_target_inside_the_interval_is_inconclusive() -> None:
    values = np.arange(1.0, 1001.0)  # p50 = 500; its 95 % bounds are ~474 and ~526
    judged = judge_percentile(values, 50.0, 500.0, 0.95)
    assert judged.low is not None
    assert judged.high is not None
    assert judged.low < 500 < judged.high
    assert judged.verdict == INCONCLUSIVE
    assert judged.needed is None
    assert judge_percentile(values, 50.0, judged.high, 0.95).verdict == MET
    assert judge_percentile(values, 50.0, judged.low - 0.5, 0.95).verdict == MISSED


def test_no_values_never_meets() -> None:
    assert judge_percentile(np.array([]), 90.0, 100.0, 0.95).verdict == MISSED
    assert judge_share(0, 0, 0.9, 0.95).verdict == MISSED


def test_worst_of_several_checks() -> None:
    assert worst([MET, MET]) == MET
    assert worst([MET, INCONCLUSIVE]) == INCONCLUSIVE
    assert worst([INCONCLUSIVE, MISSED, MET]) == MISSED


@pytest.fixture(scope="module")
def cells() -> list:
    return table(runs=2000)


def test_the_bounds_cover_the_true_percentile_at_their_level(cells: list) -> None:
    """Every closed bound holds the true percentile in at least `level` of 2,000 runs, up to
    three binomial standard errors (0.015): 3 distributions × 5 sizes × p50/p90/p99."""
    assert len(cells) == 45
    for c in cells:
        floor = c.level - c.allowance()
        if c.upper_closed:
            assert c.upper_covers >= floor, c
        if c.lower_closed:
            assert c.lower_covers >= floor, c
    closed = [c for c in cells if c.upper_closed]
    assert len(closed) == 33  # open: p99 at n = 10, 40, 100 (< 299), p90 at 10 (< 29)


def test_met_and_missed_are_wrong_no_more_often_than_the_level_allows(cells: list) -> None:
    """MET for a target 1 % under the true percentile, MISSED for one 1 % over: each in at
    most 1 - level of the runs (plus binomial error), at every size."""
    for c in cells:
        assert c.met_wrong <= 1 - c.level + c.allowance(), c
        assert c.missed_wrong <= 1 - c.level + c.allowance(), c


def test_the_same_simulation_fails_the_point_estimate_rule(cells: list) -> None:
    """The check can fail: judged by its point estimate, MET for a target the truth misses
    is wrong in a third to 90 % of runs at 10 to 100 requests."""
    small = [c for c in cells if c.n <= 100]
    assert all(c.point_met_wrong > 0.3 for c in small), [
        c for c in small if c.point_met_wrong <= 0.3
    ]


def test_a_bound_one_rank_too_low_would_be_caught() -> None:
    """Taking the order statistic one rank below the upper bound (a plausible off-by-one)
    drops the coverage under the level by more than the allowance: the coverage test has
    the power to see it."""
    latency, n, p, level, runs = LATENCIES[0], 100, 90.0, 0.95, 4000
    generator = np.random.default_rng(7)
    samples = np.sort(latency.draw(generator, (runs, n)), axis=1)
    truth = latency.quantile(p / 100)
    _, upper = one_sided_ranks(n, p / 100, level)
    covers = [float(np.mean(samples[:, rank - 1] >= truth)) for rank in (upper, upper - 2)]
    assert covers[0] >= level - 0.011
    assert covers[1] < level - 0.02, covers
    assert cell(latency, n, p, level, runs, 7).upper_covers == pytest.approx(covers[0])


@pytest.mark.parametrize(("share", "n"), [(0.9, 40), (0.9, 300), (0.99, 100), (0.99, 1000)])
def test_share_bounds_cover_at_their_level(share: float, n: int) -> None:
    """Exact share bounds hold the true share in >= 95 % of 2,000 binomial draws each side."""
    generator = np.random.default_rng(int(share * 1000) + n)
    draws = generator.binomial(n, share, 2000)
    by_count = {int(k): share_bounds(int(k), n, 0.95) for k in np.unique(draws)}
    bounds = np.array([by_count[int(k)] for k in draws])
    allowance = 3 * math.sqrt(0.95 * 0.05 / 2000)
    assert np.mean(bounds[:, 0] <= share) >= 0.95 - allowance
    assert np.mean(bounds[:, 1] >= share) >= 0.95 - allowance


def test_a_share_of_forty_out_of_forty_cannot_claim_99_percent() -> None:
    judged = judge_share(40, 40, 0.99, 0.95)
    assert judged.verdict == INCONCLUSIVE
    assert judged.needed == 299
    assert judge_share(299, 299, 0.99, 0.95).verdict == MET
    assert judge_share(80, 100, 0.9, 0.95).verdict == MISSED


# -- ITL: gaps come in requests, and one request's gaps are alike ----------------------------


@pytest.mark.parametrize(("n", "failures", "p"), [(40, 0, 90.0), (400, 7, 90.0), (300, 2, 99.0)])
def test_one_value_per_group_is_the_plain_order_statistic_rule(
    n: int, failures: int, p: float
) -> None:
    """With one gap per request the clustered rule is `judge_percentile`, bounds and all."""
    values = np.sort(np.random.default_rng(n).exponential(10.0, n))
    plain = judge_percentile(values, p, 25.0, 0.95, failures=failures)
    grouped = judge_clustered(values, n, p, 25.0, 0.95, failures=failures)
    assert (grouped.value, grouped.low, grouped.high, grouped.verdict, grouped.needed) == (
        plain.value, plain.low, plain.high, plain.verdict, plain.needed)  # fmt: skip


def test_the_bounds_count_requests_not_gaps() -> None:
    """20 requests of 30 equal gaps each: 600 gaps would bound a p90 from above (29 values
    would), but they are 20 requests' worth of information, too few: inconclusive, 29
    requests needed; 30 requests of the same gaps are met."""
    per_request = np.linspace(10.0, 20.0, 20)
    gaps = np.sort(np.repeat(per_request, 30))
    assert judge_percentile(gaps, 90.0, 50.0, 0.95).verdict == MET  # as if independent
    judged = judge_clustered(gaps, 20, 90.0, 50.0, 0.95)
    assert (judged.verdict, judged.high, judged.needed) == (INCONCLUSIVE, None, 29)
    more = np.sort(np.repeat(np.linspace(10.0, 20.0, 30), 30))
    assert judge_clustered(more, 30, 90.0, 50.0, 0.95).verdict == MET


def test_a_failed_request_counts_as_a_request_of_worst_gaps() -> None:
    """One failure among 30 requests of 10 gaps: it sits on top as 10 gaps of +inf, so the
    p99 point estimate of the pooled gaps (rank 307 of 310) falls on it, and the upper bound
    (any p99 bound from 31 requests is open) says how many requests are needed."""
    gaps = np.sort(np.repeat(np.linspace(10.0, 20.0, 30), 10))
    judged = judge_clustered(gaps, 30, 99.0, 50.0, 0.95, failures=1)
    assert judged.value == math.inf
    assert (judged.n, judged.high, judged.needed, judged.verdict) == (31, None, 299, INCONCLUSIVE)
    many = judge_clustered(gaps, 30, 90.0, 50.0, 0.95, failures=10)  # a quarter failed
    assert many.verdict == MISSED  # the lower bound is a failure's gap


@pytest.mark.parametrize("n", [40, 100, 300])
def test_clustered_bounds_cover_correlated_gaps_where_pooled_ones_do_not(n: int) -> None:
    """Over 2,000 runs of the slow-request model (`testing.coverage.itl_cell`), the
    clustered upper bound holds the true p90 in at least 95 % of runs (up to binomial
    error) and MET for a target 1 % under the truth is wrong at most 5 %; the same gaps
    judged as if independent cover it in fewer than 80 % of runs and say MET wrongly over
    15 % of the time: the test can fail."""
    c = itl_cell(n, runs=2000, seed=n)
    allowance = 3 * math.sqrt(0.95 * 0.05 / 2000)
    assert c.clustered_covers >= 0.95 - allowance, c
    assert c.clustered_met_wrong <= 0.05 + allowance, c
    assert c.pooled_covers < 0.8, c
    assert c.pooled_met_wrong > 0.15, c


def test_clustered_bounds_are_at_their_level_when_a_requests_gaps_are_equal() -> None:
    """Perfect correlation (each request's 30 gaps one exponential value): the clustered
    lower bound covers the true p90 in 95 % of 4,000 runs, within binomial error either
    way: the rule is exact there, not merely wide."""
    runs, n = 4000, 100
    generator = np.random.default_rng(11)
    values = generator.exponential(200.0, (runs, n))
    truth = -200.0 * math.log(0.1)
    allowance = 3 * math.sqrt(0.95 * 0.05 / runs)
    lows = [judge_clustered(np.sort(np.repeat(v, 30)), n, 90.0, truth, 0.95).low for v in values]
    covered = float(np.mean([low <= truth for low in lows]))  # type: ignore[operator]
    assert 0.95 - allowance <= covered <= 0.95 + 2 * allowance, covered
