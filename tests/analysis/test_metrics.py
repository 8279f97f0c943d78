"""Known-answer and property tests for the per-request measures and percentile definition."""

from __future__ import annotations

import math

import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.analysis import metrics
from loadgen.percentiles import nearest_rank
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.summary import (
    FailureRankedStats,
    LagStats,
    LatencyStats,
    OutputTokens,
    TokensPerChunk,
)
from loadgen.testing import streamed_record as streamed

MS = 1_000_000


@pytest.mark.parametrize(
    ("percentile", "n", "rank"),
    [
        (50.0, 10, 5),
        (90.0, 10, 9),
        (99.0, 10, 10),
        (99.0, 100, 99),
        (99.0, 101, 100),
        (29.0, 100, 29),
        (99.9, 1000, 999),
        (50.0, 1, 1),
        (0.0, 5, 1),
        (100.0, 7, 7),
    ],
)
def test_nearest_rank(percentile: float, n: int, rank: int) -> None:
    """The rank is ceil(p/100 * n), exact despite float noise, clamped to [1, n]."""
    assert nearest_rank(percentile, n) == rank


@pytest.mark.parametrize(
    ("values", "failures", "ps", "expected"),
    [
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0, (50, 90, 99, 100), [5.0, 9.0, 10.0, 10.0]),
        ([10, 9, 8, 7, 6, 5, 4, 3, 2, 1], 0, (10, 11), [1.0, 2.0]),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 1, (50, 90, 91, 99), [5.0, 9.0, math.inf, math.inf]),
        ([5.0, None, 1.0], 0, (50,), [1.0]),
        ([], 2, (1, 99), [math.inf, math.inf]),
        ([], 0, (50,), [None]),
    ],
)
def test_percentiles_known_answers(
    values: list[float | None], failures: int, ps: tuple[float, ...], expected: list[float | None]
) -> None:
    """Nearest-rank values never interpolate; failures rank as +inf; empty gives None."""
    series = pl.Series(values, dtype=pl.Float64)
    assert metrics.percentiles(series, ps, failures=failures) == expected


@given(
    st.lists(st.floats(0, 1e6, allow_nan=False), max_size=50),
    st.integers(0, 5),
    st.floats(0, 100),
)
def test_a_failure_never_lowers_a_percentile(values: list[float], failures: int, p: float) -> None:
    """Adding one failure to a population never lowers any of its percentiles."""
    series = pl.Series(values, dtype=pl.Float64)
    (before,) = metrics.percentiles(series, (p,), failures=failures)
    (after,) = metrics.percentiles(series, (p,), failures=failures + 1)
    assert after is not None
    assert before is None or after >= before


def test_derive_known_answers() -> None:
    """TTFT from intended and from send, TPOT, E2E, max ITL and lag on one request."""
    record = RequestRecord(
        request_id=1,
        class_name="chat",
        intended_ns=1_000 * MS,
        outcome=Outcome.OK,
        dispatched_ns=1_002 * MS,
        sent_ns=1_010 * MS,
        first_token_ns=1_110 * MS,
        first_content_ns=1_150 * MS,
        last_token_ns=1_410 * MS,
        end_ns=1_420 * MS,
        chunk_ns=(1_110 * MS, 1_150 * MS, 1_350 * MS, 1_410 * MS),
        chunk_tokens=(1, 1, 1, 1),
        output_tokens=4,
    )
    row = metrics.derive(to_frame([record])).row(0, named=True)
    assert row["ttft_ms"] == 110.0
    assert row["ttft_from_send_ms"] == 100.0
    assert row["ttfvt_ms"] == 150.0
    assert row["tpot_ms"] == 100.0  # (1410 - 1110) / (4 - 1)
    assert row["e2e_ms"] == 410.0
    assert row["max_itl_ms"] == 200.0
    assert row["lag_ms"] == 2.0  # dispatched - intended: the generator's own lateness
    assert row["send_lag_ms"] == 10.0


@pytest.mark.parametrize(
    ("output_tokens", "tpot_ms"), [(0, None), (1, None), (2, 300.0), (4, 100.0)]
)
def test_tpot_only_for_more_than_one_token(output_tokens: int, tpot_ms: float | None) -> None:
    """TPOT exists only for N > 1 and is (last - first) / (N - 1)."""
    record = RequestRecord(
        request_id=1,
        class_name="chat",
        intended_ns=0,
        outcome=Outcome.OK,
        first_token_ns=100 * MS,
        last_token_ns=400 * MS,
        end_ns=400 * MS,
        output_tokens=output_tokens,
    )
    assert metrics.derive(to_frame([record])).item(0, "tpot_ms") == tpot_ms


