"""Time windows within a run agree with a brute-force count over the raw records."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loadgen.analysis import windows as windows_module
from loadgen.analysis.windows import (
    MAX_WINDOWS,
    MAX_WINDOWS_PER_CLASS,
    MIN_COVERAGE,
    SCHEMA,
    WindowError,
    check_grid,
    default_window_s,
    schedule_end_ns,
    time_windows,
)
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.testing import failed_record, streamed_record
from loadgen.workload.spec import SloTargets

MS = 1_000_000
S = 1_000_000_000


def record(
    request_id: int,
    *,
    intended_ms: int,
    ttft_ms: int = 100,
    gaps_ms: tuple[int, ...] = (10, 10),
    send_lag_ms: int = 0,
    outcome: Outcome = Outcome.OK,
) -> RequestRecord:
    """A request sent `send_lag_ms` late, its first token `ttft_ms` after the send (never before
    it, as on the wire); failed ones end 5 ms after sending, with no chunks."""
    if outcome is not Outcome.OK:
        return failed_record(request_id, intended_ms=intended_ms, outcome=outcome,
                             lag_ms=send_lag_ms, end_after_ms=5.0)  # fmt: skip
    return streamed_record(request_id, intended_ms=intended_ms, ttft_ms=ttft_ms, gaps_ms=gaps_ms,
                           lag_ms=send_lag_ms, from_send=True)  # fmt: skip


def nearest_rank(values: list[float], p: float) -> float | None:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1] if ordered else None


def brute_force(records: list[RequestRecord], start_ns: int, end_ns: int) -> dict[str, object]:
    """One window's figures computed from the records with plain Python."""
    inside = [r for r in records if start_ns <= r.intended_ns < end_ns]
    ok = [r for r in inside if r.outcome is Outcome.OK]
    ttft = [(r.first_token_ns - r.intended_ns) / MS for r in ok]  # type: ignore[operator]
    gaps = [
        (b - a) / MS
        for r in records
        if r.outcome is Outcome.OK
        for a, b in zip(r.chunk_ns, r.chunk_ns[1:], strict=False)
        if start_ns <= b < end_ns
    ]
    flying = [r for r in records if r.sent_ns is not None and r.sent_ns <= end_ns < r.end_ns]  # type: ignore[operator]
    return {
        "requests": len(inside),
        "failed": len(inside) - len(ok),
        "in_flight": len(flying),
        "ttft_p99_ms": nearest_rank(ttft, 99),
        "ttft_p50_ms": nearest_rank(ttft, 50),
        "itl_p99_ms": nearest_rank(gaps, 99),
        "itl_gaps": len(gaps),
    }


def check_against_brute_force(
    records: list[RequestRecord], window_s: float, step_s: float | None
) -> pl.DataFrame:
    windows = time_windows(to_frame(records), window_s=window_s, step_s=step_s)
    for w in windows.iter_rows(named=True):
        start_ns = round(w["window_start_s"] * S)
        expected = brute_force(records, start_ns, start_ns + round(window_s * S))
        for key, value in expected.items():
            if isinstance(value, float):
                assert w[key] == pytest.approx(value), (key, w)
            else:
                assert w[key] == value, (key, w)
    return windows


def test_tumbling_windows_known_answer() -> None:
    """Three 1 s windows: counts by intended time, rates, in-flight at the end, TTFT p99."""
    records = [
        record(0, intended_ms=0, ttft_ms=100),
        record(1, intended_ms=400, ttft_ms=300),
        record(2, intended_ms=900, ttft_ms=200, gaps_ms=(50, 50)),  # ends at 1201 ms
        record(3, intended_ms=1500, outcome=Outcome.REJECTED),
        record(4, intended_ms=2100, ttft_ms=100, send_lag_ms=20),
    ]
    windows = check_against_brute_force(records, 1.0, None)
    assert windows.get_column("window_start_s").to_list() == [0.0, 1.0, 2.0]
    assert windows.get_column("requests").to_list() == [3, 1, 1]
    # the schedule ends one mean gap (2100 / 4 = 525 ms) after the last arrival, at 2.625 s:
    # the last window ran 0.625 s, and its rate is over that part
    assert windows.get_column("covered_s").to_list() == [1.0, 1.0, 0.625]
    assert windows.get_column("arrival_rate_per_s").to_list() == [3.0, 1.0, 1.6]
    assert windows.get_column("in_flight").to_list() == [1, 0, 0]  # request 2 at t = 1 s
    assert windows.get_column("failed").to_list() == [0, 1, 0]
    # TTFT is from the intended time: request 4's 100 ms from its send plus its 20 ms send lag
    assert windows.get_column("ttft_p99_ms").to_list() == [300.0, None, 120.0]
    assert windows.get_column("rejected").to_list() == [0, 1, 0]


