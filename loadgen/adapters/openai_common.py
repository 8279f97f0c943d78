"""What OpenAI chat and completions streams share: the body options and event envelope."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import orjson

from loadgen.adapters.protocol import (
    BodyOptions,
    Delta,
    MalformedEvent,
    duration_ms,
    error_message,
    token_count,
    usage_count,
)

# The body fields each of loadgen's options adds (`common_body`): what a strict server may
# refuse (`Adapter.optional_fields`).
OPENAI_OPTIONAL_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"force_output_tokens": ("ignore_eos", "min_tokens"), "include_usage": ("stream_options",)}
)


def common_body(body: dict[str, Any], max_tokens: int, options: BodyOptions) -> dict[str, Any]:
    """Add streaming, usage and output-length options (and the workload's extra fields)."""
    body["model"] = options.model
    body["max_tokens"] = max_tokens
    body["stream"] = True
    if options.include_usage:
        body["stream_options"] = {"include_usage": True}
    if options.force_output_tokens:
        # vLLM, SGLang and TGI-compatible servers honour these, so N is what was planned.
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    if options.extra_body:
        body.update(options.extra_body)
    return body


def parse_envelope(data: bytes) -> tuple[Delta, dict[str, Any] | None]:
    """Decode one `data:` payload: `[DONE]`, an error object, or a chunk with choices.

    Returns the Delta (with done/error/usage filled in) and the first choice, if any.
    """
    delta = Delta()
    if data == b"[DONE]":
        delta.done = True
        return delta, None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise MalformedEvent("not JSON", data) from None
    if not isinstance(obj, dict):
        raise MalformedEvent("not a JSON object", data)
    error = error_message(obj)
    if error is not None:
        delta.error = error
        return delta, None
    usage = obj.get("usage")
    if isinstance(usage, dict):
        delta.completion_tokens = usage_count(
            usage.get("completion_tokens"), "completion_tokens", delta
        )
        delta.prompt_tokens = usage_count(usage.get("prompt_tokens"), "prompt_tokens", delta)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            delta.cached_tokens = usage_count(details.get("cached_tokens"), "cached_tokens", delta)
        _closing(obj, delta)
    choices = obj.get("choices")
    if not choices:
        return delta, None
    if not isinstance(choices, list):
        raise MalformedEvent("choices is not a list", data)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedEvent("choice is not an object", data)
    finish = choice.get("finish_reason")
    if finish:
        delta.finish_reason = str(finish)
        _closing(obj, delta)
    return delta, choice


def _closing(obj: dict[str, Any], delta: Delta) -> None:
    """What a closing chunk (usage or finish) adds: the response id, and llama.cpp's
    `timings` (tools/server/server.cpp: `cache_n` prompt tokens reused from its KV cache,
    `prompt_n`/`prompt_ms` evaluated, `predicted_n`/`predicted_ms` generated). Read only on
    these chunks, so the per-token chunks pay nothing for them."""
    response_id = obj.get("id")
    if isinstance(response_id, str) and response_id:
        delta.response_id = response_id
    timings = obj.get("timings")
    if isinstance(timings, dict):
        delta.server_timings = llama_timings(timings)
        cache_n = token_count(timings.get("cache_n"))
        if cache_n is not None:
            delta.cached_tokens = cache_n


def llama_timings(timings: dict[str, Any]) -> dict[str, Any] | None:
    """llama.cpp's `timings` object by the record's ServerTimings fields (None when it holds
    none of them)."""

    prefill, decode = (
        duration_ms(timings.get("prompt_ms")),
        duration_ms(timings.get("predicted_ms")),
    )
    fields: dict[str, Any] = {
        "prefill_ms": prefill,
        "decode_ms": decode,
        "total_ms": prefill + decode if prefill is not None and decode is not None else None,
        "prefill_tokens": token_count(timings.get("prompt_n")),
        "decode_tokens": token_count(timings.get("predicted_n")),
        "cached_tokens": token_count(timings.get("cache_n")),
    }
    if all(v is None for v in fields.values()):
        return None
    return fields