def test_e2e_of_an_ok_response_without_tokens_runs_to_its_end() -> None:
    """An ok response with no output has no TTFT, and its E2E is measured to end_ns."""
    record = RequestRecord(
        request_id=1, class_name="chat", intended_ns=0, outcome=Outcome.OK, end_ns=30 * MS
    )
    row = metrics.derive(to_frame([record])).row(0, named=True)
    assert row["ttft_ms"] is None
    assert row["e2e_ms"] == 30.0


def test_itl_is_over_gaps_not_request_averages() -> None:
    """ITL stats rank individual gaps, which differs from averaging per-request averages."""
    frame = to_frame([streamed(1, gaps_ms=(100.0,)), streamed(2, gaps_ms=(10.0,) * 9)])
    gaps = metrics.itl_gaps_ms(frame, "chat")
    assert gaps.to_list() == [10.0] * 9 + [100.0]
    stats = metrics.latency_stats(gaps)
    assert stats.mean == 19.0
    assert stats.p90 == 10.0
    assert stats.p99 == 100.0
    request_averages = [100.0, 10.0]
    assert sum(request_averages) / 2 == 55.0 != stats.mean


def test_itl_gaps_skip_failed_requests_and_other_classes() -> None:
    """Only ok requests of the asked class contribute gaps."""
    frame = to_frame(
        [
            streamed(1, gaps_ms=(5.0,)),
            streamed(2, gaps_ms=(7.0,), outcome=Outcome.STREAM_ERROR),
            streamed(3, gaps_ms=(9.0,), class_name="agent"),
        ]
    )
    assert metrics.itl_gaps_ms(frame, "chat").to_list() == [5.0]
    assert metrics.itl_gaps_ms(frame, "nobody").len() == 0


def test_latency_stats_empty_population_is_null() -> None:
    """An empty population gives null stats with count 0."""
    stats = metrics.latency_stats(pl.Series([], dtype=pl.Float64))
    assert stats == LatencyStats(
        p50=None, p90=None, p95=None, p99=None, max=None, mean=None, count=0
    )


def test_latency_stats_with_failures_nulls_percentiles_on_failures() -> None:
    """With 1 failure among 10, p50 and p90 are values while p95, p99 and max are failures."""
    values = pl.Series([float(v) for v in range(1, 10)])
    stats = metrics.latency_stats_with_failures(values, failures=1)
    assert stats == FailureRankedStats(
        p50=5.0, p90=9.0, p95=None, p99=None, max=None, count=10, failures=1
    )


def test_tokens_per_chunk_and_output_tokens() -> None:
    """Tokens per chunk and output-token stats come from ok requests only."""
    coalesced = RequestRecord(
        request_id=1,
        class_name="chat",
        intended_ns=0,
        outcome=Outcome.OK,
        first_token_ns=MS,
        last_token_ns=3 * MS,
        end_ns=3 * MS,
        chunk_ns=(MS, 2 * MS, 3 * MS),
        chunk_tokens=(1, 4, 3),
        output_tokens=8,
    )
    failed = RequestRecord(
        request_id=2,
        class_name="chat",
        intended_ns=0,
        outcome=Outcome.TIMEOUT_STALL,
        chunk_ns=(MS,),
        chunk_tokens=(9,),
        output_tokens=9,
    )
    frame = to_frame([coalesced, failed, streamed(3, gaps_ms=(1.0,))])
    assert metrics.tokens_per_chunk(frame) == {"chat": TokensPerChunk(mean=2.0, max=4)}
    ok_tokens = frame.filter(pl.col("outcome") == "ok").get_column("output_tokens")
    assert metrics.output_token_stats(ok_tokens) == OutputTokens(mean=5.0, p50=2, max=8, total=10)


def test_run_duration_spans_first_intended_to_last_end() -> None:
    """Duration is max(end_ns) - min(intended_ns) over every record."""
    frame = to_frame([streamed(1, intended_ms=1000.0), streamed(2, intended_ms=3000.0)])
    assert metrics.run_duration_s(frame) == pytest.approx(2.121)  # 3000 + 100 + 20 + 1 - 1000
    assert metrics.run_duration_s(to_frame([])) == 0.0


