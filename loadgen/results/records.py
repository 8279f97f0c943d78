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
from dataclasses import MISSING, Field, dataclass, field, fields, replace
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
    ttft_ms: float | None = None  # from its arrival at the server to its first output token
    itl_ms: float | None = None  # the mean gap between its output tokens, as the server saw it
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
class Column:
    """One column of `records.parquet`, declared once: on its `RequestRecord` field
    (`column`, `stamp`), from which `COLUMNS`, `SCHEMA`, `TIME_COLUMNS`, the frame codec
    (`to_frame`, `from_frame`), the exchange's relative times, merge's re-basing and the
    docs' column list (docs/metrics.md, tested) are derived."""

    name: str  # the Parquet column: the field's name (`class` for `class_name`)
    attribute: str  # the RequestRecord field
    dtype: pl.DataType
    doc: str  # one line for the docs' column list (Markdown, links relative to docs/)
    # A time on the run's clock (ns since t0; for a list, each element): the exchange
    # writes it relative to t0, and a merge moves it by the shard's offset.
    time: bool = False
    read_as: type[enum.StrEnum] | None = None  # the enum its strings are read back as

    @property
    def is_list(self) -> bool:
        """A list of values per request (chunk times, chunk tokens)."""
        return isinstance(self.dtype, pl.List)


_COLUMN = "loadgen.column"  # the key of a RequestRecord field's metadata holding its Column


def column(
    dtype: pl.DataType, doc: str, *, name: str = "", read_as: type[enum.StrEnum] | None = None
) -> dict[str, Column]:
    """A `RequestRecord` field's metadata: its column's dtype, doc line, and (where they
    differ) Parquet name and the enum its strings are read back as."""
    return {_COLUMN: Column(name=name, attribute="", dtype=dtype, doc=doc, read_as=read_as)}


