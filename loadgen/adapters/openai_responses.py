"""OpenAI Responses (`/v1/responses`), streamed as typed SSE events.

Output: `response.output_text.delta` and `response.refusal.delta` (visible content),
`response.reasoning_text.delta` and `response.reasoning_summary_text.delta` (reasoning),
`response.function_call_arguments.delta` (tool call). A terminal event
(`response.completed`, `response.incomplete`, `response.failed`) ends the stream with
`usage` (`input_tokens`; `output_tokens`, which includes
`output_tokens_details.reasoning_tokens`); the end is its `response.status`, whichever event
carried it: `completed` (finish `stop`), `incomplete` with `incomplete_details.reason`
`max_output_tokens` (the planned length was reached: finish `length`), `cancelled` (an
abort: finish `cancelled`, `truncated`); `failed` or any other status or reason
(`content_filter`) fails it, as does an `error` event (with or without a `type`). Every other event
(created, in_progress, output_item.added, content_part.added, *.done) carries no output. The
type is read from the JSON `type` field (it repeats the SSE event name). No `[DONE]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.adapters.protocol import (
    NO_FIELDS,
    TOOL_NAME,
    BodyOptions,
    Delta,
    IdField,
    Message,
    bearer_headers,
    error_message,
    has_tool_messages,
    json_object,
    usage_count,
    with_tool_calls,
)

CONTENT = frozenset({"response.output_text.delta", "response.refusal.delta"})
REASONING = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
TOOL_CALL = frozenset(
    {"response.function_call_arguments.delta", "response.custom_tool_call_input.delta"}
)
# The terminal events and the status each implies when the response object gives none.
# The status inside decides the end: vLLM and llama-server end every stream with
# `response.completed` and put `incomplete` (reason `max_output_tokens`) or `cancelled`
# (an aborted request) in its `response.status`, where OpenAI sends `response.incomplete`.
END_STATUS = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
ENDS = frozenset(END_STATUS)
END_STATUSES = ("completed", "incomplete", "cancelled", "failed")  # a tuple: JSON may be a list
# `incomplete_details.reason` of an incomplete response that is the planned end, as the
# finish reason it records: the length cap. Any other reason (`content_filter`) fails it.
INCOMPLETE_ENDS = {"max_output_tokens": "length"}


class OpenAIResponses:
    """The `openai-responses` adapter."""

    name = "openai-responses"
    default_path = "/v1/responses"
    framing = "sse"
    finish_signal = True  # response.completed / response.incomplete
    forces_length = False
    # The smallest event that carries output (a one-byte text; `Adapter.event_framing`)
    smallest_output_event = b'{"type":"response.refusal.delta","delta":"x"}'
    event_framing = len(smallest_output_event) - 1
    request_id_field: IdField | None = IdField("metadata", "request_id", by_default=True)
    priority_field: str | None = "priority"  # vLLM's field (lower first)
    optional_fields: Mapping[str, tuple[str, ...]] = NO_FIELDS

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The key as `Authorization: Bearer`."""
        return bearer_headers(api_key)

    def target(self, path: str, model: str) -> str:
        """The run's path: the model goes in the body."""
        return path

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
        """One event, by its JSON `type`; an object with an `error` (typed or not) fails it."""
        delta = Delta()
        obj = json_object(data)
        kind = obj.get("type")
        if not isinstance(kind, str) or kind == "error":
            error = error_message(obj)
            if error is not None:
                delta.error = error
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
        return delta


def _end(kind: str, response: object, delta: Delta) -> None:
    """A terminal event: usage, then the end its `response.status` says (`END_STATUS`)."""
    if not isinstance(response, dict):
        response = {}
    usage = response.get("usage")
    if isinstance(usage, dict):
        delta.completion_tokens = usage_count(usage.get("output_tokens"), "output_tokens", delta)
        delta.prompt_tokens = usage_count(usage.get("input_tokens"), "input_tokens", delta)
        details = usage.get("input_tokens_details")
        if isinstance(details, dict):
            delta.cached_tokens = usage_count(details.get("cached_tokens"), "cached_tokens", delta)
    if isinstance(response.get("id"), str):
        delta.response_id = response["id"]
    status = response.get("status")
    if status not in END_STATUSES:  # left out, or not an end (`in_progress`): the event's
        status = END_STATUS[kind]
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if status == "completed":
        delta.done, delta.finish_reason = True, "stop"
    elif status == "incomplete" and reason in INCOMPLETE_ENDS:
        delta.done, delta.finish_reason = True, INCOMPLETE_ENDS[reason]
    elif status == "cancelled":
        delta.done, delta.finish_reason = True, "cancelled"  # an abort: `truncated`
    else:
        error = response.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        said = f"status {status!r}" + (f", {reason}" if reason else "")
        delta.error = str(message or f"{kind} ({said})")


def _input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Input items, each message with an explicit `"type": "message"` (optional in the spec,
    but llama-server answers 400 "Cannot determine type of 'item'" to an assistant item
    without it); an agent's tool call as a `function_call` item after the assistant's
    message and its result as a `function_call_output` item (the Responses API's shape)."""
    if not has_tool_messages(messages):
        return [_message_item(r, t) for r, t in messages]
    items: list[dict[str, Any]] = []
    for role, text, call in with_tool_calls(messages):
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": call, "output": text})
            continue
        items.append(_message_item(role, text))
        if role == "assistant" and call is not None:
            items.append({"type": "function_call", "call_id": call, "name": TOOL_NAME,
                          "arguments": "{}"})  # fmt: skip
    return items


def _message_item(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}
