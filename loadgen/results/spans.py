"""The server's spans: one row per OpenTelemetry span a server sent about its requests.

A server started with tracing (vLLM's `--otlp-traces-endpoint`, SGLang's) exports one span
per request (vLLM's `llm_request`), parented under the request's W3C `traceparent`, with
its own account of the request as attributes: `gen_ai.latency.time_in_queue`,
`time_in_model_prefill`, `time_in_model_decode`, `time_to_first_token`, `e2e` (seconds),
`gen_ai.usage.prompt_tokens` / `completion_tokens` (`input_tokens` / `output_tokens` in
the newer conventions), `gen_ai.usage.cached_tokens` (SGLang) and `gen_ai.request.id`.
This module turns what arrives (an OTLP/HTTP body, protobuf or JSON; a collector's file
exporter's JSON lines; Jaeger's or Tempo's answer for a trace id) into one frame of
`SPAN_SCHEMA`, its server fields named as `records.ServerTimings`' (ms and token counts),
so the join (`analysis.join`) never sees the wire. Times stay as the server stamped them:
unix ns on the server's wall clock.

Decoding protobuf needs the `opentelemetry-proto` package (the `[spans]` extra); it is
imported when a protobuf body is read, never at import time.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import polars as pl

from loadgen.errors import LoadgenError
from loadgen.results.records import SERVER_TIMING_FIELDS, SERVER_TIMINGS_DTYPE
from loadgen.results.runfolder import SPANS_FILE, SPANS_PARTS_DIR

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

# attribute -> (ServerTimings field, factor to its unit): seconds become ms
SPAN_ATTRIBUTES: Mapping[str, tuple[str, float | None]] = {
    "gen_ai.latency.time_in_queue": ("queue_ms", 1000.0),
    "gen_ai.latency.time_in_model_prefill": ("prefill_ms", 1000.0),
    "gen_ai.latency.time_in_model_decode": ("decode_ms", 1000.0),
    "gen_ai.latency.time_to_first_token": ("ttft_ms", 1000.0),
    "gen_ai.latency.e2e": ("total_ms", 1000.0),
    "gen_ai.usage.prompt_tokens": ("prefill_tokens", None),
    "gen_ai.usage.input_tokens": ("prefill_tokens", None),
    "gen_ai.usage.completion_tokens": ("decode_tokens", None),
    "gen_ai.usage.output_tokens": ("decode_tokens", None),
    "gen_ai.usage.cached_tokens": ("cached_tokens", None),
}
REQUEST_ID_ATTRIBUTE = "gen_ai.request.id"  # vLLM: "chatcmpl-" + the incoming X-Request-Id
SERVICE_ATTRIBUTE = "service.name"
MAX_BODY_BYTES = 64 << 20  # one export's body, decompressed: OTLP batches are far smaller

_TIMING_DTYPES: dict[str, Any] = {f.name: f.dtype for f in SERVER_TIMINGS_DTYPE.fields}
SPAN_SCHEMA: dict[str, pl.DataType] = {
    "trace_id": pl.String(),  # 32 hex digits
    "span_id": pl.String(),  # 16 hex digits
    "parent_span_id": pl.String(),  # null for a root span
    "name": pl.String(),
    "service": pl.String(),  # the resource's service.name
    "start_unix_ns": pl.Int64(),  # the server's wall clock
    "end_unix_ns": pl.Int64(),
    "server_request_id": pl.String(),  # gen_ai.request.id
    **_TIMING_DTYPES,
    "attributes": pl.String(),  # every attribute, as JSON
    "source": pl.String(),  # where it came from: `receiver`, a file's name, a query URL
}


def empty_spans() -> pl.DataFrame:
    """No spans, with `SPAN_SCHEMA`."""
    return pl.DataFrame(schema=SPAN_SCHEMA)


def server_fields(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A span's attributes as `ServerTimings` fields (ms, token counts; None: not said).

    `itl_ms` is the decode time over the gaps (`decode_ms / (decode_tokens - 1)`), as vLLM
    computes its in-band `mean_itl_ms`."""
    found: dict[str, Any] = dict.fromkeys(SERVER_TIMING_FIELDS)
    for key, (name, factor) in SPAN_ATTRIBUTES.items():
        value = attributes.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if factor is None:
            found[name] = int(value)
        else:
            found[name] = float(value) * factor
    decode_ms, tokens = found["decode_ms"], found["decode_tokens"]
    if decode_ms is not None and tokens is not None and tokens > 1:
        found["itl_ms"] = decode_ms / (tokens - 1)
    return found