def stamp(doc: str, dtype: pl.DataType | None = None) -> dict[str, Column]:
    """A field's metadata for a time on the run's clock: int64 ns since t0 (or a list)."""
    return {_COLUMN: Column(name="", attribute="", dtype=dtype or pl.Int64(), doc=doc, time=True)}


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """What one planned request did, measured at the client boundary: one row of
    `records.parquet`, each field a column declared here once (`column`, `stamp`).

    Times are ns since the run's t0. `intended_ns` is when the plan said to send (the
    moment the user pressed enter); TTFT and E2E are measured from it. `chunk_ns` holds
    the arrival time of every output-bearing chunk and `chunk_tokens` the tokens each
    carried (1 each, unless the server's usage says more and they were apportioned), up to
    the request's stamp cap (`exchange.chunk_stamp_cap`); past it `unstamped_chunks` counts
    the rest and `unstamped_max_gap_ns` keeps their largest gap. The fields are in the
    Parquet file's column order (it is kept: older runs' files read alike).
    """

    request_id: int = field(
        metadata=column(
            pl.Int64(),
            "the plan's id: 0, 1, … in schedule order, unique across a merged run's shards",
        )
    )
    class_name: str = field(metadata=column(pl.String(), "its workload class", name="class"))
    intended_ns: int = field(
        metadata=stamp(
            "when the plan said to send it, the moment the user pressed enter: TTFT and E2E "
            "count from it"
        )
    )
    dispatched_ns: int | None = field(
        default=None,
        metadata=stamp(
            "when the scheduler started it (the generator's lag is dispatched − intended)"
        ),
    )
    sent_ns: int | None = field(default=None, metadata=stamp("when its request bytes were written"))
    headers_ns: int | None = field(default=None, metadata=stamp("when the response's head arrived"))
    first_token_ns: int | None = field(
        default=None,
        metadata=stamp("its first generated output: content, reasoning or a tool call"),
    )
    first_content_ns: int | None = field(default=None, metadata=stamp("its first visible content"))
    last_token_ns: int | None = field(default=None, metadata=stamp("its last generated output"))
    end_ns: int | None = field(default=None, metadata=stamp("when it ended, whatever the outcome"))
    chunk_ns: Sequence[int] = field(
        default_factory=tuple,
        metadata=stamp(
            "the arrival time of every output-bearing chunk, up to the request's stamp cap (see "
            "[Bounded memory and time on the wire](#bounded-memory-and-time-on-the-wire))",
            pl.List(pl.Int64()),
        ),
    )
    chunk_tokens: Sequence[int] = field(
        default_factory=tuple,
        metadata=column(
            pl.List(pl.Int64()),
            "the output tokens each stamped chunk carried: 1 each, unless "
            "the server's usage (or `target.tokenizer`) says more and they were apportioned by "
            "text length",
        ),
    )
    output_tokens: int = field(
        default=0, metadata=column(pl.Int64(), "N, the output tokens: see `token_source`")
    )
    token_source: TokenSource = field(
        default=TokenSource.NONE,
        metadata=column(
            pl.String(),
            "where N came from: `usage` (the server's), `text` (the streamed "
            "text's tokens, `target.tokenizer`), `chunks` (token-bearing events counted) or "
            "`none`",
            read_as=TokenSource,
        ),
    )
    prompt_tokens: int | None = field(
        default=None,
        metadata=column(pl.Int64(), "prompt tokens, as the server's usage reported them"),
    )
    prompt_tokens_target: int = field(
        default=0, metadata=column(pl.Int64(), "the prompt tokens the plan asked for")
    )
    max_tokens: int = field(
        default=0, metadata=column(pl.Int64(), "the output tokens the plan asked for")
    )
    outcome: Outcome = field(
        metadata=column(
            pl.String(),
            "how it ended: `ok`, or one of the failures above (each a breach)",
            read_as=Outcome,
        )
    )
    http_status: int | None = field(
        default=None,
        metadata=column(
            pl.Int32(), "the response's status code (null: no response, or none in 100–599)"
        ),
    )
    error: str | None = field(
        default=None,
        metadata=column(
            pl.String(), "what went wrong, in words (server text quoted, redacted and cut)"
        ),
    )
    retries: int = field(
        default=0,
        metadata=column(
            pl.Int32(),
            "times it was sent again (a reused connection lost before any response "
            "byte is retried once)",
        ),
    )
    session_id: int | None = field(
        default=None,
        metadata=column(pl.Int64(), "the chat session, agent trajectory or batch it belongs to"),
    )
    turn: int | None = field(
        default=None,
        metadata=column(pl.Int32(), "its turn (chat) or hop (agent) in that session, from 0"),
    )
    first_reasoning_ns: int | None = field(
        default=None, metadata=stamp("its first reasoning (thinking) output")
    )
    server_timings: ServerTimings | None = field(
        default=None,
        metadata=column(
            SERVER_TIMINGS_DTYPE,
            "the server's own timings in ms and token counts "
            "(null when the API reports none; see [Streaming APIs](apis.md#streaming-apis))",
        ),
    )
    request_id_sent: str | None = field(
        default=None,
        metadata=column(
            pl.String(),
            "the id header's value it carried (null when ids are off, or it was never sent)",
        ),
    )
    traceparent: str | None = field(
        default=None,
        metadata=column(
            pl.String(),
            "the W3C `traceparent` header it carried (null when off, or it was never sent): "
            "its trace id joins it to the server's span",
        ),
    )
    finish_reason: str | None = field(
        default=None,
        metadata=column(pl.String(), "the API's stop reason as sent (null: none came)"),
    )
    stopped_early: bool = field(
        default=False,
        metadata=column(
            pl.Boolean(),
            "ok, but a stop reason ended it before its forced length (`target.allow_early_stops`)",
        ),
    )
    connection: str | None = field(
        default=None,
        metadata=column(
            pl.String(),
            "the connection its last attempt was written on: `new` (opened for it, "
            "its setup inside its latency), `warm` (opened before t0) or `reused` (kept alive); "
            "null when never written (see [Warm connections]"
            "(#warm-connections-bursts-the-closed-loop))",
        ),
    )
    model: str | None = field(
        default=None,
        metadata=column(
            pl.String(),
            "the model (or LoRA adapter) it named: its class's mix, else `target.model`",
        ),
    )
    cached_prompt_tokens: int | None = field(
        default=None,
        metadata=column(
            pl.Int64(),
            "prompt tokens the server said it served from its prefix cache (null: it did not say)",
        ),
    )
    server_request_id: str | None = field(
        default=None,
        metadata=column(
            pl.String(),
            "the response's own `id`, else its `x-request-id` header (see [The "
            "server's side](server-metrics.md"
            "#the-servers-side-prometheus-metrics-cache-hits-server-ids))",
        ),
    )
    usage_output_tokens: int | None = field(
        default=None,
        metadata=column(
            pl.Int64(),
            "the server's own output count, as its usage said after the check at the "
            "door (null: no usage, or no output)",
        ),
    )
    counted_output_tokens: int = field(
        default=0,
        metadata=column(
            pl.Int64(),
            "the token-bearing events that arrived (output chunks and token-only "
            "events), beside the server's count so a usage that disagrees shows",
        ),
    )
    usage_problem: str | None = field(
        default=None,
        metadata=column(
            pl.String(),
            "usage counts no server can mean, as text, never taken as figures (the "
            "record is then `stream_error`; see [How a stream ends](apis.md#how-a-stream-ends))",
        ),
    )
    unstamped_chunks: int = field(
        default=0,
        metadata=column(
            pl.Int64(),
            "output chunks past the stamp cap, counted in N but not in `chunk_ns` (0 within it)",
        ),
    )
    unstamped_max_gap_ns: int | None = field(
        default=None,
        metadata=column(
            pl.Int64(),
            "the largest gap among those chunks, in ns (a duration, not a time), "
            "which the request's ITL check sees (null within the cap)",
        ),
    )
    output_events: int = field(
        default=0,
        metadata=column(
            pl.Int64(),
            "its output-bearing events (schema 19: see [Buffering](network-path.md"
            "#buffering-compression-and-gateways))",
        ),
    )
    output_reads: int = field(
        default=0,
        metadata=column(
            pl.Int64(),
            "the network reads that carried them, told apart by their arrival stamps "
            "(0 in older runs, whose reads are counted from `chunk_ns`'s distinct stamps)",
        ),
    )