def test_a_request_never_sent_does_not_extend_the_duration() -> None:
    """An interrupted run's not_sent records (planned for later) leave the duration at the
    last thing that happened; a run of nothing but not_sent lasted 0 s."""
    never = RequestRecord(request_id=3, class_name="chat", intended_ns=60 * 10**9,
                          outcome=Outcome.NOT_SENT)  # fmt: skip
    frame = to_frame([streamed(1, intended_ms=1000.0), streamed(2, intended_ms=3000.0), never])
    assert metrics.run_duration_s(frame) == pytest.approx(2.121)
    assert metrics.run_duration_s(to_frame([never])) == 0.0


@pytest.mark.parametrize(
    ("times_ns", "rate"),
    [
        ([0, 500 * MS, 1000 * MS], 2.0),
        ([0, 1000 * MS], 1.0),
        ([7], None),
        ([], None),
        ([5, 5], None),
    ],
)
def test_rate_per_s(times_ns: list[int], rate: float | None) -> None:
    """n events over their span give (n - 1) / span; n <= 1 or no span gives None."""
    assert metrics.rate_per_s(pl.Series(times_ns, dtype=pl.Int64)) == rate


@pytest.mark.parametrize(
    ("lags_ms", "bound_ms", "fell_behind"),
    [
        ((0.0, 1.0, 2.0), 5.0, False),
        ((0.0, 6.0, 7.0), 5.0, True),  # a strict bound given: the p99 (7 ms) above it
        ((0.0, 1.0, 6.0), 5.0, True),  # the p99 of three is their maximum
        ((0.0, 6.0, 7.0), 10.0, False),
        ((0.0, 60.0, 70.0), None, False),  # no bound: the lag alone never invalidates a run
    ],
)
def test_generator_health_lag_and_a_strict_bound(
    lags_ms: tuple[float, ...], bound_ms: float | None, fell_behind: bool
) -> None:
    """The lag's p50/p99/max; only a given --lag-bound-ms judges it on its own (p99 > bound)."""
    records = [streamed(i, intended_ms=100.0 * i, lag_ms=lag) for i, lag in enumerate(lags_ms)]
    health = metrics.generator_health(to_frame(records), planned=3, lag_bound_ms=bound_ms)
    assert health.fell_behind is fell_behind
    assert health.lag_ms == LagStats(p50=lags_ms[1], p99=lags_ms[2], max=lags_ms[2])
    assert health.target_rate_per_s == 10.0
    assert (health.planned, health.sent, health.recorded) == (3, 3, 3)


@pytest.mark.parametrize(
    ("lags_ms", "shortfall"),
    [
        ((5.0,) * 20, 0.0),  # late by a constant 5 ms: the schedule's rate, shifted
        (tuple(10.0 * i for i in range(20)), 0.090909),  # 10 ms more each 100 ms: 1/1.1 rate
        ((0.0,) * 19 + (300.0,), None),  # one straggler: well within the trend's noise
    ],
)
def test_the_achieved_rate_is_the_scheduled_one_less_the_lags_trend(
    lags_ms: tuple[float, ...], shortfall: float | None
) -> None:
    """Sends every 100 ms whose lag grows by g per second reach the server at 10/(1 + g)/s."""
    records = [streamed(i, intended_ms=100.0 * i, lag_ms=lag) for i, lag in enumerate(lags_ms)]
    health = metrics.generator_health(to_frame(records), planned=20)
    assert health.target_rate_per_s == 10.0
    assert health.rate_shortfall is not None
    assert health.rate_shortfall_low is not None
    if shortfall is None:  # 300 ms at the end over 1.9 s: the first-to-last span says 14 %
        assert 0 < health.rate_shortfall < 0.05
        assert health.rate_shortfall_low < 0  # one straggler: no trend beyond its scatter
        return
    assert health.rate_shortfall_low == pytest.approx(shortfall, abs=1e-6)  # no scatter
    assert health.rate_shortfall == pytest.approx(shortfall, abs=1e-6)
    assert health.achieved_rate_per_s == pytest.approx(10.0 * (1 - shortfall), abs=1e-3)


def test_generator_health_counts_unsent_requests_without_lag() -> None:
    """A request never sent has no lag, is not counted as sent, and a lone send has no rate."""
    unsent = RequestRecord(
        request_id=2, class_name="chat", intended_ns=MS, outcome=Outcome.CANCELLED
    )
    health = metrics.generator_health(to_frame([streamed(1), unsent]), planned=2)
    assert health.sent == 1
    assert health.recorded == 2
    assert health.achieved_rate_per_s is None
    assert health.lag_ms.max == 0.0
