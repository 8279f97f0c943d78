"""Preflight: one small streamed request before the run, to fail fast on a wrong target.

Uses httpx (not the engine's lean client): it is off the hot path, and its errors are
well classified. It checks that the URL answers, that the path exists, and that the answer
is a stream this adapter can decode into generated output. Its request is not a planned
request and is not recorded.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import httpx
import orjson

from loadgen.adapters import Adapter, BodyOptions, MalformedEvent, new_decoder
from loadgen.errors import TargetError
from loadgen.transport import Endpoint

# Fields `target.force_output_tokens` adds so that every response has its planned length.
FORCE_FIELDS = ("ignore_eos", "min_tokens")


def preflight(
    endpoint: Endpoint, adapter: Adapter, options: BodyOptions, *, timeout_s: float = 30.0
) -> None:
    """Raise `TargetError` saying what is wrong and how to fix it; return when the target works."""
    url = endpoint.origin + endpoint.target
    shown = endpoint.origin + endpoint.target.split("?", 1)[0]
    fields = adapter.build_body([("user", "Say hello.")], 4, options)
    body = orjson.dumps(fields)
    # What a strict server may reject and the user can turn off (not model, messages, ...).
    optional = [
        f for f in (*FORCE_FIELDS, "stream_options", *(options.extra_body or {})) if f in fields
    ]
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    headers.update(endpoint.headers)
    try:
        with (
            httpx.Client(timeout=timeout_s, verify=True) as client,
            client.stream("POST", url, content=body, headers=headers) as response,
        ):
            if response.status_code >= 400:
                detail = response.read().decode("utf-8", "replace")[:2000].strip()
                raise TargetError(
                    _status_message(shown, response.status_code, detail, adapter, optional)
                )
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
    decoder = new_decoder(adapter)  # SSE or NDJSON, by the adapter's framing
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


def _status_message(
    shown: str, status: int, detail: str, adapter: Adapter, optional: Collection[str]
) -> str:
    hints = {
        401: "check the API key: set the variable named in target.api_key_env",
        403: "the key is not allowed to use this model or endpoint",
        404: f"no {adapter.name} endpoint there: check --url, target.path and target.api",
        422: "the server rejected a request field: try target.force_output_tokens: false "
        "or target.include_usage: false",
        400: "the server rejected the request: check target.model (--model) and target.extra_body",
    }
    hint = None
    if status == 400:
        hint = _pinned_model_hint(detail)
    if status in (400, 422) and hint is None:
        hint = _rejected_fields_hint(detail, optional)
    hint = hint or hints.get(status, "see the server's message")
    return f"{shown} answered HTTP {status}: {detail[:300] or '(no body)'} ({hint})"


def _rejected_fields_hint(detail: str, optional: Collection[str]) -> str | None:
    """What to change when the server names request fields it does not accept.

    Strict servers (Hugging Face `transformers serve`, pydantic `extra="forbid"` APIs)
    answer 422 naming them: `Unexpected fields in the request: {'ignore_eos'}` or a
    validation list with `"loc": ["body", "ignore_eos"]`. Only the optional fields loadgen
    sent count (a name is matched only when quoted, as both forms quote it).
    """
    named = [f for f in optional if re.search(rf"""['"`]{re.escape(f)}['"`]""", detail)]
    if any(f in named for f in FORCE_FIELDS):
        return (
            f"the server rejects {'/'.join(FORCE_FIELDS)}: run with --no-force-output-tokens "
            "or set target.force_output_tokens: false (output lengths then follow the "
            "model's own stops; target.extra_body can carry the server's own way to force them)"
        )
    if "stream_options" in named:
        return "the server rejects stream_options: set target.include_usage: false"
    if named:
        return (
            f"the server rejects {', '.join(named)}: remove them from target.extra_body "
            "(or from what target.api sends)"
        )
    return None


def _pinned_model_hint(detail: str) -> str | None:
    """Servers that serve one model and refuse any other name (transformers serve:
    `Server is pinned to <model>`): name the model to pass."""
    match = re.search(r"pinned to (?:the model )?['\"`]?([^'\"`\s,;()]+)", detail)
    if match is None:
        return None
    model = match.group(1).rstrip(".")
    return f"the server serves only {model!r}: pass --model {model} or set target.model: {model}"


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text.split("] ", 1)[-1]
