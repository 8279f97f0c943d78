"""Merging shards: a shard's records move onto the merged run's clock, every time and no other figure."""

from __future__ import annotations

from dataclasses import replace

import polars as pl

from loadgen.results.records import TIME_COLUMNS, Outcome, RequestRecord, to_frame
from loadgen.run.merge import rebase

OFFSET_NS = 1_000_000  # the shard's t0 anchor 1 ms after the agreed start
# Every time on the run clock, as the column table marks them: a time column added to the
# record is checked here with no change to this test.
TIMES = {c.name for c in TIME_COLUMNS}
# The times the record held when merge's re-basing was a list of its own (which left out
# first_reasoning_ns): the table must mark at least these.
KNOWN_TIMES = {
    "intended_ns", "dispatched_ns", "sent_ns", "headers_ns", "first_token_ns",
    "first_content_ns", "first_reasoning_ns", "last_token_ns", "end_ns", "chunk_ns",
}  # fmt: skip


def every_time_set() -> RequestRecord:
    """A reasoning stream with every time on the run clock set, each its own value (a time
    column added later gets one too: 500, 501, ...)."""
    record = RequestRecord(
        request_id=7, class_name="chat", intended_ns=100, outcome=Outcome.OK,
        dispatched_ns=110, sent_ns=120, headers_ns=150, first_token_ns=200,
        first_reasoning_ns=200, first_content_ns=300, last_token_ns=400, end_ns=410,
        chunk_ns=(200, 300, 400), chunk_tokens=(1, 1, 1), output_tokens=3,
        unstamped_max_gap_ns=50,  # a duration, not a time: it must not move
    )  # fmt: skip
    unset = [c for c in TIME_COLUMNS if getattr(record, c.attribute) in (None, ())]
    later = {c.attribute: [500 + i] if c.is_list else 500 + i for i, c in enumerate(unset)}
    return replace(record, **later)


def test_the_column_table_marks_every_known_time() -> None:
    """The table's time columns include every time the record held before the table."""
    assert TIMES >= KNOWN_TIMES, sorted(KNOWN_TIMES - TIMES)


def test_every_time_column_is_rebased_when_runs_merge() -> None:
    """Re-based by +1 ms, every time on the run clock moves by exactly 1 ms (intended_ns 100
    → 1,000,100 and first_reasoning_ns 200 → 1,000,200, so the time to first reasoning token
    is kept) and every other column is unchanged."""
    frame = to_frame([every_time_set()])
    moved = rebase(frame, OFFSET_NS)
    assert moved.item(0, "intended_ns") == 1_000_100
    assert moved.item(0, "first_reasoning_ns") == 1_000_200
    for name in frame.columns:
        before, after = frame.get_column(name), moved.get_column(name)
        assert before.null_count() == 0 or name not in TIMES, f"{name} is not set"
        if name not in TIMES:
            assert after.equals(before), name
        elif before.dtype == pl.List(pl.Int64()):
            assert after.to_list() == [[t + OFFSET_NS for t in before.to_list()[0]]], name
        else:
            assert after.to_list() == [before.item() + OFFSET_NS], name
