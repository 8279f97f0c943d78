"""Anthropic Messages (`/v1/messages`), streamed as named SSE events.

Generated output: `content_block_delta` with a `text_delta` (visible content), a
`thinking_delta` (reasoning) or an `input_json_delta` (tool call), and the start of a
`tool_use` (or `redacted_thinking`) content block. Nothing else carries output:
`message_start` (it brings `usage.input_tokens`), `content_block_start` of a text or
thinking block (its text is empty), `signature_delta`, `content_block_stop`, `ping`.
`message_delta` brings the stop reason and the cumulative `usage.output_tokens` (N), and
may bring `usage.input_tokens` (the real API repeats it; LiteLLM's proxy sends it only
there); `message_stop` ends the stream; an `error` event mid-stream fails it, as does a
bare `{"error": ...}` without a `type` (a gateway's). The event type is read from the JSON
`type` field (it repeats the SSE event name).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.adapters.protocol import (
    MAX_USAGE_COUNT,
    NO_FIELDS,
    TOOL_NAME,
    BodyOptions,
    Delta,
    IdField,
    MalformedEvent,
    Message,
    error_message,
    has_tool_messages,
    json_object,
    usage_count,
    with_tool_calls,
)

API_VERSION = "2023-06-01"
TOOL_BLOCKS = ("tool_use", "server_tool_use")


class AnthropicMessages:
    """The `anthropic` adapter."""

    name = "anthropic"
    default_path = "/v1/messages"
    framing = "sse"
    finish_signal = True  # message_delta's stop_reason before message_stop
    forces_length = False
    # The smallest event that carries output (a tool call's start; `Adapter.event_framing`)
    smallest_output_event = b'{"type":"content_block_start","content_block":{"type":"tool_use"}}'
    event_framing = len(smallest_output_event) - 1
    request_id_field: IdField | None = IdField("metadata", "user_id", by_default=True)
    priority_field: str | None = "priority"  # vLLM's field (lower first)
    optional_fields: Mapping[str, tuple[str, ...]] = NO_FIELDS

    def headers(self, api_key: str | None) -> dict[str, str]:
        """`anthropic-version`, and the key as `x-api-key`."""
        headers = {"anthropic-version": API_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def target(self, path: str, model: str) -> str:
        """The run's path: the model goes in the body."""
        return path

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """System messages go to the top-level `system`; the rest are the conversation.

        Anthropic has no way to force the output length: `force_output_tokens` is ignored.
        """
        system = "\n\n".join(text for role, text in messages if role == "system")
        body: dict[str, Any] = {
            "model": options.model,
            "max_tokens": max_tokens,
            "messages": _anthropic_messages(messages),
            "stream": True,
        }
        if system:
            body["system"] = system
        if options.extra_body:
            body.update(options.extra_body)
        return body

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One event, by its JSON `type`."""
        delta = Delta()
        obj = json_object(data)
        kind = obj.get("type")
        if kind == "content_block_delta":
            _block_delta(obj.get("delta"), delta, data)
        elif kind == "message_delta":
            _message_delta(obj, delta)
        elif kind == "content_block_start":
            block = obj.get("content_block")
            block_type = block.get("type") if isinstance(block, dict) else None
            if block_type == "redacted_thinking":
                delta.reasoning_chars = 1  # encrypted reasoning: no text, still output
            elif block_type in TOOL_BLOCKS:  # a tuple: `in` compares, never hashes JSON values
                delta.has_tool_call = True
        elif kind == "message_start":
            message = obj.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                _input_usage(usage, delta)
            if isinstance(message, dict) and isinstance(message.get("id"), str):
                delta.response_id = message["id"]
        elif kind == "message_stop":
            delta.done = True
        else:
            error = error_message(obj)  # `type: error`, or a gateway's bare {"error": ...}
            if error is not None:
                delta.error = error
        return delta


def _block_delta(inner: object, delta: Delta, data: bytes) -> None:
    if not isinstance(inner, dict):
        raise MalformedEvent("content_block_delta without a delta object", data)
    kind = inner.get("type")
    if kind == "text_delta":
        text = inner.get("text")
        if isinstance(text, str) and text:
            delta.content_chars = len(text)
            delta.text = text
    elif kind == "thinking_delta":
        thinking = inner.get("thinking")
        if isinstance(thinking, str) and thinking:
            delta.reasoning_chars = len(thinking)
    elif kind == "input_json_delta":
        partial = inner.get("partial_json")
        delta.has_tool_call = isinstance(partial, str) and bool(partial)
    # signature_delta, citations_delta: no generated output


def _message_delta(obj: dict[str, Any], delta: Delta) -> None:
    inner = obj.get("delta")
    if isinstance(inner, dict) and inner.get("stop_reason"):
        delta.finish_reason = str(inner["stop_reason"])
    usage = obj.get("usage")
    if isinstance(usage, dict):
        delta.completion_tokens = usage_count(usage.get("output_tokens"), "output_tokens", delta)
        _input_usage(usage, delta)


INPUT_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _input_usage(usage: dict[str, Any], delta: Delta) -> None:
    """Prompt tokens (input tokens, including those written to or read from the prompt
    cache) and cached tokens, from `message_start` or `message_delta` (the later wins).

    A sum of 0 is nobody's count (a prompt has at least one token): LiteLLM's proxy sends
    `input_tokens: 0` in `message_start` and the real count in `message_delta.usage`, so 0
    leaves the prompt tokens unset (null when no later event says). Tokens read from the
    prompt cache are its hits; cache_creation_input_tokens were written to it (computed
    this time), so they are not counted as cached.
    """
    counts = [c for k in INPUT_KEYS if (c := usage_count(usage.get(k), k, delta)) is not None]
    total = sum(counts)
    if total and total <= MAX_USAGE_COUNT:
        delta.prompt_tokens = total
        delta.cached_tokens = usage_count(
            usage.get("cache_read_input_tokens"), "cache_read_input_tokens", Delta()
        )


def _anthropic_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The non-system messages; an agent's tool call as the assistant's `tool_use` block
    and its result as a user message's `tool_result` block (the Messages API's shape)."""
    if not has_tool_messages(messages):
        return [{"role": r, "content": t} for r, t in messages if r != "system"]
    result: list[dict[str, Any]] = []
    for role, text, call in with_tool_calls(messages):
        if role == "system":
            continue
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": call, "content": text}
            result.append({"role": "user", "content": [block]})
        elif role == "assistant" and call is not None:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            blocks.append({"type": "tool_use", "id": call, "name": TOOL_NAME, "input": {}})
            result.append({"role": "assistant", "content": blocks})
        else:
            result.append({"role": role, "content": text})
    return result
