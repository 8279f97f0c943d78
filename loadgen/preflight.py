"""Preflight: one small streamed request before the run, to fail fast on a wrong target.

Uses httpx (not the engine's lean client): it is off the hot path, and its errors are
well classified. It checks that the URL answers, that the path exists, and that the answer
is a stream this adapter can decode into generated output. Its request is not a planned
request and is not recorded.
"""

from __future__ import annotations

import httpx
import orjson

from loadgen.adapters import Adapter, BodyOptions, MalformedEvent
from loadgen.errors import TargetError
from loadgen.sse import SseDecoder
from loadgen.transport import Endpoint


def preflight(
    endpoint: Endpoint, adapter: Adapter, options: BodyOptions, *, timeout_s: float = 30.0
) -> None:
    """Raise `TargetError` saying what is wrong and how to fix it; return when the target works."""
    url = endpoint.origin + endpoint.target
    shown = endpoint.origin + endpoint.target.split("?", 1)[0]
    body = orjson.dumps(adapter.build_body([("user", "Say hello.")], 4, options))
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    headers.update(endpoint.headers)
    try:
        with (
            httpx.Client(timeout=timeout_s, verify=True) as client,
            client.stream("POST", url, content=body, headers=headers) as response,
        ):
            if response.status_code >= 400:
                detail = response.read().decode("utf-8", "replace")[:300].strip()
                raise TargetError(_status_message(shown, response.status_code, detail, adapter))
            _check_stream(response, shown, adapter)
    except httpx.ConnectError as exc:
        raise TargetError(
            f"cannot connect to {endpoint.origin}: {_reason(exc)} "
            "(is the server running and listening there? check --url)"
        ) from None
    except httpx.TimeoutException:
        raise TargetError(
            f"{shown} did not answer a 4-token streamed request within {timeout_s:g} s "
            "(is the server overloaded or still loading its model?)"
        ) from None
    except httpx.HTTPError as exc:
        raise TargetError(f"{shown}: {_reason(exc)}") from None


def _check_stream(response: httpx.Response, shown: str, adapter: Adapter) -> None:
    decoder = SseDecoder()
    for chunk in response.iter_raw():
        for event, data in decoder.feed(chunk):
            try:
                delta = adapter.parse(event, data)
            except MalformedEvent as exc:
                raise TargetError(
                    f"{shown} answered, but not with a {adapter.name} stream: {exc} "
                    "(check target.api in the workload)"
                ) from None
            if delta.error:
                raise TargetError(f"{shown} sent an error event: {delta.error}")
            if delta.has_output:
                return
    raise TargetError(
        f"{shown} answered HTTP {response.status_code} but streamed no generated output "
        f"(content-type {response.headers.get('content-type', 'none')!r}; does it support "
        "stream: true? check target.api and target.path)"
    )


def _status_message(shown: str, status: int, detail: str, adapter: Adapter) -> str:
    hints = {
        401: "check the API key: set the variable named in target.api_key_env",
        403: "the key is not allowed to use this model or endpoint",
        404: f"no {adapter.name} endpoint there: check --url, target.path and target.api",
        422: "the server rejected a request field: try target.force_output_tokens: false "
        "or target.include_usage: false",
        400: "the server rejected the request: check target.model and target.extra_body",
    }
    hint = hints.get(status, "see the server's message")
    return f"{shown} answered HTTP {status}: {detail or '(no body)'} ({hint})"


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.split("] ", 1)[-1]
