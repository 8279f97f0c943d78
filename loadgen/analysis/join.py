"""The server's spans joined to the client's records, request by request.

`server_fields` is the one function the analysis uses: given a run's records and its spans
(`results.spans`), it returns per record the server's fields (`records.ServerTimings`'
names: ms and token counts) from the span joined to it, and `joined_by` (`trace_id`,
`request_id`, or null). The join:

1. By trace id: the 32 hex digits of the record's `traceparent` (`00-<trace>-<span>-01`)
   against the span's; the server parents its span under the incoming context, so this is
   exact whatever a gateway does to ids, as long as it forwards `traceparent`.
2. Else by request id: the span's `gen_ai.request.id` against the record's
   `server_request_id` (the response's own `id`), or, with the API's prefix (`chatcmpl-`,
   `cmpl-`) taken off, against the id header it sent (`request_id_sent`). Only ids that
   name one record and one span join (a `--header X-Request-Id: ...` gives every request
   the same id: none of them joins by it).

Of a trace's spans, the one carrying server fields joins (vLLM's `llm_request`; a
gateway's own spans carry none); of several, the one carrying the most.

The spans' times are the server's wall clock (unix ns); the records' are ns since t0 on
this host's monotonic clock. run.json's t0 anchor (`measured_unix_ns`, else `unix_ns`)
places a span on the records' clock: `span_start_ns = start_unix_ns - anchor`. How far to
trust that is `join_summary`'s `clocks`: the anchor's own uncertainty and, per joined
request, where the server's arrival stamp fell after the client's send.
"""

from __future__ import annotations

import polars as pl

from loadgen.analysis.metrics import latency_stats, round_ms
from loadgen.results.records import SERVER_TIMING_FIELDS, Outcome
from loadgen.results.runfolder import T0
from loadgen.results.summary import SpanClocks, SpanJoin
from loadgen.units import NS_PER_MS

JOINED_BY = ("trace_id", "request_id")  # the values of `joined_by`, in the order tried
ID_PREFIXES = r"^(chatcmpl|cmpl)-"  # what vLLM puts before the X-Request-Id it was sent
JOINED_COLUMNS = ("request_id", "joined_by", "span_id", *SERVER_TIMING_FIELDS,
                  "span_start_ns", "span_end_ns")  # fmt: skip


