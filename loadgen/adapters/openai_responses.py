"""OpenAI Responses (`/v1/responses`), streamed as typed SSE events.

Output: `response.output_text.delta` and `response.refusal.delta` (visible content),
`response.reasoning_text.delta` and `response.reasoning_summary_text.delta` (reasoning),
`response.function_call_arguments.delta` (tool call). `response.completed` ends the
stream with `usage` (`input_tokens`; `output_tokens`, which includes
`output_tokens_details.reasoning_tokens`). `response.incomplete` ends it too when the
reason is `max_output_tokens` (the planned length was reached: finish `length`); for any
other reason it fails, as do `response.failed` and `error`. Every other event (created,
in_progress, output_item.added, content_part.added, *.done) carries no output. The type is
read from the JSON `type` field (it repeats the SSE event name). There is no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadgen.adapters.protocol import (
    TOOL_NAME,
    BodyOptions,
    Delta,
    Message,
    bearer_headers,
    has_tool_messages,
    json_object,
    token_count,
    with_tool_calls,
)

CONTENT = frozenset({"response.output_text.delta", "response.refusal.delta"})
REASONING = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
TOOL_CALL = frozenset(
    {"response.function_call_arguments.delta", "response.custom_tool_call_input.delta"}
)
ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class OpenAIResponses:
    """The `openai-responses` adapter."""

    name = "openai-responses"
    default_path = "/v1/responses"
    framing = "sse"
    finish_signal = True  # response.completed / response.incomplete
    forces_length = False

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The key as `Authorization: Bearer`."""
        return bearer_headers(api_key)

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """The conversation as input messages; `max_output_tokens` caps the output.

        The Responses API has no way to force the output length: `force_output_tokens` is
        ignored.
        """
        body: dict[str, Any] = {
            "model": options.model,
            "input": _input(messages),
            "max_output_tokens": max_tokens,
            "stream": True,
        }
        if options.extra_body:
            body.update(options.extra_body)
        return body

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One event, by its JSON `type`."""
        delta = Delta()
        obj = json_object(data)
        kind = obj.get("type")
        if not isinstance(kind, str):
            return delta
        if kind in CONTENT:
            text = obj.get("delta")
            if isinstance(text, str) and text:
                delta.content_chars = len(text)
                delta.text = text
        elif kind in REASONING:
            text = obj.get("delta")
            if isinstance(text, str) and text:
                delta.reasoning_chars = len(text)
        elif kind in TOOL_CALL:
            arguments = obj.get("delta")
            delta.has_tool_call = isinstance(arguments, str) and bool(arguments)
        elif kind in ENDS:
            _end(kind, obj.get("response"), delta)
        elif kind == "error":
            message = obj.get("message") or obj.get("code") or "error event"
            delta.error = str(message)
        return delta


def _end(kind: str, response: object, delta: Delta) -> None:
    """A terminal event: usage, and done or an error."""
    if not isinstance(response, dict):
        response = {}
    usage = response.get("usage")
    if isinstance(usage, dict):
        delta.completion_tokens = token_count(usage.get("output_tokens"))
        delta.prompt_tokens = token_count(usage.get("input_tokens"))
        details = usage.get("input_tokens_details")
        if isinstance(details, dict):
            delta.cached_tokens = token_count(details.get("cached_tokens"))
    if isinstance(response.get("id"), str):
        delta.response_id = response["id"]
    if kind == "response.completed":
        delta.done = True
        delta.finish_reason = "stop"
        return
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if kind == "response.incomplete" and reason == "max_output_tokens":
        delta.done = True
        delta.finish_reason = "length"
        return
    error = response.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    delta.error = str(message or f"{kind} ({reason or 'no reason given'})")


def _input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Input items; an agent's tool call as a `function_call` item after the assistant's
    message and its result as a `function_call_output` item (the Responses API's shape)."""
    if not has_tool_messages(messages):
        return [{"role": r, "content": t} for r, t in messages]
    items: list[dict[str, Any]] = []
    for role, text, call in with_tool_calls(messages):
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": call, "output": text})
            continue
        items.append({"role": role, "content": text})
        if role == "assistant" and call is not None:
            items.append({"type": "function_call", "call_id": call, "name": TOOL_NAME,
                          "arguments": "{}"})  # fmt: skip
    return items
