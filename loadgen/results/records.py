"""Records: one row per planned request, whatever happened to it.

Sits between the engine and the metrics. The runner turns every plan into exactly one
`RequestRecord`; `results.write.RecordWriter` spills them to Parquet part files during the
run (each part written to a temp name and renamed, so a killed run keeps every finished
part) and joins the parts into `records.parquet` at the end. Times are integer nanoseconds since the
run's t0 on the monotonic clock; `None` means the moment never happened, and the outcome
says why.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl


class Outcome(enum.StrEnum):
    """How a request ended. Every value but `ok` is a breach of every SLO of its class."""

    OK = "ok"
    REJECTED = "rejected"  # 429 or another admission refusal
    HTTP_ERROR = "http_error"  # any other non-2xx status
    CONNECT_ERROR = "connect_error"  # no connection, or it broke before a response
    STREAM_ERROR = "stream_error"  # mid-stream break, malformed data, server error event
    TIMEOUT_FIRST_TOKEN = "timeout_first_token"  # no generated token by the deadline
    TIMEOUT_STALL = "timeout_stall"  # a gap between tokens longer than the stall deadline
    TIMEOUT_TOTAL = "timeout_total"  # not finished by the total deadline
    CANCELLED = "cancelled"  # sent, but the run was stopped (or killed) before it finished
    NOT_SENT = "not_sent"  # never sent: the run was stopped (or killed) before its time came
    SKIPPED = "skipped"  # never sent: an earlier turn or hop of its session/trajectory failed
    CLIENT_ERROR = "client_error"  # the client failed (no file descriptor, no local port)
    # The stream ended cleanly but short: no finish signal where the API always sends one,
    # an abort as the finish reason, or fewer tokens than forced with no reason given.
    TRUNCATED = "truncated"


OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)


class TokenSource(enum.StrEnum):
    """Where `output_tokens` came from."""

    USAGE = "usage"  # the server's reported usage.completion_tokens
    CHUNKS = "chunks"  # counted token-bearing events (one token each)
    TEXT = "text"  # the streamed text's tokens, counted with target.tokenizer
    NONE = "none"  # no output at all


# Output tokens a server may count but never stream as a chunk: the EOS token that ends a
# stop (vLLM counts it in completion_tokens; TGI streams it as a special token).
UNSTREAMED_TOKENS = 1


def usage_disagrees(usage: int | None, counted: int) -> bool:
    """True when the server's output count and the token-bearing events that arrived
    disagree: fewer tokens than events (each carries at least one), or more than the events
    plus `UNSTREAMED_TOKENS` (events that carry several tokens, hidden reasoning, or a
    count of its own, as a gateway that fills in usage after a cut)."""
    if usage is None or counted == 0:
        return False
    return usage < counted or usage > counted + UNSTREAMED_TOKENS


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerTimings:
    """What the server said about its own work on one request (ms and token counts).

    Kept next to the client's measurements, never mixed into them: a server's prefill time
    beside the client's TTFT shows how much of TTFT was queueing and network. Filled by the
    APIs that report it: Ollama's final object (`load_duration`, `prompt_eval_duration`,
    `eval_duration`, `total_duration` in ns; `prompt_eval_count`, `eval_count`); llama.cpp's
    `timings` (`prompt_ms`, `predicted_ms`, `prompt_n`, `predicted_n`, `cache_n`) maps
    onto the same fields. `None` where the server did not say. The adapters, below the
    records, report these as a plain mapping by field name (`Delta.server_timings`);
    `reported_timings` types it.
    """

    queue_ms: float | None = None  # waiting before the server started on it
    load_ms: float | None = None  # loading the model for it (Ollama: load_duration)
    prefill_ms: float | None = None  # prompt processing (Ollama: prompt_eval_duration)
    decode_ms: float | None = None  # generating the output (Ollama: eval_duration)
    total_ms: float | None = None  # the server's whole time on the request
    prefill_tokens: int | None = None  # prompt tokens it processed (Ollama: prompt_eval_count)
    decode_tokens: int | None = None  # tokens it generated (Ollama: eval_count)
    cached_tokens: int | None = None  # prompt tokens served from its cache


SERVER_TIMING_FIELDS: tuple[str, ...] = tuple(ServerTimings.__dataclass_fields__)
SERVER_TIMINGS_DTYPE = pl.Struct(
    {
        name: (pl.Int64() if name.endswith("_tokens") else pl.Float64())
        for name in SERVER_TIMING_FIELDS
    }
)


def reported_timings(reported: Mapping[str, Any] | None) -> ServerTimings | None:
    """An adapter's report of the server's own timings (field name → value), typed."""
    return None if reported is None else ServerTimings(**reported)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """What one planned request did, measured at the client boundary.

    Times are ns since the run's t0. `intended_ns` is when the plan said to send (the
    moment the user pressed enter); TTFT and E2E are measured from it. `chunk_ns` holds
    the arrival time of every output-bearing chunk and `chunk_tokens` the tokens each
    carried (1 each, unless the server's usage says more and they were apportioned), up to
    the request's stamp cap (`exchange.chunk_stamp_cap`); past it `unstamped_chunks` counts
    the rest and `unstamped_max_gap_ns` keeps their largest gap.
    """

    request_id: int
    class_name: str
    intended_ns: int
    outcome: Outcome
    dispatched_ns: int | None = None  # when the scheduler started it (generator health)
    sent_ns: int | None = None  # when its request bytes were written
    headers_ns: int | None = None
    first_token_ns: int | None = None  # first generated output: content, reasoning or tool call
    first_content_ns: int | None = None  # first visible content
    first_reasoning_ns: int | None = None  # first reasoning (thinking) output
    last_token_ns: int | None = None
    end_ns: int | None = None
    chunk_ns: Sequence[int] = field(default_factory=tuple)
    chunk_tokens: Sequence[int] = field(default_factory=tuple)
    output_tokens: int = 0
    token_source: TokenSource = TokenSource.NONE
    prompt_tokens: int | None = None  # as reported by the server's usage
    prompt_tokens_target: int = 0  # what the plan asked for
    max_tokens: int = 0
    http_status: int | None = None
    error: str | None = None
    retries: int = 0
    session_id: int | None = None  # the chat session / agent trajectory / batch it belongs to
    turn: int | None = None  # its turn (chat) or hop (agent) index within the session, from 0
    server_timings: ServerTimings | None = None  # what the server reported, if it did
    request_id_sent: str | None = None  # the id header's value this request carried
    finish_reason: str | None = None  # the API's stop reason as sent (None: none came)
    stopped_early: bool = False  # ok, but a stop reason ended it before its forced length
    # The connection its (last) attempt was written on: new (opened for it, during the run:
    # its setup is inside its latency), warm (opened before t0) or reused (kept alive);
    # None when it was never written.
    connection: str | None = None
    model: str | None = None  # the model (or LoRA adapter) the request named
    cached_prompt_tokens: int | None = None  # prompt tokens the server served from its cache
    server_request_id: str | None = None  # the response's `id`, else its x-request-id header
    # The server's own output count (its usage, after the check at the door) beside the
    # token-bearing events that arrived (chunks + token-only events): both kept, so a usage
    # that disagrees with the stream (`runner.usage_disagrees`) shows. None: no usage (or
    # no output); `output_tokens` is the N used, `token_source` where it came from.
    usage_output_tokens: int | None = None
    counted_output_tokens: int = 0
    # Usage counts the server sent that cannot be counts (negative, not integers, beyond what
    # the exchange could hold), as text: never taken as figures; the record is stream_error.
    usage_problem: str | None = None
    # Output chunks past the stamp cap (`chunk_ns` then holds the first cap of them, so its
    # length is the cap): counted in N (last_token_ns is the last of them, so TPOT and E2E
    # are whole), their arrival times not kept; the largest of their gaps (from the last
    # stamped chunk on) is `unstamped_max_gap_ns`, in the request's largest ITL. 0 and None
    # for every stream within its cap.
    unstamped_chunks: int = 0
    unstamped_max_gap_ns: int | None = None
    # How the output arrived: its output-bearing events (`chunk_ns` holds their stamps) and
    # the network reads that carried them (reads told apart by their arrival stamps). Many
    # events per read is a stream held back on the way, or written in bursts by the server
    # (`analysis.delivery`); several tokens per event is the server's own chunking.
    output_events: int = 0
    output_reads: int = 0


# Column name -> polars dtype. `class` is the column name (a keyword in Python, hence
# `class_name` on the dataclass). Adding a column is fine; renaming one breaks old runs.
SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Int64(),
    "class": pl.String(),
    "intended_ns": pl.Int64(),
    "dispatched_ns": pl.Int64(),
    "sent_ns": pl.Int64(),
    "headers_ns": pl.Int64(),
    "first_token_ns": pl.Int64(),
    "first_content_ns": pl.Int64(),
    "last_token_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "chunk_ns": pl.List(pl.Int64()),
    "chunk_tokens": pl.List(pl.Int64()),  # Int64: wide enough for any count that passes
    "output_tokens": pl.Int64(),
    "token_source": pl.String(),
    "prompt_tokens": pl.Int64(),
    "prompt_tokens_target": pl.Int64(),
    "max_tokens": pl.Int64(),
    "outcome": pl.String(),
    "http_status": pl.Int32(),
    "error": pl.String(),
    "retries": pl.Int32(),
    "session_id": pl.Int64(),
    "turn": pl.Int32(),
    "first_reasoning_ns": pl.Int64(),
    "server_timings": SERVER_TIMINGS_DTYPE,
    "request_id_sent": pl.String(),
    "finish_reason": pl.String(),
    "stopped_early": pl.Boolean(),
    "connection": pl.String(),
    "model": pl.String(),
    "cached_prompt_tokens": pl.Int64(),
    "server_request_id": pl.String(),
    "usage_output_tokens": pl.Int64(),
    "counted_output_tokens": pl.Int64(),
    "usage_problem": pl.String(),
    "unstamped_chunks": pl.Int64(),
    "unstamped_max_gap_ns": pl.Int64(),
    "output_events": pl.Int64(),
    "output_reads": pl.Int64(),
}


def to_frame(records: Iterable[RequestRecord]) -> pl.DataFrame:
    """Records as a frame with `SCHEMA`, sorted by request_id.

    Built column by column (no per-record dicts): a writer thread converting a batch holds
    the GIL while it does, and every millisecond of that is a millisecond the event loop
    cannot stamp a chunk.
    """
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA}
    fields = [(name, _FIELD.get(name, name)) for name in SCHEMA]
    for record in records:
        for column, attribute in fields:
            columns[column].append(getattr(record, attribute))
    columns["outcome"] = [str(o) for o in columns["outcome"]]
    columns["token_source"] = [str(t) for t in columns["token_source"]]
    columns["chunk_ns"] = [list(c) for c in columns["chunk_ns"]]
    columns["chunk_tokens"] = [list(c) for c in columns["chunk_tokens"]]
    columns["server_timings"] = [
        None if t is None else {name: getattr(t, name) for name in SERVER_TIMING_FIELDS}
        for t in columns["server_timings"]
    ]
    return pl.DataFrame(columns, schema=SCHEMA).sort("request_id")


_FIELD = {"class": "class_name"}  # column name -> dataclass attribute, where they differ


def empty_frame() -> pl.DataFrame:
    """A frame with no rows and the records schema."""
    return pl.DataFrame(schema=SCHEMA)


def from_frame(frame: pl.DataFrame) -> list[RequestRecord]:
    """The inverse of `to_frame`."""
    records = []
    for row in frame.iter_rows(named=True):
        row = dict(row)
        row["class_name"] = row.pop("class")
        row["outcome"] = Outcome(row["outcome"])
        row["token_source"] = TokenSource(row["token_source"])
        row["chunk_ns"] = tuple(row["chunk_ns"] or ())
        row["chunk_tokens"] = tuple(row["chunk_tokens"] or ())
        row["stopped_early"] = bool(row.get("stopped_early"))  # null in older runs
        row["counted_output_tokens"] = row.get("counted_output_tokens") or 0
        row["unstamped_chunks"] = row.get("unstamped_chunks") or 0  # null in older runs
        row["output_events"] = row.get("output_events") or 0  # null in older runs
        row["output_reads"] = row.get("output_reads") or 0
        timings = row.get("server_timings")
        if isinstance(timings, dict) and any(v is not None for v in timings.values()):
            row["server_timings"] = ServerTimings(**timings)
        else:
            row["server_timings"] = None
        known = {k: v for k, v in row.items() if k in RequestRecord.__dataclass_fields__}
        records.append(RequestRecord(**known))
    return records


def with_all_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with every `SCHEMA` column it lacks added as nulls, and `chunk_tokens` widened
    to Int64 (records of older runs), so frames of old and new runs concatenate."""
    missing = [
        pl.lit(None, dtype).alias(n) for n, dtype in SCHEMA.items() if n not in frame.columns
    ]
    if frame.schema.get("chunk_tokens") == pl.List(pl.Int32()):  # records before Int64
        missing.append(pl.col("chunk_tokens").cast(SCHEMA["chunk_tokens"]))
    return frame.with_columns(missing) if missing else frame