def trace_id(traceparent: pl.Expr) -> pl.Expr:
    """The trace id (32 lower-case hex digits) of a W3C `traceparent` value; null when it
    is not one of version 00."""
    value = traceparent.str.to_lowercase()
    return (
        pl.when(value.str.contains(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"))
        .then(value.str.slice(3, 32))
        .otherwise(None)
    )


def anchor_unix_ns(t0: T0) -> int:
    """The wall-clock time of the records' t0: as read when the monotonic clock got there,
    else as chosen."""
    return t0.measured_unix_ns if t0.measured_unix_ns is not None else t0.unix_ns


def _request_spans(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans carrying a server field, one per trace id (the one carrying the most)."""
    said = pl.sum_horizontal(pl.col(f).is_not_null().cast(pl.Int32) for f in SERVER_TIMING_FIELDS)
    return (
        spans.with_columns(said.alias("_said"))
        .filter(pl.col("_said") > 0)
        .sort(["_said", "start_unix_ns"], descending=[True, False])
        .unique("trace_id", keep="first", maintain_order=True)
        .drop("_said")
    )


def _unique(frame: pl.DataFrame, key: str) -> pl.DataFrame:
    """Rows whose non-null `key` no other row shares."""
    keyed = frame.filter(pl.col(key).is_not_null())
    return keyed.filter(pl.col(key).is_unique())


def server_fields(
    records: pl.DataFrame, spans: pl.DataFrame, *, anchor_ns: int | None = None
) -> pl.DataFrame:
    """Per record (`request_id`, in the records' order), the joined span's server fields,
    `joined_by` (`trace_id`, `request_id`, null), its `span_id`, and its start and end on
    the records' clock (`span_start_ns`, `span_end_ns`: ns since t0, null without
    `anchor_ns`, the wall-clock time of t0)."""
    candidates = _request_spans(spans).select(
        "trace_id", "span_id", "server_request_id", "start_unix_ns", "end_unix_ns",
        *SERVER_TIMING_FIELDS,
    )  # fmt: skip
    keyed = records.select(
        "request_id",
        trace_id(pl.col("traceparent")).alias("_trace"),
        pl.col("server_request_id").alias("_server_id"),
        pl.col("request_id_sent").alias("_sent"),
    )
    by_trace = keyed.join(candidates, left_on="_trace", right_on="trace_id", how="inner")
    by_trace = _unique(by_trace, "request_id").with_columns(pl.lit("trace_id").alias("joined_by"))
    rest = candidates.join(by_trace.select("span_id"), on="span_id", how="anti")
    rest = _unique(rest, "server_request_id").with_columns(
        pl.col("server_request_id").str.replace(ID_PREFIXES, "").alias("_bare")
    )
    unjoined = keyed.join(by_trace.select("request_id"), on="request_id", how="anti")
    matches = [
        _unique(unjoined, "_server_id").join(rest, left_on="_server_id",
                                             right_on="server_request_id", how="inner"),
        _unique(unjoined, "_sent").join(rest, left_on="_sent", right_on="_bare", how="inner"),
    ]  # fmt: skip
    columns = ["request_id", "span_id", "start_unix_ns", "end_unix_ns", *SERVER_TIMING_FIELDS]
    by_id = (
        pl.concat([m.select(columns) for m in matches])
        .unique(["request_id", "span_id"])
        .filter(pl.col("request_id").is_unique() & pl.col("span_id").is_unique())
        .with_columns(pl.lit("request_id").alias("joined_by"))
    )
    joined = pl.concat(
        [by_trace.select(*columns, "joined_by"), by_id.select(*columns, "joined_by")]
    )
    offset = pl.lit(anchor_ns, dtype=pl.Int64)
    return (
        records.select("request_id")
        .join(joined, on="request_id", how="left", maintain_order="left")
        .with_columns(
            (pl.col("start_unix_ns") - offset).alias("span_start_ns"),
            (pl.col("end_unix_ns") - offset).alias("span_end_ns"),
        )
        .select(JOINED_COLUMNS)
    )


def span_account(
    records: pl.DataFrame, spans: pl.DataFrame, t0: T0 | None, *, source: str | None = None
) -> SpanJoin:
    """summary.json's `server_spans` for a run's records and spans (`join_summary` of the
    join placed through the run's t0 anchor)."""
    anchor = anchor_unix_ns(t0) if t0 is not None else None
    joined = server_fields(records, spans, anchor_ns=anchor)
    return join_summary(records, spans, joined, t0=t0, source=source)


def join_summary(
    records: pl.DataFrame, spans: pl.DataFrame, joined: pl.DataFrame, *, t0: T0 | None = None,
    source: str | None = None,
) -> SpanJoin:  # fmt: skip
    """summary.json's `server_spans`: the join rate over ok requests, what joined how, what
    could not be joined (requests by outcome, spans no request claimed) and the clocks;
    `source`: the spans' sources, as their `source` column says, else (no span came) the
    `source` asked of."""
    rows = records.select("request_id", "outcome", "sent_ns").join(
        joined.select("request_id", "joined_by", "span_id", "span_start_ns"), on="request_id",
        how="left",
    )  # fmt: skip
    ok = rows.filter(pl.col("outcome") == Outcome.OK.value)
    ok_joined = ok.filter(pl.col("joined_by").is_not_null()).height
    matched = rows.filter(pl.col("joined_by").is_not_null())
    unjoined = rows.filter(pl.col("joined_by").is_null() & pl.col("sent_ns").is_not_null())
    by_outcome = dict(sorted(unjoined.group_by("outcome").len().iter_rows()))
    request_spans = _request_spans(spans)
    claimed = set(matched.get_column("span_id").to_list())
    clocks = None
    if t0 is not None and matched.height:
        lead_ms = (
            matched.filter(pl.col("sent_ns").is_not_null())
            .select((pl.col("span_start_ns") - pl.col("sent_ns")) / NS_PER_MS)
            .to_series()
        )
        anchor_ms = 0.0 if t0.measured_unix_ns is None else abs(t0.measured_unix_ns - t0.unix_ns)
        clocks = SpanClocks(
            anchor_ms=round_ms(anchor_ms / NS_PER_MS) or 0.0,
            arrival_after_send_ms=latency_stats(lead_ms),
            before_send=int((lead_ms < 0).sum()),
        )
    sources = sorted(set(spans.get_column("source").drop_nulls().to_list()))
    return SpanJoin(
        source=", ".join(sources) or source or "unknown",
        spans=spans.height,
        request_spans=request_spans.height,
        ok=ok.height,
        ok_joined=ok_joined,
        join_rate=round(ok_joined / ok.height, 6) if ok.height else None,
        joined=matched.height,
        by_trace_id=matched.filter(pl.col("joined_by") == "trace_id").height,
        by_request_id=matched.filter(pl.col("joined_by") == "request_id").height,
        unjoined={str(k): int(v) for k, v in by_outcome.items()},
        unjoined_spans=request_spans.filter(~pl.col("span_id").is_in(claimed)).height,
        clocks=clocks,
    )


def join_line(join: SpanJoin) -> str:
    """What the terminal says of the join, in one line."""
    if join.ok == 0:
        rate = "no ok request to join"
    else:
        how = f"{join.by_trace_id} by trace id, {join.by_request_id} by request id"
        rate = f"{join.ok_joined} of {join.ok} ok requests joined ({how})"
    parts = [f"server spans ({join.source}): {join.spans} received; {rate}"]
    missing = sum(join.unjoined.values())
    if missing:
        said = ", ".join(f"{n} {outcome}" for outcome, n in join.unjoined.items())
        parts.append(f"not joined: {said}")
    if join.unjoined_spans:
        parts.append(f"{join.unjoined_spans} request span(s) matched no record")
    if join.clocks is not None and join.clocks.arrival_after_send_ms.count:
        clocks = join.clocks
        lead = clocks.arrival_after_send_ms
        clock = f"server arrival {lead.p50:g} ms after the send (p50), "
        clock += f"anchor ±{clocks.anchor_ms:g} ms"
        if clocks.before_send:
            clock += (f"; {clocks.before_send} span(s) start before their send: the server's "
                      "clock differs from this host's by at least that")  # fmt: skip
        parts.append(clock)
    return "; ".join(parts)
