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
    """What a closing chunk (usage or finish) adds: the response id, and the server's own
    account of the request where it gives one: llama.cpp's `timings` (tools/server/server.cpp:
    `cache_n` prompt tokens reused from its KV cache, `prompt_n`/`prompt_ms` evaluated,
    `predicted_n`/`predicted_ms` generated), vLLM's `metrics` (`vllm_metrics`) and NVIDIA
    Dynamo's `nvext.timing` (`dynamo_timing`). Read only on these chunks, so the per-token
    chunks pay nothing for them."""
    response_id = obj.get("id")
    if isinstance(response_id, str) and response_id:
        delta.response_id = response_id
    timings = obj.get("timings")
    if isinstance(timings, dict):
        delta.server_timings = llama_timings(timings)
        cache_n = token_count(timings.get("cache_n"))
        if cache_n is not None:
            delta.cached_tokens = cache_n
    metrics = obj.get("metrics")
    if isinstance(metrics, dict):
        delta.server_timings = vllm_metrics(metrics) or delta.server_timings
    nvext = obj.get("nvext")
    if isinstance(nvext, dict) and isinstance(nvext.get("timing"), dict):
        delta.server_timings = dynamo_timing(nvext["timing"]) or delta.server_timings


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


def vllm_metrics(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """vLLM's per-request `metrics` (`--enable-per-request-metrics`; the final usage chunk of
    a stream, so only with `stream_options.include_usage`) by the record's ServerTimings
    fields (None when it holds none of them). vLLM 0.32 builds it from the engine's own
    stamps (vllm/entrypoints/generate/base/serving.py, `build_per_request_timing_metrics`):
    `queue_time_ms` = scheduled − queued (queue_ms), `time_to_first_token_ms` = first token −
    scheduled (prefill_ms: its TTFT starts at scheduling, not at arrival),
    `generation_time_ms` = last token − first token (decode_ms), `mean_itl_ms` (itl_ms).
    It has no arrival-based TTFT: ttft_ms is queue + prefill (from the engine's queue, after
    the HTTP server's parsing and templating), total_ms queue + prefill + decode."""
    queue = duration_ms(metrics.get("queue_time_ms"))
    prefill = duration_ms(metrics.get("time_to_first_token_ms"))
    decode = duration_ms(metrics.get("generation_time_ms"))
    ttft = queue + prefill if queue is not None and prefill is not None else None
    fields: dict[str, Any] = {
        "queue_ms": queue,
        "prefill_ms": prefill,
        "decode_ms": decode,
        "ttft_ms": ttft,
        "total_ms": ttft + decode if ttft is not None and decode is not None else None,
        "itl_ms": duration_ms(metrics.get("mean_itl_ms")),
    }
    return None if all(v is None for v in fields.values()) else fields


def dynamo_timing(timing: dict[str, Any]) -> dict[str, Any] | None:
    """NVIDIA Dynamo's `nvext.timing` (asked for with `nvext.extra_fields: ["timing"]` in the
    body; on the final chunk) by the record's ServerTimings fields (None when it holds none).
    Dynamo's frontend stamps them (lib/llm/src/protocols/common/timing.rs, `TimingInfo`), from
    the request's receipt: `prefill_wait_time_ms` = prefill start − received (queue_ms),
    `prefill_time_ms` = first token − prefill start (prefill_ms), `ttft_ms` = first token −
    received (ttft_ms), `total_time_ms` = finish − received (total_ms). It gives no decode
    time and no mean gap."""
    fields: dict[str, Any] = {
        "queue_ms": duration_ms(timing.get("prefill_wait_time_ms")),
        "prefill_ms": duration_ms(timing.get("prefill_time_ms")),
        "ttft_ms": duration_ms(timing.get("ttft_ms")),
        "total_ms": duration_ms(timing.get("total_time_ms")),
    }
    return None if all(v is None for v in fields.values()) else fields
