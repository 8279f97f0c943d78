"""Known-answer tests of the TTFT split: records with a known split give exactly that split,
and the seed's physics (8,000 tok/s prefill, M/M/1 queueing, the simulator's engine) give
the queue and prefill the arithmetic says."""

from __future__ import annotations

import math
import random

import polars as pl
import pytest

from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.analysis.slo import per_request
from loadgen.analysis.split import BAND, MIN_HALF, PART_COLUMNS, SOURCE, band, with_split
from loadgen.results.records import Outcome, RequestRecord, ServerTimings, to_frame
from loadgen.results.summary import SplitPoint, Summary, TtftSplit
from loadgen.sim.engine import EngineConfig, SeqRequest, simulate
from loadgen.testing import failed_record, split_record, streamed_record
from loadgen.workload.spec import SloTargets

PREFILL_RATE = 8000.0  # the seed's prefill tok/s
PROMPT = 2000  # the seed's typical prompt: 2000 / 8000 = 250 ms of prefill


def summary(records: list[RequestRecord], joined: pl.DataFrame | None = None,
            **targets: float) -> Summary:  # fmt: skip
    """The audit of `records` as one chat class with `targets`."""
    slo = SloTargets(**targets)  # type: ignore[arg-type]
    return audit(to_frame(records), run_id="split", planned=len(records), joined=joined,
                 objectives={"chat": Objective(name="chat", slo=slo)})  # fmt: skip


def point(percentile: float | None, requests: int, **parts: float) -> SplitPoint:
    """A split point from its parts (the rest 0), its TTFT their sum, its cause the largest."""
    full = {"send_lag_ms": 0.0, "outside_ms": 0.0, "intake_ms": 0.0, "queue_ms": 0.0,
            "prefill_ms": 0.0, **parts}  # fmt: skip
    return SplitPoint(percentile=percentile, requests=requests, ttft_ms=sum(full.values()),
                      cause=max(full, key=lambda k: full[k]), **full)  # fmt: skip


def test_one_request_splits_into_exactly_its_parts() -> None:
    """A request sent 2 ms late whose server said arrival-to-first-token 280 ms, queue 100
    and prefill 150, read 300 ms after the send: 2 + 20 outside + 30 intake + 100 + 150."""
    record = split_record(1, send_lag_ms=2, outside_ms=20, intake_ms=30, queue_ms=100,
                          prefill_ms=150)  # fmt: skip
    rows = per_request(to_frame([record]))
    parts = rows.select(*PART_COLUMNS).row(0)
    assert parts == (2.0, 20.0, 30.0, 100.0, 150.0)
    assert sum(parts) == rows.item(0, "ttft_ms") == 302.0
    assert rows.item(0, SOURCE) == "stream"


def test_without_an_arrival_based_ttft_the_server_ttft_is_queue_plus_prefill() -> None:
    """vLLM's in-band metrics give queue and prefill, no TTFT from arrival: intake is 0 and
    the rest of the client's TTFT from send is outside the engine."""
    record = split_record(1, outside_ms=7, queue_ms=40, prefill_ms=250)
    split = summary([record]).classes["chat"].ttft_split
    assert split.p50 == point(50.0, 1, outside_ms=7, queue_ms=40, prefill_ms=250)


def test_percentiles_split_the_band_of_requests_ranked_near_them() -> None:
    """200 requests queued 0..199 ms, prefill 150, outside 10: p50 averages ranks 98-102
    (queue 99: prefill the cause), p90 ranks 178-182 (queue 179: queueing the cause), p99
    ranks 196-200 (queue 197); the 59 over a 300 ms threshold queued 141..199 (mean 170)."""
    records = [split_record(i, outside_ms=10, queue_ms=float(i), prefill_ms=150,
                            intended_ms=10.0 * i) for i in range(200)]  # fmt: skip
    split = summary(records, ttft_ms=300, percentile=90).classes["chat"].ttft_split
    assert split == TtftSplit(
        requests=200, ok=200, from_spans=0,
        p50=point(50.0, 5, outside_ms=10, queue_ms=99, prefill_ms=150),
        p90=point(90.0, 5, outside_ms=10, queue_ms=179, prefill_ms=150),
        p99=point(99.0, 5, outside_ms=10, queue_ms=197, prefill_ms=150),
        at_target=point(90.0, 5, outside_ms=10, queue_ms=179, prefill_ms=150),
        breaching=point(None, 59, outside_ms=10, queue_ms=170, prefill_ms=150),
    )  # fmt: skip
    assert (split.p50 and split.p50.cause, split.p90 and split.p90.cause) == (
        "prefill_ms", "queue_ms")  # fmt: skip


