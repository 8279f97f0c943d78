"""`loadgen sim --otlp-traces-endpoint URL`: the simulator's own span per request, as vLLM's.

One `llm_request` span per generation request that reached the engine, with vLLM's
attribute names and meanings (`vllm/v1/engine/output_processor.py`, `do_tracing`), in
seconds: `gen_ai.latency.time_in_queue` = scheduled − queued and
`gen_ai.latency.time_in_model_prefill` = first token − scheduled, from the engine's own
times (exact: the same numbers the trace file's `engine` object holds, `queued_sim_ns`,
`scheduled_sim_ns`, `first_token_sim_ns`, divided by `--speed` into real seconds);
`time_in_model_decode` = last token − first token (engine times likewise);
`time_to_first_token` and `e2e` from the request's arrival at the server's door
(`received_ns`) to its first token's write and to its end; `gen_ai.usage.prompt_tokens`,
`completion_tokens`, `cached_tokens` (SGLang's name, with a prefix cache) and
`gen_ai.request.id`: the dialect's id prefix + the incoming `X-Request-Id` (vLLM's
"chatcmpl-" + it), else the response's id. The span is parented under an incoming W3C
`traceparent` (same trace id, its span id as the parent); a `traceparent` whose sampled
flag is off (`-00`) gets no span, as vLLM's sampler drops it; without one the span is a
root of a new trace.

Spans are batched and POSTed as OTLP/HTTP protobuf from a thread of their own every
`EXPORT_INTERVAL_S` (the engine's loop only appends to a list), and once more at shutdown.
A failed export is counted and said once on stderr, as the SDK's exporter does; the
simulator serves on. Needs the `opentelemetry-proto` package (`pip install 'loadgen[spans]'`).
"""

from __future__ import annotations

import http.client
import os
import sys
import threading
import time
import urllib.parse
from typing import Any, Literal

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

EXPORT_INTERVAL_S = 0.5
SPAN_NAME = "llm_request"  # vLLM's
_NS_PER_S = 1_000_000_000


def parse_traceparent(value: str | None) -> tuple[bytes, bytes] | Literal[False] | None:
    """(trace id, parent span id) of a sampled W3C `traceparent`; False when it is not
    sampled (no span); None when absent or malformed (a root span)."""
    if not value:
        return None
    parts = value.strip().lower().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, parent, flags = (
            bytes.fromhex(parts[1]),
            bytes.fromhex(parts[2]),
            int(parts[3], 16),
        )
    except ValueError:
        return None
    if not any(trace_id) or not any(parent):
        return None
    return (trace_id, parent) if flags & 1 else False


def _kv(key: str, value: float | int | str) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def span_of(
    record: dict[str, Any], *, request_id: str, traceparent: str | None, speed: float,
    unix_offset_ns: int,
) -> Span | None:  # fmt: skip
    """The span of one ended request's trace record, which reached the engine (None: not
    sampled). `unix_offset_ns`: the wall clock minus the monotonic clock."""
    parent = parse_traceparent(traceparent)
    if parent is False:
        return None
    trace_id, parent_id = parent if parent else (os.urandom(16), b"")
    received, done = record["received_ns"], record["done_ns"]
    attributes: list[KeyValue] = [
        _kv("gen_ai.request.id", request_id),
        _kv("gen_ai.usage.prompt_tokens", int(record["prompt_tokens"])),
        _kv("gen_ai.usage.completion_tokens", int(record["output_tokens"])),
        _kv("gen_ai.latency.e2e", (done - received) / _NS_PER_S),
    ]
    if record.get("cached_tokens") is not None:
        attributes.append(_kv("gen_ai.usage.cached_tokens", int(record["cached_tokens"])))
    if (engine := record.get("engine")) is not None:  # it reached its first token
        queued, scheduled = engine["queued_sim_ns"], engine["scheduled_sim_ns"]
        first, last = engine["first_token_sim_ns"], engine["last_token_sim_ns"]
        engine_s = speed * _NS_PER_S  # engine ns -> real seconds
        attributes += [
            _kv("gen_ai.latency.time_in_queue", (scheduled - queued) / engine_s),
            _kv("gen_ai.latency.time_in_model_prefill", (first - scheduled) / engine_s),
            _kv("gen_ai.latency.time_in_model_decode", (last - first) / engine_s),
            _kv("gen_ai.latency.time_in_model_inference", (last - scheduled) / engine_s),
        ]
    if record.get("first_token_ns") is not None:
        ttft_s = (record["first_token_ns"] - received) / _NS_PER_S
        attributes.append(_kv("gen_ai.latency.time_to_first_token", ttft_s))
    return Span(
        trace_id=trace_id, span_id=os.urandom(8), parent_span_id=parent_id, name=SPAN_NAME,
        kind=Span.SpanKind.SPAN_KIND_SERVER, start_time_unix_nano=received + unix_offset_ns,
        end_time_unix_nano=done + unix_offset_ns, attributes=attributes,
    )  # fmt: skip


class SpanExporter:
    """Batches spans and POSTs them to `url` from a thread of its own."""

    def __init__(self, url: str, *, service: str, speed: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"{url!r} is not an http(s) URL")
        self._url = parsed
        self._service = service
        self._speed = speed
        self._offset_ns = time.time_ns() - time.perf_counter_ns()
        self._pending: list[tuple[dict[str, Any], str, str | None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.exported = 0
        self.failures = 0
        self._thread = threading.Thread(target=self._loop, name="sim-spans", daemon=True)
        self._thread.start()

    def add(self, record: dict[str, Any], request_id: str, traceparent: str | None) -> None:
        """Queue one ended request's span (on the engine's loop: an append)."""
        with self._lock:
            self._pending.append((record, request_id, traceparent))

    def _loop(self) -> None:
        while not self._stop.wait(EXPORT_INTERVAL_S):
            self._export()
        self._export()

    def _export(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        spans = []
        for record, request_id, traceparent in batch:
            span = span_of(record, request_id=request_id, traceparent=traceparent,
                           speed=self._speed, unix_offset_ns=self._offset_ns)  # fmt: skip
            if span is not None:
                spans.append(span)
        if not spans:
            return
        message = ExportTraceServiceRequest()
        group = message.resource_spans.add()
        group.resource.attributes.append(_kv("service.name", self._service))
        group.scope_spans.add().spans.extend(spans)
        try:
            self._post(message.SerializeToString())
            self.exported += len(spans)
        except (OSError, http.client.HTTPException, RuntimeError) as exc:
            self.failures += 1
            if self.failures == 1:
                said = f"loadgen sim: exporting spans to {self._url.geturl()} failed: {exc}"
                print(f"{said} (later failures are counted, not said)", file=sys.stderr, flush=True)

    def _post(self, body: bytes) -> None:
        url = self._url
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        connection = kind(url.hostname or "", url.port, timeout=10)
        try:
            connection.request("POST", url.path or "/v1/traces", body,
                               {"Content-Type": "application/x-protobuf"})  # fmt: skip
            response = connection.getresponse()
            response.read()
            if response.status >= 300:
                raise RuntimeError(f"HTTP {response.status}")
        finally:
            connection.close()

    def close(self) -> None:
        """Export what is pending and stop."""
        self._stop.set()
        self._thread.join(timeout=15)