def test_itl_gaps_go_to_the_window_where_they_end() -> None:
    """A request whose gaps straddle a window edge splits its gaps between the windows."""
    records = [
        record(0, intended_ms=900, ttft_ms=50, gaps_ms=(40, 30, 200))
    ]  # ends 970, 1000, 1200
    windows = check_against_brute_force(records, 1.0, None)
    assert windows.get_column("itl_gaps").to_list() == [1, 2]
    assert windows.get_column("itl_p99_ms").to_list() == [40.0, 200.0]
    assert windows.get_column("requests").to_list() == [1, 0]


def test_attainment_per_window_uses_the_class_slo() -> None:
    """Attainment is requests meeting every threshold / requests of the window; null when empty."""
    records = [
        record(0, intended_ms=0, ttft_ms=100),
        record(1, intended_ms=100, ttft_ms=400),
        record(2, intended_ms=2500, outcome=Outcome.TIMEOUT_FIRST_TOKEN),
    ]
    windows = time_windows(to_frame(records), slos={"chat": SloTargets(ttft_ms=200)}, window_s=1.0)
    assert windows.get_column("attainment").to_list() == [0.5, None, 0.0]
    assert windows.get_column("met_slo").to_list() == [1, 0, 0]


def test_sliding_windows_count_a_request_in_every_window_covering_it() -> None:
    """With a 2 s window stepping 0.5 s, a request at 1.2 s is in the windows starting 0, 0.5, 1."""
    windows = check_against_brute_force([record(0, intended_ms=1200, ttft_ms=10)], 2.0, 0.5)
    having = windows.filter(pl.col("requests") > 0).get_column("window_start_s").to_list()
    assert having == [0.0, 0.5, 1.0]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5000),  # intended ms
            st.integers(1, 800),  # ttft ms
            st.lists(st.integers(1, 400), max_size=4),  # gaps ms
            st.integers(0, 50),  # send lag ms
            st.sampled_from([Outcome.OK, Outcome.OK, Outcome.REJECTED, Outcome.TIMEOUT_STALL]),
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([(1.0, None), (0.7, None), (2.0, 0.5), (1.5, 1.5), (1.0, 0.3)]),
)
# Found by Hypothesis when the builder put a first token before its own send (TTFT 1 ms from
# intended, sent 50 ms late): such a request ends before it starts and in-flight went to -1.
@example([(0, 1, [], 0, Outcome.OK)] * 4 + [(2451, 1, [], 50, Outcome.OK)], (2.0, 0.5))
def test_windows_agree_with_brute_force(
    rows: list[tuple[int, int, list[int], int, Outcome]], grid: tuple[float, float | None]
) -> None:
    """Counts, in-flight, TTFT and ITL percentiles per window equal a plain-Python recount."""
    records = [
        record(i, intended_ms=t, ttft_ms=ttft, gaps_ms=tuple(g), send_lag_ms=lag, outcome=o)
        for i, (t, ttft, g, lag, o) in enumerate(rows)
    ]
    window_s, step_s = grid
    windows = check_against_brute_force(records, window_s, step_s)
    if step_s is None:  # tumbling: every request in exactly one window
        assert windows.get_column("requests").sum() == len(records)


def test_empty_frame_and_bad_windows() -> None:
    """No records give an empty frame with the schema; a bad window or step is a ValueError."""
    empty = time_windows(to_frame([]))
    assert empty.height == 0
    assert dict(empty.schema) == SCHEMA
    frame = to_frame([record(0, intended_ms=0)])
    for window_s, step_s in ((0.0, None), (-1.0, None), (math.inf, None), (1.0, 2.0), (1.0, 0.0)):
        with pytest.raises(ValueError, match="window"):
            time_windows(frame, window_s=window_s, step_s=step_s)


def constant(
    rate_per_s: float, duration_s: float, *, class_name: str = "chat"
) -> list[RequestRecord]:
    """Constant arrivals at `rate_per_s` from t0 for `duration_s` (gaps of 1/rate), each ok."""
    count = round(rate_per_s * duration_s)
    return [
        streamed_record(i, intended_ms=i * 1000 / rate_per_s, ttft_ms=50, gaps_ms=(10, 10),
                        class_name=class_name)
        for i in range(count)
    ]  # fmt: skip


