"""The server's spans read from every shape they arrive in: OTLP protobuf and JSON, a
collector's file exporter's JSON lines, Tempo's and Jaeger's answers, gzip."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from loadgen.errors import LoadgenError
from loadgen.results.spans import (
    decompressed,
    read_span_file,
    server_fields,
    spans_from_json,
    spans_from_protobuf,
)

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
PARENT = "00f067aa0ba902b7"
START_NS = 1_765_000_000_123_456_789
# vLLM's llm_request attributes (seconds), as output_processor.do_tracing sets them
VLLM = {
    "gen_ai.latency.time_in_queue": 0.25,
    "gen_ai.latency.time_in_model_prefill": 0.125,
    "gen_ai.latency.time_in_model_decode": 0.5,
    "gen_ai.latency.time_to_first_token": 0.4,
    "gen_ai.latency.e2e": 0.9,
    "gen_ai.usage.prompt_tokens": 1000,
    "gen_ai.usage.completion_tokens": 11,
    "gen_ai.request.id": "chatcmpl-abc",
}
# the same, as ServerTimings fields: ms and token counts; itl = decode / (n - 1)
EXPECTED = {
    "queue_ms": 250.0, "prefill_ms": 125.0, "decode_ms": 500.0, "ttft_ms": 400.0,
    "total_ms": 900.0, "prefill_tokens": 1000, "decode_tokens": 11, "itl_ms": 50.0,
    "load_ms": None, "cached_tokens": None,
}  # fmt: skip


def _any(value: object) -> AnyValue:
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    assert isinstance(value, float)
    return AnyValue(double_value=value)


def otlp_request() -> ExportTraceServiceRequest:
    """One vLLM-shaped span in an OTLP export request."""
    request = ExportTraceServiceRequest()
    group = request.resource_spans.add()
    group.resource.attributes.append(KeyValue(key="service.name", value=_any("vllm")))
    span = group.scope_spans.add().spans.add(
        trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(SPAN),
        parent_span_id=bytes.fromhex(PARENT), name="llm_request",
        start_time_unix_nano=START_NS, end_time_unix_nano=START_NS + 900_000_000,
    )  # fmt: skip
    span.attributes.extend(KeyValue(key=k, value=_any(v)) for k, v in VLLM.items())
    return request


def otlp_json(ids: str = "hex") -> dict[str, object]:
    """The same span as OTLP JSON: ids in hex (OTLP's JSON encoding) or base64 (Tempo's)."""

    def ident(hex_text: str) -> str:
        return hex_text if ids == "hex" else base64.b64encode(bytes.fromhex(hex_text)).decode()

    def value(v: object) -> dict[str, object]:
        if isinstance(v, str):
            return {"stringValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}  # int64 is a string in OTLP JSON
        return {"doubleValue": v}

    span = {
        "traceId": ident(TRACE), "spanId": ident(SPAN), "parentSpanId": ident(PARENT),
        "name": "llm_request", "kind": 2, "startTimeUnixNano": str(START_NS),
        "endTimeUnixNano": str(START_NS + 900_000_000),
        "attributes": [{"key": k, "value": value(v)} for k, v in VLLM.items()],
    }  # fmt: skip
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm"}}]}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}


def check_row(row: dict[str, object]) -> None:
    """A decoded row holds the ids, times, request id and every server field."""
    assert row["trace_id"] == TRACE
    assert row["span_id"] == SPAN
    assert row["parent_span_id"] == PARENT
    assert row["name"] == "llm_request"
    assert row["service"] == "vllm"
    assert row["start_unix_ns"] == START_NS
    assert row["end_unix_ns"] == START_NS + 900_000_000
    assert row["server_request_id"] == "chatcmpl-abc"
    for name, value in EXPECTED.items():
        assert row[name] == pytest.approx(value) if value is not None else row[name] is None, name


def test_server_fields_are_vllm_seconds_as_ms() -> None:
    """vLLM's attributes in seconds become ServerTimings' ms; ITL is decode over the gaps."""
    assert server_fields(VLLM) == pytest.approx(EXPECTED)


def test_newer_conventions_and_sglang_cached_tokens() -> None:
    """input/output_tokens (the newer GenAI names) and SGLang's cached_tokens are read."""
    said = server_fields({"gen_ai.usage.input_tokens": 7, "gen_ai.usage.output_tokens": 1,
                          "gen_ai.usage.cached_tokens": 4, "gen_ai.latency.e2e": "x"})  # fmt: skip
    assert (said["prefill_tokens"], said["decode_tokens"], said["cached_tokens"]) == (7, 1, 4)
    assert said["total_ms"] is None  # a string is no figure
    assert said["itl_ms"] is None  # one output token: no gap