def _row(
    trace_id: str, span_id: str, parent: str | None, name: str, service: str | None,
    start_ns: int, end_ns: int, attributes: Mapping[str, Any],
) -> dict[str, Any]:  # fmt: skip
    request_id = attributes.get(REQUEST_ID_ATTRIBUTE)
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent or None,
        "name": name,
        "service": service,
        "start_unix_ns": start_ns,
        "end_unix_ns": end_ns,
        "server_request_id": None if request_id is None else str(request_id),
        **server_fields(attributes),
        "attributes": orjson.dumps(attributes, default=str).decode(),
    }


def spans_frame(rows: Iterable[Mapping[str, Any]]) -> pl.DataFrame:
    """Rows of `SPAN_SCHEMA` as a frame (`source` null unless a row says it)."""
    return pl.DataFrame(list(rows), schema=SPAN_SCHEMA)


def with_source(frame: pl.DataFrame, source: str) -> pl.DataFrame:
    """`frame` with every span's `source` set."""
    return frame.with_columns(pl.lit(source, dtype=pl.String).alias("source"))


# -- OTLP ----------------------------------------------------------------------------------


def _any_value(value: Any) -> Any:
    """An OTLP `AnyValue` message as a plain value."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def _otlp_rows(request: ExportTraceServiceRequest) -> Iterator[dict[str, Any]]:
    for resource_spans in request.resource_spans:
        resource = {kv.key: _any_value(kv.value) for kv in resource_spans.resource.attributes}
        service = resource.get(SERVICE_ATTRIBUTE)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes = {kv.key: _any_value(kv.value) for kv in span.attributes}
                yield _row(span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                           span.name, None if service is None else str(service),
                           span.start_time_unix_nano, span.end_time_unix_nano,
                           attributes)  # fmt: skip


def _message_type() -> type[ExportTraceServiceRequest]:
    try:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # defers the extra
            ExportTraceServiceRequest,
        )
    except ImportError:
        raise LoadgenError(
            "reading OTLP spans needs the opentelemetry-proto package: pip install 'loadgen[spans]'"
        ) from None
    return ExportTraceServiceRequest


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """An OTLP/HTTP protobuf body as its message; ValueError when it is not one."""
    message = _message_type()()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError; its base class differs by backend
        raise ValueError(f"not an OTLP ExportTraceServiceRequest: {exc}") from None
    return message


def spans_from_protobuf(body: bytes) -> pl.DataFrame:
    """The spans of an OTLP/HTTP protobuf body (`application/x-protobuf`)."""
    return spans_frame(_otlp_rows(parse_protobuf(body)))


def _hex_id(value: Any) -> str:
    """A span or trace id as hex: OTLP JSON writes hex, protobuf's JSON mapping (Tempo)
    base64."""
    text = str(value or "")
    if len(text) in (16, 32):
        try:
            bytes.fromhex(text)
            return text.lower()
        except ValueError:
            pass
    try:
        return base64.b64decode(text, validate=True).hex()
    except (binascii.Error, ValueError):
        raise ValueError(f"{text[:40]!r} is neither a hex nor a base64 id") from None


def _json_value(value: Mapping[str, Any]) -> Any:
    """An OTLP JSON `AnyValue` as a plain value (int64 arrives as a string)."""
    for key, raw in value.items():
        if key in ("intValue", "int_value"):
            return int(raw)
        if key in ("doubleValue", "double_value"):
            return float(raw)
        if key in ("arrayValue", "array_value"):
            return [_json_value(v) for v in raw.get("values", [])]
        if key in ("kvlistValue", "kvlist_value"):
            return _json_attributes(raw.get("values", []))
        return raw
    return None


def _json_attributes(pairs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {p["key"]: _json_value(p.get("value") or {}) for p in pairs}


def _get(mapping: Mapping[str, Any], camel: str, snake: str) -> Any:
    return mapping.get(camel, mapping.get(snake))


def _otlp_json_rows(document: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The spans of one OTLP JSON document: `resourceSpans` (a collector's file exporter,
    an OTLP/HTTP JSON body), `batches` (Tempo's answer), or `{"trace": ...}` and
    `{"result": ...}` around either (Tempo's v2 API, Jaeger's v3)."""
    for wrapper in ("trace", "result"):
        if isinstance(document.get(wrapper), Mapping):
            document = document[wrapper]
    groups = _get(document, "resourceSpans", "resource_spans") or document.get("batches") or []
    for group in groups:
        resource = _json_attributes((group.get("resource") or {}).get("attributes", []))
        service = resource.get(SERVICE_ATTRIBUTE)
        scopes = _get(group, "scopeSpans", "scope_spans") or group.get(
            "instrumentationLibrarySpans", []
        )
        for scope in scopes:
            for span in scope.get("spans", []):
                parent = _get(span, "parentSpanId", "parent_span_id")
                yield _row(_hex_id(_get(span, "traceId", "trace_id")),
                           _hex_id(_get(span, "spanId", "span_id")),
                           _hex_id(parent) if parent else None, str(span.get("name", "")),
                           None if service is None else str(service),
                           int(_get(span, "startTimeUnixNano", "start_time_unix_nano") or 0),
                           int(_get(span, "endTimeUnixNano", "end_time_unix_nano") or 0),
                           _json_attributes(span.get("attributes", [])))  # fmt: skip