@pytest.mark.parametrize(
    ("n", "percentile", "expected"),
    [(1, 99.0, (0, 1)), (100, 90.0, (87, 92)), (200, 50.0, (97, 102)),
     (1000, 99.0, (984, 995)), (1000, 100.0, (994, 1000)), (3, 50.0, (0, 3))],
)  # fmt: skip
def test_the_band_is_the_nearest_rank_and_half_a_percent_either_side(
    n: int, percentile: float, expected: tuple[int, int]
) -> None:
    """The band's [start, stop): rank ceil(p·n/100), ±max(⌊n/200⌋, 2) ranks, within the rows."""
    assert (BAND, MIN_HALF) == (0.005, 2)
    assert band(n, percentile) == expected


def test_failures_and_requests_the_server_did_not_account_for_are_not_split() -> None:
    """Of 4 requests, a rejected one and an ok one with no server fields (or prefill alone,
    as llama.cpp says it) are not split: 1 of 3 ok requests is, and says so."""
    records = [
        split_record(1, outside_ms=5, queue_ms=10, prefill_ms=100),
        streamed_record(2, ttft_ms=90),
        streamed_record(3, ttft_ms=90, server_timings=ServerTimings(prefill_ms=80)),
        failed_record(4, outcome=Outcome.REJECTED),
    ]
    split = summary(records).classes["chat"].ttft_split
    assert (split.requests, split.ok, split.from_spans) == (1, 3, 0)
    assert split.p99 == point(99.0, 1, outside_ms=5, queue_ms=10, prefill_ms=100)
    assert (split.at_target, split.breaching) == (None, None)


def test_a_class_without_the_servers_account_has_an_empty_split() -> None:
    """No server fields: nothing split, every point null, the ok count kept."""
    split = summary([streamed_record(i) for i in range(5)]).classes["chat"].ttft_split
    assert split == TtftSplit(requests=0, ok=5, from_spans=0, p50=None, p90=None, p99=None,
                              at_target=None, breaching=None)  # fmt: skip


def test_a_joined_span_is_preferred_to_the_streams_account_whole() -> None:
    """Requests 0-1 have a span (queue 120, prefill 130, TTFT from arrival 260) and a stream
    account (queue 100, prefill 150): the span's fields are taken whole (intake 10), request
    2's stream account is kept, and 2 of the 3 are counted from spans."""
    records = [split_record(i, outside_ms=50, queue_ms=100, prefill_ms=150) for i in range(3)]
    joined = pl.DataFrame({"request_id": [0, 1, 2], "queue_ms": [120.0, 120.0, None],
                           "prefill_ms": [130.0, 130.0, None], "ttft_ms": [260.0, 260.0, None],
                           "joined_by": ["trace_id", "request_id", None]})  # fmt: skip
    rows = with_split(per_request(to_frame(records)), joined)
    assert rows.get_column(SOURCE).to_list() == ["span", "span", "stream"]
    assert rows.select(PART_COLUMNS).rows() == [
        (0.0, 40.0, 10.0, 120.0, 130.0), (0.0, 40.0, 10.0, 120.0, 130.0),
        (0.0, 50.0, 0.0, 100.0, 150.0)]  # fmt: skip
    split = summary(records, joined).classes["chat"].ttft_split
    assert (split.requests, split.from_spans) == (3, 2)


def mm1_wait_ms(q: float, rho: float, service_ms: float) -> float:
    """The M/M/1 FCFS waiting time's q-quantile: P(W > t) = ρ·e^{−(μ−λ)t}, 0 below 1 − ρ."""
    if q <= 1.0 - rho:
        return 0.0
    return math.log(rho / (1.0 - q)) / ((1.0 - rho) / service_ms)