def test_protobuf_body() -> None:
    """An OTLP/HTTP protobuf body decodes to one row per span."""
    frame = spans_from_protobuf(otlp_request().SerializeToString())
    assert frame.height == 1
    check_row(frame.row(0, named=True))


def test_json_body_and_file_exporter_lines() -> None:
    """One OTLP JSON document, and several on lines (a collector's file exporter)."""
    check_row(spans_from_json(json.dumps(otlp_json()).encode()).row(0, named=True))
    lines = "\n".join(json.dumps(otlp_json()) for _ in range(3)).encode()
    assert spans_from_json(lines).height == 3


def test_tempo_answer_base64_ids_in_batches() -> None:
    """Tempo's `/api/traces/{id}` answer: `batches`, ids in base64."""
    document = {"batches": otlp_json("base64")["resourceSpans"]}
    check_row(spans_from_json(json.dumps(document).encode()).row(0, named=True))


def test_jaeger_answer() -> None:
    """Jaeger's `/api/traces/{id}` answer: µs times, tags, a CHILD_OF reference."""
    tags = [{"key": k, "type": "string" if isinstance(v, str) else "float64", "value": v}
            for k, v in VLLM.items()]  # fmt: skip
    span = {"traceID": TRACE, "spanID": SPAN, "operationName": "llm_request",
            "references": [{"refType": "CHILD_OF", "traceID": TRACE, "spanID": PARENT}],
            "startTime": START_NS // 1000, "duration": 900_000, "tags": tags,
            "processID": "p1"}  # fmt: skip
    document = {"data": [{"traceID": TRACE, "spans": [span],
                          "processes": {"p1": {"serviceName": "vllm"}}}]}  # fmt: skip
    row = spans_from_json(json.dumps(document).encode()).row(0, named=True)
    assert row["start_unix_ns"] == START_NS // 1000 * 1000  # µs resolution
    assert row["end_unix_ns"] == row["start_unix_ns"] + 900_000_000
    assert (row["trace_id"], row["parent_span_id"], row["service"]) == (TRACE, PARENT, "vllm")
    assert row["queue_ms"] == pytest.approx(250.0)


def test_span_file_gzip_and_protobuf(tmp_path: Path) -> None:
    """A span file may be gzip-compressed, JSON or protobuf."""
    gz = tmp_path / "spans.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(otlp_json()).encode()))
    check_row(read_span_file(gz).row(0, named=True))
    pb = tmp_path / "spans.pb"
    pb.write_bytes(otlp_request().SerializeToString())
    check_row(read_span_file(pb).row(0, named=True))


def test_bad_span_file_is_a_clear_error(tmp_path: Path) -> None:
    """A file that is no span file says which file and what loadgen reads."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}\n{')
    with pytest.raises(LoadgenError, match=r"bad.json: not a span file loadgen reads"):
        read_span_file(bad)
    with pytest.raises(LoadgenError, match="cannot read"):
        read_span_file(tmp_path / "missing.json")


def test_decompression_is_bounded() -> None:
    """gzip and deflate bodies decompress; a bomb past the limit and unknown codings fail."""
    body = b"x" * 5000
    assert decompressed(gzip.compress(body), "gzip") == body
    with pytest.raises(ValueError, match="decompressed"):
        decompressed(gzip.compress(body), "gzip", limit=1000)
    with pytest.raises(ValueError, match="not supported"):
        decompressed(body, "br")
