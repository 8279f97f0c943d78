"""A run's OTLP receiver (`--otlp-receiver`): started before the target, collected after.

The server exports its spans in batches (vLLM's exporter every 5 s), so after the last
response the run waits for them: until every ok request that carried a `traceparent` or
an id has joined a span, or `--otlp-receiver-grace` seconds have passed, whichever comes
first. Then the spans go into `server-spans.parquet` and the join's account into
summary.json's `server_spans` and onto the terminal.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace

import polars as pl

from loadgen.analysis.audit import split_by_spans
from loadgen.analysis.join import anchor_unix_ns, join_line, server_fields, span_account
from loadgen.engine.logs import LOGGER
from loadgen.engine.otlp_receiver import GRPC, SpanReceiver, parse_address
from loadgen.results.runfolder import RunInfo
from loadgen.results.spans import empty_spans, with_source
from loadgen.results.summary import Summary
from loadgen.results.write import write_spans
from loadgen.run.context import RunContext

POLL_S = 0.25  # how often the grace looks at what has arrived


@contextlib.contextmanager
def span_receiver(run: RunContext) -> Iterator[SpanReceiver | None]:
    """The receiver `--otlp-receiver` asks for, listening (None without it); closed on exit."""
    listen = run.options.otlp_receiver
    if listen is None:
        yield None
        return
    receiver = SpanReceiver(parse_address(listen), run.run_dir)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.close()


def receiver_line(receiver: SpanReceiver, *, simulator: bool) -> str:
    """What the terminal says of the receiver: the address to give the server."""
    if simulator:
        return f"otlp receiver: {receiver.url} (the built-in simulator sends its spans there)"
    if receiver.protocol == GRPC:
        return (f"otlp receiver: {receiver.url} (OTLP/gRPC): start the server with "
                f"--otlp-traces-endpoint {receiver.url} (vLLM's default exporter)")  # fmt: skip
    return (
        f"otlp receiver: {receiver.url} (OTLP/HTTP): start the server with "
        f"--otlp-traces-endpoint {receiver.url} (vLLM: and "
        f"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf, or listen with grpc:PORT)"
    )


def collect_spans(
    receiver: SpanReceiver, run: RunContext, frame: pl.DataFrame, info: RunInfo,
    summary: Summary,
) -> Summary:  # fmt: skip
    """Wait out the grace (see the module docstring), write `server-spans.parquet`, say the
    join, and return `summary` with its `server_spans`."""
    grace_s = run.options.otlp_receiver_grace_s
    anchor = anchor_unix_ns(info.t0) if info.t0 is not None else None
    expected = frame.filter(
        (pl.col("outcome") == "ok")
        & (pl.col("traceparent").is_not_null() | pl.col("request_id_sent").is_not_null()
           | pl.col("server_request_id").is_not_null())
    )  # fmt: skip
    deadline = time.monotonic() + grace_s
    frames, taken = [empty_spans()], 0
    said = False
    while True:
        posts = receiver.posts
        frames.append(receiver.spans(since=taken))
        taken = posts
        spans = pl.concat(frames)
        joined = server_fields(expected, spans, anchor_ns=anchor)
        missing = joined.filter(pl.col("joined_by").is_null()).height
        if missing == 0 or time.monotonic() >= deadline:
            break
        if not said:
            run.terminal.say(f"otlp receiver: waiting up to {grace_s:g} s for the server's "
                             f"spans of {missing} request(s)")  # fmt: skip
            said = True
        time.sleep(POLL_S)
    receiver.close()
    spans = with_source(pl.concat([spans, receiver.spans(since=taken)]), "receiver")
    write_spans(run.run_dir, spans)
    account = span_account(frame, spans, info.t0, source="receiver")
    if receiver.refusals:
        LOGGER.warning("otlp receiver: refused %d export(s): %s", receiver.refusals,
                       receiver.last_refusal)  # fmt: skip
        run.terminal.warn(f"otlp receiver: refused {receiver.refusals} export(s): "
                          f"{receiver.last_refusal}")  # fmt: skip
    line = join_line(account)
    LOGGER.info("%s", line)
    run.terminal.say(line)
    if spans.height == 0:  # even with -q: the run asked for spans and got none
        hint = (
            "was the server started with --otlp-traces-endpoint at it, exporting OTLP/gRPC?"
            if receiver.protocol == GRPC
            else "was the server started with --otlp-traces-endpoint at it, exporting "
            "http/protobuf (vLLM exports gRPC by default: listen with grpc:PORT)?"
        )
        run.terminal.warn(f"otlp receiver: no span arrived at {receiver.url}: {hint}")
    summary = split_by_spans(summary, frame, server_fields(frame, spans, anchor_ns=anchor))
    return replace(summary, server_spans=account)