@pytest.mark.parametrize("rho", [0.15, 0.3, 0.5, 0.9])
def test_mm1_queueing_gives_the_seeds_queue_quantiles_and_prefill(rho: float) -> None:
    """Requests of the seed's 2,000-token prompt (prefill 2000/8000 = 250 ms) waiting as an
    M/M/1 queue whose service is that prefill: each percentile's queue lies between the
    waiting time's quantiles at its band's edges, prefill is 250 ms, and queueing is the
    cause at p90 when its wait ln(ρ/0.1)·S/(1 − ρ) passes S (from ρ ≈ 0.22 on)."""
    n, service_ms = 1000, PROMPT / PREFILL_RATE * 1000
    waits = [mm1_wait_ms((i + 0.5) / n, rho, service_ms) for i in range(n)]
    records = [split_record(i, outside_ms=3, queue_ms=round(w, 3), prefill_ms=service_ms)
               for i, w in enumerate(waits)]  # fmt: skip
    split = summary(records).classes["chat"].ttft_split
    for p, found in ((50.0, split.p50), (90.0, split.p90), (99.0, split.p99)):
        assert found is not None
        low, high = (mm1_wait_ms(q / 100, rho, service_ms) for q in (p - 0.6, p + 0.6))
        assert low - 0.001 <= found.queue_ms <= high + 0.001, (p, found.queue_ms, low, high)
        assert (found.prefill_ms, found.outside_ms) == (250.0, 3.0)
    assert split.p90 is not None
    queue_wins = math.log(rho / 0.1) / (1 - rho) > 1
    assert split.p90.cause == ("queue_ms" if queue_wins else "prefill_ms")
    assert queue_wins == (rho > 0.15)


def simulated_records(rate_per_s: float, n: int, seed: int) -> list[RequestRecord]:
    """Poisson arrivals at `rate_per_s` of 2,000-token prompts and 20-token outputs through
    the simulator's engine (the seed's physics, whole-prompt prefill, in virtual time), each
    recorded with the engine's own account: scheduled at the start of the step that emitted
    its first token, queue = scheduled − arrival, prefill = first token − scheduled; read
    5 ms after it was written (outside the engine)."""
    rng = random.Random(seed)
    arrivals, t_ns = [], 0
    for i in range(n):
        t_ns += int(rng.expovariate(rate_per_s) * 1e9)
        arrivals.append((t_ns, SeqRequest(seq_id=i, prompt_tokens=PROMPT, output_tokens=20)))
    run = simulate(EngineConfig(), arrivals)
    first_step = {}
    for step in run.steps:
        for seq in step.emitted:
            first_step.setdefault(seq, step)
    records = []
    for at_ns, request in arrivals:
        step = first_step[request.seq_id]
        records.append(split_record(
            request.seq_id, intended_ms=at_ns / 1e6, outside_ms=5,
            queue_ms=(step.start_ns - at_ns) / 1e6, prefill_ms=(step.end_ns - step.start_ns) / 1e6,
        ))  # fmt: skip
    return records


def test_on_the_simulators_engine_prefill_is_p_over_8000_and_queueing_grows_to_the_knee() -> None:
    """The engine prefills a 2,000-token prompt in 250 ms when alone (the median request at
    0.2 req/s), and as the rate grows toward its knee (4 req/s: one 250 ms prefill at a
    time) the queue's share of p90 TTFT rises at every step, from under 10 % to most of it."""
    shares = []
    for rate in (0.2, 1.0, 2.0, 3.0, 3.5):
        split = summary(simulated_records(rate, 600, seed=7)).classes["chat"].ttft_split
        assert split.p50 is not None
        assert split.p90 is not None
        if rate == 0.2:
            assert split.p50.prefill_ms == PROMPT / PREFILL_RATE * 1000
        shares.append(split.p90.queue_ms / split.p90.ttft_ms)
    assert shares == sorted(shares), shares
    assert shares[0] < 0.1 < 0.5 < shares[-1], shares


def test_an_in_band_ttft_summed_from_queue_and_prefill_leaves_an_intake_of_zero() -> None:
    """vLLM's in-band TTFT as queue + prefill (0.3 + 0.6 ms of float arithmetic): the
    intake is 0.0 at every point, never a float residue or a negative zero."""
    records = [split_record(i, outside_ms=1, queue_ms=0.3, prefill_ms=0.6, intake_ms=0.0)
               for i in range(3)]  # fmt: skip
    split = summary(records).classes["chat"].ttft_split
    assert split.p50 is not None
    assert str(split.p50.intake_ms) == "0.0"
    assert (split.p50.queue_ms, split.p50.prefill_ms) == (0.3, 0.6)