def _columns() -> tuple[Column, ...]:
    """Every field's Column, named; a field without one is a bug (KeyError at import)."""
    found = []
    for f in fields(RequestRecord):
        declared: Column = f.metadata[_COLUMN]
        found.append(replace(declared, name=declared.name or f.name, attribute=f.name))
    return tuple(found)


COLUMNS: tuple[Column, ...] = _columns()
# Column name -> polars dtype, in the file's order. Adding a column is fine (old runs read it
# as null); renaming one breaks old runs.
SCHEMA: dict[str, pl.DataType] = {c.name: c.dtype for c in COLUMNS}
TIME_COLUMNS: tuple[Column, ...] = tuple(c for c in COLUMNS if c.time)


def to_frame(records: Iterable[RequestRecord]) -> pl.DataFrame:
    """Records as a frame with `SCHEMA`, sorted by request_id.

    Built column by column (no per-record dicts): a writer thread converting a batch holds
    the GIL while it does, and every millisecond of that is a millisecond the event loop
    cannot stamp a chunk.
    """
    columns: dict[str, list[Any]] = {c.name: [] for c in COLUMNS}
    pairs = [(columns[c.name].append, c.attribute) for c in COLUMNS]
    for record in records:
        for add, attribute in pairs:
            add(getattr(record, attribute))
    for c in COLUMNS:
        columns[c.name] = _encoded(c, columns[c.name])
    return pl.DataFrame(columns, schema=SCHEMA).sort("request_id")


def _encoded(c: Column, values: list[Any]) -> list[Any]:
    """One column's field values as polars takes them: enums as text, lists, structs as
    dicts."""
    if c.read_as is not None:
        return [str(v) for v in values]
    if c.is_list:
        return [list(v) for v in values]
    if isinstance(c.dtype, pl.Struct):
        return [None if v is None else {f: getattr(v, f) for f in SERVER_TIMING_FIELDS}
                for v in values]  # fmt: skip
    return values


def empty_frame() -> pl.DataFrame:
    """A frame with no rows and the records schema."""
    return pl.DataFrame(schema=SCHEMA)


def from_frame(frame: pl.DataFrame) -> list[RequestRecord]:
    """The inverse of `to_frame`. A column an older run lacks (or left null) reads as its
    field's default."""
    defaults = {f.name: _default(f) for f in fields(RequestRecord)}
    records = []
    for row in frame.iter_rows(named=True):
        values: dict[str, Any] = {}
        for c in COLUMNS:
            value = row.get(c.name)
            if value is None:
                if defaults[c.attribute] is not _REQUIRED:
                    values[c.attribute] = defaults[c.attribute]
                continue
            values[c.attribute] = _decoded(c, value)
        records.append(RequestRecord(**values))
    return records


_REQUIRED = object()  # a field without a default: a frame without it is no records


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return _REQUIRED


def _decoded(c: Column, value: Any) -> Any:
    """One cell as its field holds it (the inverse of `_encoded`)."""
    if c.read_as is not None:
        return c.read_as(value)
    if c.is_list:
        return tuple(value)
    if isinstance(c.dtype, pl.Struct):
        said = any(v is not None for v in value.values())
        return ServerTimings(**value) if said else None
    return value


def with_all_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with every `SCHEMA` column it lacks added as nulls, and `chunk_tokens` widened
    to Int64 (records of older runs), so frames of old and new runs concatenate."""
    missing = [
        pl.lit(None, dtype).alias(n) for n, dtype in SCHEMA.items() if n not in frame.columns
    ]
    if frame.schema.get("chunk_tokens") == pl.List(pl.Int32()):  # records before Int64
        missing.append(pl.col("chunk_tokens").cast(SCHEMA["chunk_tokens"]))
    return frame.with_columns(missing) if missing else frame
