"""The span join's known answers: by trace id, then by request id, ambiguity refused,
the join rate and what was left, the clocks placed through the t0 anchor."""

from __future__ import annotations

from typing import Any

import pytest

from loadgen.analysis.join import join_line, join_summary, server_fields
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.runfolder import T0
from loadgen.results.spans import spans_frame

ANCHOR = 1_765_000_000_000_000_000  # t0 on the wall clock


def trace(n: int) -> str:
    return f"{n:032x}"


def traceparent(n: int) -> str:
    return f"00-{trace(n)}-{n + 1:016x}-01"


def record(n: int, outcome: Outcome = Outcome.OK, **kw: Any) -> RequestRecord:
    return RequestRecord(request_id=n, class_name="chat", intended_ns=0,
                         sent_ns=n * 1_000_000, outcome=outcome, **kw)  # fmt: skip


def span(n: int, *, queue_s: float, trace_id: str | None = None, request_id: str | None = None,
         start_ns: int | None = None) -> dict[str, Any]:  # fmt: skip
    start = ANCHOR + n * 1_000_000 + 300_000 if start_ns is None else start_ns
    return {"trace_id": trace_id or trace(1000 + n), "span_id": f"{n:016x}",
            "parent_span_id": None, "name": "llm_request", "service": "vllm",
            "start_unix_ns": start, "end_unix_ns": start + 5_000_000,
            "server_request_id": request_id, "queue_ms": queue_s * 1000, "load_ms": None,
            "prefill_ms": 10.0, "decode_ms": None, "total_ms": None, "ttft_ms": None,
            "itl_ms": None, "prefill_tokens": 100 + n, "decode_tokens": None,
            "cached_tokens": None, "attributes": "{}", "source": "test"}  # fmt: skip


def test_join_by_trace_id_then_request_id() -> None:
    """Record 0 joins by its traceparent, 1 by its response id, 2 by the X-Request-Id it
    sent (vLLM prefixes it with chatcmpl-), 3 has nothing to join; each gets its own span's
    figures, and the span's start lands on the records' clock through the anchor."""
    records = to_frame([
        record(0, traceparent=traceparent(0), request_id_sent="a"),
        record(1, server_request_id="chatcmpl-resp1", request_id_sent="b"),
        record(2, request_id_sent="c"),
        record(3, request_id_sent="d", traceparent=traceparent(3)),
    ])  # fmt: skip
    spans = spans_frame([
        span(0, queue_s=0.5, trace_id=trace(0), request_id="chatcmpl-zzz"),
        span(1, queue_s=0.25, request_id="chatcmpl-resp1"),
        span(2, queue_s=0.125, request_id="chatcmpl-c"),
        span(9, queue_s=9.0, request_id="chatcmpl-other"),  # the preflight's, say
    ])  # fmt: skip
    joined = server_fields(records, spans, anchor_ns=ANCHOR)
    assert joined.get_column("joined_by").to_list() == [
        "trace_id",
        "request_id",
        "request_id",
        None,
    ]
    assert joined.get_column("queue_ms").to_list() == [500.0, 250.0, 125.0, None]
    assert joined.get_column("prefill_tokens").to_list() == [100, 101, 102, None]
    assert joined.get_column("span_start_ns").to_list() == [300_000, 1_300_000, 2_300_000, None]
    summary = join_summary(records, spans, joined, t0=T0(unix_ns=ANCHOR))
    assert (summary.source, summary.ok, summary.ok_joined, summary.join_rate) == (
        "test",
        4,
        3,
        0.75,
    )
    assert (summary.by_trace_id, summary.by_request_id) == (1, 2)
    assert summary.unjoined == {"ok": 1}
    assert summary.unjoined_spans == 1
    assert summary.clocks is not None
    assert summary.clocks.arrival_after_send_ms.p50 == pytest.approx(0.3)
    assert summary.clocks.before_send == 0
    line = join_line(summary)
    assert "3 of 4 ok requests joined (1 by trace id, 2 by request id)" in line
    assert "not joined: 1 ok" in line
    assert "1 request span(s) matched no record" in line


def test_a_shared_request_id_joins_nothing() -> None:
    """A user's --header X-Request-Id gives every request the same id: no span can say
    which request it was, so none joins by it (the trace id still does)."""
    records = to_frame([record(0, request_id_sent="same"), record(1, request_id_sent="same"),
                        record(2, request_id_sent="same", traceparent=traceparent(2))])  # fmt: skip
    spans = spans_frame([span(0, queue_s=0.1, request_id="chatcmpl-same"),
                         span(2, queue_s=0.2, trace_id=trace(2), request_id="chatcmpl-same")])  # fmt: skip
    joined = server_fields(records, spans)
    assert joined.get_column("joined_by").to_list() == [None, None, "trace_id"]
    assert joined.get_column("span_start_ns").null_count() == 3  # no anchor given


def test_the_span_with_server_fields_wins_in_its_trace() -> None:
    """A gateway's span in the same trace carries no server field: the engine's joins."""
    gateway = span(5, queue_s=0.0, trace_id=trace(0)) | {"queue_ms": None, "prefill_ms": None,
                                                         "prefill_tokens": None}  # fmt: skip
    spans = spans_frame([gateway, span(6, queue_s=0.75, trace_id=trace(0))])
    joined = server_fields(to_frame([record(0, traceparent=traceparent(0))]), spans)
    assert joined.get_column("queue_ms").to_list() == [750.0]


def test_failed_requests_count_apart_and_clock_disagreement_shows() -> None:
    """Unjoined requests are counted by outcome; a span that starts before its request was
    sent is a clock difference, counted and said."""
    records = to_frame([record(1, traceparent=traceparent(1)),
                        record(2, Outcome.TIMEOUT_TOTAL, traceparent=traceparent(2)),
                        RequestRecord(request_id=3, class_name="chat", intended_ns=0,
                                      outcome=Outcome.NOT_SENT)])  # fmt: skip
    spans = spans_frame([span(1, queue_s=0.1, trace_id=trace(1), start_ns=ANCHOR)])  # 1 ms early
    joined = server_fields(records, spans, anchor_ns=ANCHOR)
    summary = join_summary(records, spans, joined, t0=T0(unix_ns=ANCHOR))
    assert summary.unjoined == {"timeout_total": 1}  # the unsent request was never the server's
    assert summary.join_rate == 1.0
    assert summary.clocks is not None
    assert summary.clocks.before_send == 1
    assert summary.clocks.arrival_after_send_ms.p50 == pytest.approx(-1.0)
    assert "1 span(s) start before their send" in join_line(summary)


def test_malformed_traceparent_is_no_key() -> None:
    """Only a version-00 traceparent gives a trace id; anything else joins by id or not at all."""
    records = to_frame([record(0, traceparent="01-" + trace(0) + "-0000000000000001-01"),
                        record(1, traceparent="garbage")])  # fmt: skip
    spans = spans_frame([span(0, queue_s=0.1, trace_id=trace(0))])
    joined = server_fields(records, spans)
    assert joined.height == 2
    assert joined.get_column("joined_by").null_count() == 2