def test_a_last_window_cut_by_the_schedule_shows_the_true_rate_not_a_dip() -> None:
    """2 req/s for 25 s in 10 s windows: the last window ran 5 s of its 10 and holds 10
    arrivals: 2.0/s over what ran (requests / window would read 1.0/s, a dip that never was)."""
    windows = time_windows(to_frame(constant(2.0, 25.0)), window_s=10.0)
    assert windows.get_column("requests").to_list() == [20, 20, 10]
    assert windows.get_column("covered_s").to_list() == [10.0, 10.0, 5.0]
    assert windows.get_column("arrival_rate_per_s").to_list() == [2.0, 2.0, 2.0]


def test_sliding_windows_are_covered_by_their_overlap_with_the_schedule() -> None:
    """Sliding 10 s windows every 5 s over 25 s at 2 req/s: [20, 30) ran 5 s (2.0/s), and
    [25, 35), wholly after the schedule's end (the drain), has no rate rather than 0."""
    records = constant(2.0, 25.0)
    records[-1] = streamed_record(49, intended_ms=24_500, ttft_ms=3_000)  # ends at 27.5 s
    windows = time_windows(to_frame(records), window_s=10.0, step_s=5.0)
    starts = [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
    assert windows.get_column("window_start_s").to_list() == pytest.approx(starts)
    assert windows.get_column("covered_s").to_list() == [10.0, 10.0, 10.0, 10.0, 5.0, 0.0]
    assert windows.get_column("arrival_rate_per_s").to_list() == [2.0] * 5 + [None]


def test_a_window_the_schedule_barely_entered_has_no_rate() -> None:
    """2 req/s for 21 s: [20, 30) ran 1 s (< a quarter of it) with 2 arrivals: no rate (a
    2.0/s there would rest on two arrivals; 0.2/s would be a dip). The requests still count."""
    windows = time_windows(to_frame(constant(2.0, 21.0)), window_s=10.0)
    last = windows.row(-1, named=True)
    assert last["covered_s"] == pytest.approx(1.0)
    assert MIN_COVERAGE > 1.0 / 10.0
    assert (last["requests"], last["arrival_rate_per_s"]) == (2, None)
    assert windows.get_column("arrival_rate_per_s").to_list()[:2] == [2.0, 2.0]


def test_poisson_arrivals_read_their_rate_in_a_partial_last_window() -> None:
    """Poisson at 4/s for 100 s, 30 s windows: the last window ran ~10 s; its rate is within
    4 standard deviations (sqrt(n) / covered) of 4/s; over the whole window it would be ~1.3."""
    rng = np.random.default_rng(7)
    times = np.cumsum(rng.exponential(1 / 4.0, size=600))
    times = times[times < 100.0]
    records = [streamed_record(i, intended_ms=t * 1000, ttft_ms=50) for i, t in enumerate(times)]
    frame = to_frame(records)
    last = time_windows(frame, window_s=30.0).row(-1, named=True)
    assert last["window_start_s"] == 90.0
    assert 7.5 <= last["covered_s"] <= 12.5  # the schedule's end, estimated: 100 s ± a few gaps
    sd = math.sqrt(last["requests"]) / last["covered_s"]
    assert abs(last["arrival_rate_per_s"] - 4.0) <= 4 * sd
    assert abs(last["requests"] / 30.0 - 4.0) > 4 * sd  # the old reading: a dip


def test_a_class_that_stopped_early_reads_zero_until_the_run_s_schedule_ends() -> None:
    """Class a at 1/s for 10 s, class b at 1/s for 30 s: the run's schedule ends at 30 s,
    so a's windows after 10 s are covered and read 0/s (it really stopped)."""
    frame = to_frame(constant(1.0, 10.0, class_name="a") + [
        dataclasses.replace(r, request_id=100 + r.request_id)
        for r in constant(1.0, 30.0, class_name="b")
    ])  # fmt: skip
    assert schedule_end_ns(frame) == 30 * S
    a = time_windows(frame, window_s=10.0).filter(pl.col("class") == "a")
    assert a.get_column("arrival_rate_per_s").to_list() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("rate_per_s", "duration_s", "expected_s"),
    [
        (4.0, 10.0, 2.0),  # chat-smoke: 40 requests; 1 s windows would hold 4 each
        (4.0, 30.0, 2.0),  # a 30 s smoke run at 4/s: 15 windows of 8 (1 s would hold 4)
        (10.0, 30.0, 1.0),  # 30 windows of 10 requests
        (2.0, 30.0, 5.0),  # 2 s windows would hold 4: 5 s, 6 windows of 10
        (10.0, 600.0, 10.0),  # 10 min: 60 windows at most
        (10.0, 3600.0, 60.0),  # an hour: 60 one-minute windows
        (50.0, 8 * 3600.0, 600.0),  # a nightly 8 h soak: 48 windows of 10 min
        (0.01, 100.0, 1.0),  # one request (ends at 70 ms): one window over the run
        (0.03, 100.0, 120.0),  # three requests, the last ends at 66.7 s: one 120 s window
    ],
)
def test_the_default_window_adapts_to_the_run(
    rate_per_s: float, duration_s: float, expected_s: float
) -> None:
    """The smallest round size with at most 60 windows over the run and 5+ requests per
    window on average (constant arrivals; each request ends 70 ms after it arrives)."""
    count = max(1, round(rate_per_s * duration_s))
    times = np.arange(count) / rate_per_s
    frame = pl.DataFrame(
        {"class": ["chat"] * count, "intended_ns": (times * S).astype(np.int64),
         "end_ns": ((times + 0.07) * S).astype(np.int64)}
    ).with_columns(
        *[pl.lit(None, pl.Int64).alias(c) for c in ("last_token_ns", "first_token_ns", "sent_ns")]
    )  # fmt: skip
    assert default_window_s(frame) == expected_s
    last_ns = int(frame.get_column("end_ns").max())  # type: ignore[arg-type]
    assert last_ns // round(expected_s * S) + 1 <= MAX_WINDOWS  # windows 0 .. last // size


