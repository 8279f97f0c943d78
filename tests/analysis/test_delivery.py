"""Delivery: which streams arrived coalesced, from the physics of reads, and how their TPOT and
ITL are judged (unknown unless the path is declared to buffer)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import polars as pl
import pytest

from loadgen.analysis.audit import audit
from loadgen.analysis.delivery import COALESCED_EVENTS, coalesced, delivery, direct_false_share
from loadgen.analysis.objectives import Objective
from loadgen.analysis.slo import per_request
from loadgen.results.records import RequestRecord, to_frame
from loadgen.results.summary import Summary
from loadgen.testing import streamed_record
from loadgen.workload.spec import SloTargets

GAP_MS = 21.6  # the simulator's decode step at its seed parameters: the server's pace


def stream(request_id: int, sizes: Sequence[int], *, gap_ms: float = GAP_MS) -> RequestRecord:
    """A stream whose reads carried `sizes` events each: the events of one read share its
    stamp; a read comes as its last event is generated (events `gap_ms` apart)."""
    gaps: list[float] = []
    for index, size in enumerate(sizes):
        gaps += [gap_ms * size if index else 0.0] + [0.0] * (size - 1)
    return streamed_record(request_id, intended_ms=1000.0 * request_id, gaps_ms=gaps[1:])


def is_coalesced(sizes: Sequence[int]) -> bool:
    frame = to_frame([stream(0, sizes)])
    return bool(frame.select(coalesced()).item())


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([1] * 32, False),  # direct: one event per read
        ([1, 1, 1, 1, 1, 23, 1, 1, 1, 1], False),  # a 500 ms stall of the reader, once
        ([2, 1, 3, 1, 2, 1, 1, 2, 3, 1, 1], False),  # a busy reader: a few events together
        ([32], True),  # the whole response in one read
        ([19, 16, 16, 16, 16, 16, 16, 13], True),  # 4 KiB blocks of ~250-byte events
        ([1, 16], True),  # half of its reads carried 4+
        ([1, 1, 16], False),  # a third did
        ([3], False),  # fewer events than a coalesced read: nothing to tell
        ([4], True),
        ([1, 1, 1, 1, 1, 1, 1, 5, 5, 5, 5, 5, 5, 5], True),  # 1 KiB blocks, half the stream
    ],
)
def test_a_stream_is_coalesced_when_half_its_reads_carry_four_events(
    sizes: list[int], expected: bool
) -> None:
    """The rule on read patterns seen through real paths: direct, stalled and busy readers
    are paced; a whole response and blocks are coalesced; a minority of big reads is not."""
    assert is_coalesced(sizes) is expected


def test_direct_false_share_is_the_binomial_tail() -> None:
    """The chance a direct stream is called coalesced is P(Binomial(R, q) >= R/2), checked
    against sums written out (R = 4 at q = 1/2: 11/16; R = 10 at 1 %)."""
    assert direct_false_share(4, 0.5) == pytest.approx(11 / 16)
    by_hand = sum(math.comb(10, k) * 0.01**k * 0.99 ** (10 - k) for k in range(5, 11))
    assert direct_false_share(10, 0.01) == pytest.approx(by_hand, rel=1e-9)
    assert direct_false_share(10, 0.01) < 1e-7
    assert (direct_false_share(5, 0.0), direct_false_share(5, 1.0)) == (0.0, 1.0)


def late_reads(events: int, gap_ms: float, mean_late_ms: float, rng: random.Random) -> list[int]:
    """A direct path's reads: events arrive `gap_ms` apart; after each read the reader is back
    after an exponential lateness (mean `mean_late_ms`) counted from the next arrival, and
    reads everything that arrived by then."""
    sizes, index = [], 0
    while index < events:
        late_ms = rng.expovariate(1.0 / mean_late_ms)
        size = min(events - index, 1 + math.floor(late_ms / gap_ms))
        sizes.append(size)
        index += size
    return sizes


@pytest.mark.parametrize("mean_late_ms", [5.0, GAP_MS])
def test_a_late_direct_reader_is_never_called_coalesced(mean_late_ms: float) -> None:
    """Reads of a direct path whose reader is late by an exponential time (mean 5 ms, the lag
    bound, or as long as a token gap): a read carries 4+ events with probability
    q = exp(−3g/m) (measured over 100,000 events within 4 sd of its binomial spread), and
    none of 2,000
    streams of 32 events is called coalesced, as the binomial tail bounds (< 1e-6 each)."""
    rng = random.Random(7)
    streams = [late_reads(32, GAP_MS, mean_late_ms, rng) for _ in range(2000)]
    q = math.exp(-3 * GAP_MS / mean_late_ms)
    reads = late_reads(100_000, GAP_MS, mean_late_ms, rng)  # one long stream: no cut ends
    big = sum(size >= COALESCED_EVENTS for size in reads)
    spread = 4 * math.sqrt(len(reads) * q * (1 - q)) + 1
    assert abs(big - len(reads) * q) <= spread
    assert direct_false_share(min(len(s) for s in streams), q) < 1e-6
    assert not any(is_coalesced(sizes) for sizes in streams[:200])  # the rule itself
    frame = to_frame([stream(i, sizes) for i, sizes in enumerate(streams)])
    assert int(frame.select(coalesced().sum()).item()) == 0


def block_reads(sizes_bytes: Sequence[int], block: int) -> list[int]:
    """Reads behind a proxy that forwards `block`-byte blocks (0: the whole response): an
    event arrives in the read that holds its last byte."""
    if not block:
        return [len(sizes_bytes)]
    reads: list[int] = []
    written, released, count = 0, 0, 0
    for size in sizes_bytes:
        written += size
        count += 1
        if written - released >= block:
            released += block * ((written - released) // block)
            reads.append(count)
            count = 0
    return [*reads, count] if count else reads


@pytest.mark.parametrize("block", [4096, 0])
def test_a_block_or_whole_response_buffer_is_always_called_coalesced(block: int) -> None:
    """Events of 180–400 bytes (chat chunks of any server) behind a 4 KiB-block proxy
    arrive 10–22 to a read, and a whole response in one: every stream of 12–256 events is
    coalesced."""
    rng = random.Random(11)
    records = []
    for i in range(300):
        events = [rng.randint(180, 400) for _ in range(rng.randint(12, 256))]
        records.append(stream(i, block_reads(events, block)))
    frame = to_frame(records)
    assert int(frame.select(coalesced().sum()).item()) == len(records)


def test_the_delivery_block_counts_reads_events_and_tokens() -> None:
    """Two direct streams of 4 events and a whole response of 8: 9 reads, 16 events (1.778 a
    read, 8 in the whole one), one coalesced stream of three, carrying half the tokens."""
    frame = to_frame([stream(0, [1, 1, 1, 1]), stream(1, [1, 1, 1, 1]), stream(2, [8])])
    block = delivery(per_request(frame))
    assert (block.streams, block.reads, block.events, block.events_per_read) == (3, 9, 16, 1.778)
    assert (block.events_per_read_max, block.tokens_per_event) == (8.0, 1.0)
    assert (block.coalesced, block.coalesced_share, block.coalesced_token_share) == (
        1, 0.333333, 0.5)  # fmt: skip


def test_reads_of_older_records_come_from_their_stamps() -> None:
    """Records written before reads were counted (no output_reads) count distinct stamps."""
    frame = to_frame([stream(0, [2, 2, 2])]).with_columns(
        pl.lit(None, pl.Int64).alias("output_reads"), pl.lit(None, pl.Int64).alias("output_events")
    )
    block = delivery(per_request(frame))
    assert (block.reads, block.events) == (3, 6)


def judged(records: list[RequestRecord], *, path_buffers: bool = False, **slo: float) -> Summary:
    objectives = {"chat": Objective(name="chat", slo=SloTargets(**slo))}
    return audit(to_frame(records), run_id="t", objectives=objectives, planned=len(records),
                 path_buffers=path_buffers)  # fmt: skip


def test_whole_responses_leave_tpot_and_itl_inconclusive_saying_why() -> None:
    """40 whole responses read TPOT 0 and ITL 0 (the old MET): both checks are INCONCLUSIVE
    (exit 7), naming the coalesced streams; TTFT, what the users behind it see, is judged."""
    records = [stream(i, [32]) for i in range(40)]
    summary = judged(records, ttft_ms=2000, tpot_ms=50, itl_ms=100, percentile=90)
    checks = {c.metric: c for c in summary.classes["chat"].slo.checks}
    assert checks["ttft_ms"].verdict == "met"
    for metric in ("tpot_ms", "itl_ms"):
        assert (checks[metric].verdict, checks[metric].value_ms) == ("inconclusive", 0.0)
        assert "40 of 40 streams arrived coalesced" in (checks[metric].note or "")
    assert (summary.verdict.status, summary.verdict.exit_code) == ("inconclusive", 7)
    assert summary.classes["chat"].delivery.coalesced_share == 1.0


def test_a_declared_buffering_path_is_judged_as_observed() -> None:
    """With path_buffers the same records are judged as they arrived: MET, exit 0, the TPOT
    and ITL checks and the delivery block saying the path was declared to buffer."""
    records = [stream(i, [32]) for i in range(40)]
    summary = judged(records, path_buffers=True, ttft_ms=2000, tpot_ms=50, itl_ms=100,
                     percentile=90)  # fmt: skip
    assert (summary.verdict.status, summary.verdict.exit_code) == ("met", 0)
    assert summary.classes["chat"].delivery.path_buffers is True
    for check in summary.classes["chat"].slo.checks[1:]:
        assert "judged as observed, as target.path_buffers says" in (check.note or "")


def test_a_few_coalesced_streams_among_direct_ones_change_no_verdict() -> None:
    """One whole response among 59 direct streams at 21.6 ms: ranked worst it is one of the
    six a p90 of 60 may lose: TPOT and ITL stay MET, the note names it."""
    records = [stream(i, [1] * 32) for i in range(59)] + [stream(59, [32])]
    summary = judged(records, tpot_ms=50, itl_ms=100, percentile=90)
    checks = summary.classes["chat"].slo.checks
    assert [c.verdict for c in checks] == ["met", "met"]
    assert all("1 of 60 streams arrived coalesced" in (c.note or "") for c in checks)


def test_a_pace_missed_by_the_direct_streams_is_missed_whatever_the_coalesced_were() -> None:
    """30 direct streams at 80 ms a token and 10 whole responses against a 50 ms TPOT: even
    with the 10 at 0 ms the p50's lower bound is 80 ms: MISSED, not INCONCLUSIVE."""
    records = [stream(i, [1] * 16, gap_ms=80.0) for i in range(30)]
    records += [stream(30 + i, [16], gap_ms=80.0) for i in range(10)]
    summary = judged(records, tpot_ms=50, percentile=50)
    (check,) = summary.classes["chat"].slo.checks
    assert (check.verdict, check.low_ms) == ("missed", 80.0)
    assert summary.verdict.exit_code == 2


def test_the_checks_would_have_passed_without_the_rule() -> None:
    """The failing case of before: the same whole responses without the delivery rule (as
    declared buffering judges them) were MET: the rule is what makes them inconclusive."""
    records = [stream(i, [32]) for i in range(40)]
    before = judged(records, path_buffers=True, tpot_ms=50, percentile=90)
    after = judged(records, tpot_ms=50, percentile=90)
    assert (before.verdict.exit_code, after.verdict.exit_code) == (0, 7)
