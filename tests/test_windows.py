"""Time windows within a run agree with a brute-force count over the raw records."""

from __future__ import annotations

import math

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loadgen.analysis.windows import SCHEMA, time_windows
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
    assert windows.get_column("arrival_rate_per_s").to_list() == [3.0, 1.0, 1.0]
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
