"""`report --spans-from URL`: a finished run's spans asked of Jaeger or Tempo by trace id.

Both serve `GET {URL}/api/traces/{trace id}` (Jaeger's query service, v1 and v2, on
:16686; Tempo's HTTP API on :3200): Jaeger answers with its own JSON (`data[].spans[]`),
Tempo with OTLP JSON (`batches`, or `trace` in its v2 API); `results.spans` reads either.
One request per trace id the records carry (their `traceparent`), a few at a time, each
with one overall deadline and its body read to a cap (never whole); a trace the backend does
not hold (404) is simply not there: the join counts what is missing. Any other refusal stops
the query with what it said. The requests take the command's TLS trust and proxy
(`engine.network`), as every other connection loadgen makes: a tracing backend behind a
company CA is trusted by --cacert or the system store, not by a bundle of httpx's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import anyio
import httpx
import orjson
import polars as pl

from loadgen.engine.fetch import fetch
from loadgen.engine.network import Network
from loadgen.engine.tls import find_verify_error, verify_failure
from loadgen.errors import LoadgenError
from loadgen.results.spans import empty_spans, spans_from_json_document

QUERY_PATH = "/api/traces/{trace_id}"
PARALLEL = 8  # requests in flight: a query service answers each from its storage
MAX_TRACE_BYTES = 16 << 20


def query_spans(
    base_url: str, trace_ids: Sequence[str], network: Network, *, timeout_s: float = 10.0
) -> pl.DataFrame:
    """Every span of `trace_ids` the backend at `base_url` holds (a LoadgenError when it
    cannot be reached or refuses)."""
    base = base_url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise LoadgenError(f"--spans-from: {base_url!r} is not an http(s) URL "
                           "(e.g. http://127.0.0.1:16686 for Jaeger, :3200 for Tempo)")  # fmt: skip
    return anyio.run(_query, base, list(trace_ids), network, timeout_s)


async def _query(
    base: str, trace_ids: list[str], network: Network, timeout_s: float
) -> pl.DataFrame:
    frames: list[pl.DataFrame] = [empty_spans()] * len(trace_ids)
    limit = anyio.Semaphore(PARALLEL)
    options = network.httpx_options(base)
    headers = {"Accept": "application/json"}
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers, **options) as client:

        async def one(index: int, trace_id: str) -> None:
            url = base + QUERY_PATH.format(trace_id=trace_id)
            async with limit:
                try:
                    got = await fetch(client, "GET", url, deadline_s=timeout_s,
                                      max_bytes=MAX_TRACE_BYTES)  # fmt: skip
                except TimeoutError:
                    raise LoadgenError(f"--spans-from: {url}: no whole answer within "
                                       f"{timeout_s:g} s") from None  # fmt: skip
                except httpx.HTTPError as exc:
                    why = f"{exc}"
                    if (failed := find_verify_error(exc)) is not None:
                        where = urlsplit(base).netloc
                        why = verify_failure(failed, where, network.tls,
                                             host=urlsplit(base).hostname or "")  # fmt: skip
                    raise LoadgenError(f"--spans-from: {url}: {why}") from None
            if got.status == 404:
                return
            if got.status != 200 or got.cut:
                said = "an answer over 16 MiB" if got.cut and got.status == 200 else (
                    got.body[:200].decode("utf-8", "replace").strip())  # fmt: skip
                raise LoadgenError(f"--spans-from: {url} answered {got.status}: {said}")
            try:
                frames[index] = spans_from_json_document(orjson.loads(got.body))
            except (orjson.JSONDecodeError, ValueError, KeyError, TypeError) as exc:
                raise LoadgenError(f"--spans-from: {url}: not a trace loadgen reads "
                                   f"(Jaeger's or Tempo's JSON): {exc}") from None  # fmt: skip

        failed: list[LoadgenError] = []

        async def guarded(index: int, trace_id: str) -> None:
            try:
                await one(index, trace_id)
            except LoadgenError as exc:  # the first one is said; the rest end on their own
                failed.append(exc)  # (each within its deadline: a cancelled TLS handshake
                # would leave its socket to the garbage collector)

        async with anyio.create_task_group() as group:
            for index, trace_id in enumerate(trace_ids):
                group.start_soon(guarded, index, trace_id)
    if failed:
        raise failed[0]
    return pl.concat(frames)
