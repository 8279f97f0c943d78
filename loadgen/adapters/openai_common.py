"""What OpenAI chat and completions streams share: the body options and event envelope."""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.adapters.protocol import BodyOptions, Delta, MalformedEvent


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
    error = obj.get("error")
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        delta.error = str(message)
        return delta, None
    usage = obj.get("usage")
    if isinstance(usage, dict):
        completion, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
        if isinstance(completion, int):
            delta.completion_tokens = completion
        if isinstance(prompt, int):
            delta.prompt_tokens = prompt
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
    return delta, choice