def _jaeger_rows(document: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The spans of Jaeger's query API answer (`/api/traces/{id}`): `data[].spans[]`, times
    in µs, attributes as `tags`, the parent as a CHILD_OF reference."""
    for trace in document.get("data") or []:
        processes = trace.get("processes") or {}
        for span in trace.get("spans", []):
            tags = {t["key"]: t.get("value") for t in span.get("tags", [])}
            service = (processes.get(span.get("processID")) or {}).get("serviceName")
            parent = next((r.get("spanID") for r in span.get("references", [])
                           if r.get("refType") == "CHILD_OF"), None)  # fmt: skip
            start_ns = int(span.get("startTime", 0)) * 1000
            yield _row(_hex_id(str(span["traceID"]).rjust(32, "0")),
                       _hex_id(str(span["spanID"]).rjust(16, "0")),
                       _hex_id(str(parent).rjust(16, "0")) if parent else None,
                       str(span.get("operationName", "")), service, start_ns,
                       start_ns + int(span.get("duration", 0)) * 1000, tags)  # fmt: skip


def spans_from_json_document(document: Any) -> pl.DataFrame:
    """The spans of one parsed JSON document: OTLP JSON, Tempo's or Jaeger's answer."""
    if not isinstance(document, Mapping):
        raise ValueError("not a JSON object")
    if "data" in document:
        return spans_frame(_jaeger_rows(document))
    return spans_frame(_otlp_json_rows(document))


def spans_from_json(body: bytes) -> pl.DataFrame:
    """The spans of OTLP JSON: one document (an OTLP/HTTP JSON body), or one per line (a
    collector's file exporter); ValueError when a line is not one."""
    text = body.strip()
    try:
        return spans_from_json_document(orjson.loads(text))
    except orjson.JSONDecodeError:
        pass  # more than one document: JSON lines
    frames = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            frames.append(spans_from_json_document(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"line {number}: {exc}") from None
    return pl.concat(frames) if frames else empty_spans()


def decompressed(body: bytes, encoding: str | None, *, limit: int = MAX_BODY_BYTES) -> bytes:
    """A body as its `Content-Encoding` says (gzip or deflate, as collectors send it), up to
    `limit` bytes decompressed; ValueError past it or for another coding."""
    coding = (encoding or "identity").strip().lower()
    if coding == "identity":
        return body
    if coding not in ("gzip", "deflate", "x-gzip"):
        raise ValueError(f"Content-Encoding {coding!r} is not supported (gzip, deflate)")
    wbits = 16 + zlib.MAX_WBITS if coding != "deflate" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"a {coding} body that does not decompress: {exc}") from None
    if len(out) > limit:
        raise ValueError(f"more than {limit >> 20} MiB decompressed")
    return out


def read_span_file(path: Path) -> pl.DataFrame:
    """Spans from a file: OTLP JSON (a collector's file exporter: one document per line),
    Jaeger's or Tempo's JSON answer, or an OTLP protobuf body; gzip-compressed or not.
    A LoadgenError says which file and what is wrong with it."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LoadgenError(f"{path}: cannot read the span file: {exc.strerror}") from None
    try:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        if data.lstrip()[:1] in (b"{", b"["):
            return spans_from_json(data)
        return spans_from_protobuf(data)
    except (ValueError, KeyError, TypeError, EOFError, OSError) as exc:
        raise LoadgenError(
            f"{path}: not a span file loadgen reads ({exc}); give OTLP JSON as a collector's "
            "file exporter writes it, or Jaeger's or Tempo's JSON for a trace"
        ) from None


def read_span_parts(parts: list[Path]) -> pl.DataFrame:
    """The spans of the bodies a receiver kept (`server-spans.parts/`: `.pb` protobuf,
    `.json` OTLP JSON), in order; a part that no longer decodes is left out (the receiver
    checked each before it answered 200)."""
    frames = []
    for path in parts:
        body = path.read_bytes()
        try:
            frames.append(spans_from_json(body) if path.suffix == ".json"
                          else spans_from_protobuf(body))  # fmt: skip
        except ValueError:
            continue
    return pl.concat(frames) if frames else empty_spans()


def read_spans(run_dir: Path) -> pl.DataFrame | None:
    """A run's spans: `server-spans.parquet`, else the parts of a run that never finished;
    None when it has neither."""
    path = run_dir / SPANS_FILE
    if path.exists():
        return pl.read_parquet(path, glob=False)
    parts = run_dir / SPANS_PARTS_DIR
    if parts.is_dir():
        return read_span_parts(sorted(p for p in parts.iterdir() if p.name.startswith("part-")))
    return None