def test_a_run_ending_on_a_window_edge_still_gets_at_most_60_windows() -> None:
    """5/s for 60 s, the last request ending at 60.000 s exactly: 1 s windows would be 61
    (the last moment opens window [60, 61)), so the fit takes 2 s: 31 windows of 10 arrivals."""
    records = [streamed_record(i, intended_ms=i * 200.0, ttft_ms=50.0, gaps_ms=(19.0,))
               for i in range(299)]  # fmt: skip
    records.append(streamed_record(299, intended_ms=59_800.0, ttft_ms=180.0, gaps_ms=(19.0,)))
    frame = to_frame(records)
    assert frame.get_column("end_ns").max() == 60 * S
    assert default_window_s(frame) == 2.0
    windows = time_windows(frame, window_s=2.0)
    assert windows.height == 31
    assert windows.get_column("requests").to_list()[:30] == [10] * 30
    assert time_windows(frame, window_s=1.0).height == 61  # why 1 s is refused


def test_a_grid_past_the_window_bound_is_refused_with_its_count_and_the_least_step() -> None:
    """A run whose last moment is at 10 s: a step of 1 ms makes 10,001 windows, one over the
    bound (refused, saying so and that 1.01 ms is the least step); 1.001 ms makes 9,991 (kept)."""
    frame = to_frame([record(0, intended_ms=0, ttft_ms=9_979)])  # chunks at 9.979, .989, .999 s
    last_ns = 10 * S  # its end: 10 ms after its last chunk
    assert int(frame.get_column("end_ns").max()) == last_ns  # type: ignore[arg-type]
    with pytest.raises(WindowError) as refused:
        time_windows(frame, window_s=0.001)
    message = str(refused.value)
    assert f"into 10,001 windows per class; the report makes at most {MAX_WINDOWS_PER_CLASS:,}" in (
        message)  # fmt: skip
    assert "use a window of at least 0.00101 s" in message
    assert check_grid(frame, last_ns, 0.00101, None) == 9_901
    assert time_windows(frame, window_s=0.001001).height == 9_991
    with pytest.raises(WindowError, match="10,000,000,001 windows per class"):
        time_windows(frame, window_s=1.0, step_s=1e-9)


def test_sliding_windows_past_the_row_bound_are_refused_with_the_rows_they_would_make(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each request and each ITL gap sits in every window covering it: 4 requests of 2 gaps
    (12 events) in 1 s windows every 0.1 s (10 cover a moment) make 120 rows: refused under
    a bound of 100 rows (the least step then 0.125 s: 8 windows, 96 rows), kept at 120."""
    frame = to_frame([record(i, intended_ms=i * 1000) for i in range(4)])
    monkeypatch.setattr(windows_module, "MAX_WINDOW_ROWS", 100)
    with pytest.raises(WindowError) as refused:
        time_windows(frame, window_s=1.0, step_s=0.1)
    assert ("puts each of this run's 4 requests and 8 ITL gaps in 10 windows: 120 rows, over "
            "the 100 the report holds: use a step of at least 0.125 s") in str(refused.value)  # fmt: skip
    assert time_windows(frame, window_s=1.0, step_s=0.125).height > 0
    monkeypatch.setattr(windows_module, "MAX_WINDOW_ROWS", 120)
    assert time_windows(frame, window_s=1.0, step_s=0.1).height == check_grid(
        frame, 3_121 * MS, 1.0, 0.1)  # fmt: skip
