"""`report --spans-from URL`: a finished run's spans asked of Jaeger or Tempo by trace id.

Both serve `GET {URL}/api/traces/{trace id}` (Jaeger's query service, v1 and v2, on
:16686; Tempo's HTTP API on :3200): Jaeger answers with its own JSON (`data[].spans[]`),
Tempo with OTLP JSON (`batches`, or `trace` in its v2 API); `results.spans` reads either.
One request per trace id the records carry (their `traceparent`), a few at a time, each
with one overall deadline; a trace the backend does not hold (404) is simply not there:
the join counts what is missing. Any other refusal stops the query with what it said.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import polars as pl

from loadgen.errors import LoadgenError
from loadgen.results.spans import empty_spans, spans_from_json_document

QUERY_PATH = "/api/traces/{trace_id}"
PARALLEL = 8  # requests in flight: a query service answers each from its storage
MAX_TRACE_BYTES = 16 << 20


def query_spans(
    base_url: str, trace_ids: Sequence[str], *, timeout_s: float = 10.0
) -> pl.DataFrame:
    """Every span of `trace_ids` the backend at `base_url` holds (a LoadgenError when it
    cannot be reached or refuses)."""
    base = base_url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise LoadgenError(f"--spans-from: {base_url!r} is not an http(s) URL "
                           "(e.g. http://127.0.0.1:16686 for Jaeger, :3200 for Tempo)")  # fmt: skip
    with httpx.Client(timeout=timeout_s, headers={"Accept": "application/json"}) as client:

        def one(trace_id: str) -> pl.DataFrame:
            url = base + QUERY_PATH.format(trace_id=trace_id)
            try:
                answer = client.get(url)
            except httpx.HTTPError as exc:
                raise LoadgenError(f"--spans-from: {url}: {exc}") from None
            if answer.status_code == 404:
                return empty_spans()
            if answer.status_code != 200 or len(answer.content) > MAX_TRACE_BYTES:
                said = answer.text[:200].strip()
                raise LoadgenError(f"--spans-from: {url} answered {answer.status_code}: {said}")
            try:
                return spans_from_json_document(orjson.loads(answer.content))
            except (orjson.JSONDecodeError, ValueError, KeyError, TypeError) as exc:
                raise LoadgenError(f"--spans-from: {url}: not a trace loadgen reads "
                                   f"(Jaeger's or Tempo's JSON): {exc}") from None  # fmt: skip

        with ThreadPoolExecutor(PARALLEL) as pool:
            frames = list(pool.map(one, trace_ids))
    return pl.concat([empty_spans(), *frames])
