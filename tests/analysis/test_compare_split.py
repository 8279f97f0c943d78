"""`compare` says which part of TTFT moved between baseline and current, when the servers
said each request's queue and prefill: a known queue growth is named as queueing, a known
prefill growth as prefill, in the notes and in the JSON."""

from __future__ import annotations

import json

from loadgen.analysis import metrics
from loadgen.analysis.compare import Side, compare_sides, to_json
from loadgen.render.compare_view import render_markdown, split_notes
from loadgen.results.records import RequestRecord, to_frame
from loadgen.testing import split_record, streamed_record
from loadgen.workload.spec import SloTargets

SLOS = {"chat": SloTargets(ttft_ms=1000, percentile=90)}


def side(records: list[RequestRecord], label: str) -> Side:
    """A one-run side of `records`."""
    frame = to_frame(records)
    return Side(label=label, run_ids=(label,), frame=frame,
                duration_s=metrics.run_duration_s(frame))  # fmt: skip


def queued(n: int, *, queue_ms: float, prefill_ms: float) -> list[RequestRecord]:
    """`n` requests each queued `queue_ms`, prefilled `prefill_ms`, 5 ms outside the engine."""
    return [split_record(i, queue_ms=queue_ms, prefill_ms=prefill_ms, outside_ms=5,
                         intended_ms=100.0 * i) for i in range(n)]  # fmt: skip


def test_a_queue_that_grew_is_named_as_the_part_that_moved() -> None:
    """Queue 20 → 600 ms, prefill 250 → 260 at p90: queue moved most → queueing."""
    base, cur = queued(100, queue_ms=20, prefill_ms=250), queued(100, queue_ms=600, prefill_ms=260)
    comparison = compare_sides(side(base, "base"), side(cur, "cur"), slos=SLOS)
    assert split_notes(comparison) == [
        "where chat's TTFT p90 went, baseline → current (100 → 100 requests split): queue 20 → "
        "600 (+580), prefill 250 → 260 (+10), outside the engine 5.0 → 5.0 (+0.0); queue moved "
        "most → queueing: lower the admission limit or add replicas"
    ]
    data = json.loads(json.dumps(to_json(comparison)))["ttft_split"]["chat"]
    assert (data["percentile"], data["baseline"]["queue_ms"], data["current"]["queue_ms"]) == (
        90.0, 20.0, 600.0)  # fmt: skip
    assert "queue moved most" in render_markdown(comparison)


def test_a_prefill_that_grew_is_named_even_when_the_queue_is_larger() -> None:
    """Queue 400 → 380, prefill 250 → 500 (longer prompts): prefill moved most."""
    base, cur = queued(50, queue_ms=400, prefill_ms=250), queued(50, queue_ms=380, prefill_ms=500)
    note = split_notes(compare_sides(side(base, "base"), side(cur, "cur"), slos=SLOS))[0]
    assert "queue 400 → 380 (−20), prefill 250 → 500 (+250)" in note
    assert note.endswith("prefill moved most → prefill: prompt length, prefix caching, the "
                         "prefill chunk budget")  # fmt: skip


def test_a_side_whose_server_said_nothing_is_named_and_neither_says_nothing() -> None:
    """Only the current server said: the note names the silent baseline; neither: no note,
    and the JSON's ttft_split is null."""
    plain = [streamed_record(i, intended_ms=100.0 * i) for i in range(50)]
    one = compare_sides(side(plain, "base"), side(queued(50, queue_ms=1, prefill_ms=2), "cur"),
                        slos=SLOS)  # fmt: skip
    assert split_notes(one) == [
        "where chat's TTFT p90 went, baseline → current: the baseline server said no "
        "request's queue and prefill"
    ]
    neither = compare_sides(side(plain, "base"), side(plain, "cur"), slos=SLOS)
    assert split_notes(neither) == []
    assert to_json(neither)["ttft_split"] is None
