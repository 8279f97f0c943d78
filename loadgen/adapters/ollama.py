"""Ollama `/api/chat` and `/api/generate`: NDJSON, one JSON object per line.

Output: `message.content` / `message.thinking` / `message.tool_calls` (chat) or
`response` / `thinking` (generate); content is visible, thinking is reasoning, and an
empty string carries nothing. The last object has `done: true`, `done_reason`,
`prompt_eval_count` (prompt tokens), `eval_count` (N) and the server's own durations in
ns (`total_duration`, `load_duration`, `prompt_eval_duration`, `eval_duration`), kept as
`ServerTimings` in ms. `{"error": "..."}` (before or during the stream) fails it.
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
    duration_ms,
    flatten,
    json_object,
    token_count,
    usage_count,
    with_tool_calls,
)
from loadgen.units import NS_PER_MS

DURATIONS = {  # Ollama field (ns) -> ServerTimings field (ms)
    "total_duration": "total_ms",
    "load_duration": "load_ms",
    "prompt_eval_duration": "prefill_ms",
    "eval_duration": "decode_ms",
}


class _Ollama:
    framing = "ndjson"
    finish_signal = True  # the last line's done: true
    forces_length = False
    request_id_field: IdField | None = None
    priority_field: str | None = "priority"  # vLLM's field (lower first)
    optional_fields: Mapping[str, tuple[str, ...]] = NO_FIELDS

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The key as `Authorization: Bearer` (a proxy in front of Ollama, or its cloud)."""
        return bearer_headers(api_key)

    def target(self, path: str, model: str) -> str:
        """The run's path: the model goes in the body."""
        return path

    @staticmethod
    def _common(body: dict[str, Any], max_tokens: int, options: BodyOptions) -> dict[str, Any]:
        """Model, streaming, `options.num_predict`; `extra_body.options` is merged in.

        Ollama has no way to force the output length: `force_output_tokens` is ignored.
        """
        body["model"] = options.model
        body["stream"] = True
        settings: dict[str, Any] = {"num_predict": max_tokens}
        extra = dict(options.extra_body or {})
        more = extra.pop("options", None)
        if isinstance(more, dict):
            settings.update(more)
        body["options"] = settings
        body.update(extra)
        return body


class OllamaChat(_Ollama):
    """The `ollama-chat` adapter."""

    name = "ollama-chat"
    default_path = "/api/chat"
    # The smallest event that carries output (a one-byte text; `Adapter.event_framing`)
    smallest_output_event = b'{"message":{"content":"x"}}'
    event_framing = len(smallest_output_event) - 1

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """The conversation as chat messages; an agent's tool calls as the assistant's
        `tool_calls` and their results as `role: tool` messages (Ollama's chat shape)."""
        chat: list[dict[str, Any]] = []
        for role, text, call in with_tool_calls(messages):
            message: dict[str, Any] = {"role": role, "content": text}
            if role == "assistant" and call is not None:
                message["tool_calls"] = [{"function": {"name": TOOL_NAME, "arguments": {}}}]
            elif role == "tool":
                message["tool_name"] = TOOL_NAME
            chat.append(message)
        return self._common({"messages": chat}, max_tokens, options)

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One line: content, thinking and tool-call deltas, the final counts, errors."""
        delta, obj = _envelope(data)
        message = obj.get("message")
        if isinstance(message, dict):
            _fill(delta, message.get("content"), message.get("thinking"))
            if message.get("tool_calls"):
                delta.has_tool_call = True
        return delta


class OllamaGenerate(_Ollama):
    """The `ollama-generate` adapter."""

    name = "ollama-generate"
    default_path = "/api/generate"
    # The smallest event that carries output (a one-byte text; `Adapter.event_framing`)
    smallest_output_event = b'{"response":"x"}'
    event_framing = len(smallest_output_event) - 1

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """The conversation flattened to `prompt`; system messages go to `system`."""
        system = flatten([m for m in messages if m[0] == "system"])
        body: dict[str, Any] = {"prompt": flatten([m for m in messages if m[0] != "system"])}
        if system:
            body["system"] = system
        return self._common(body, max_tokens, options)

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One line: response and thinking text, the final counts, errors."""
        delta, obj = _envelope(data)
        _fill(delta, obj.get("response"), obj.get("thinking"))
        return delta


def _envelope(data: bytes) -> tuple[Delta, dict[str, Any]]:
    """Decode one line; fill in error, or done with its counts and timings."""
    delta = Delta()
    obj = json_object(data)
    error = obj.get("error")
    if error:
        delta.error = str(error)
        return delta, {}
    if obj.get("done") is True:
        delta.done = True
        # Ollama before done_reason existed ended with a bare `done: true`: that is the
        # finish signal, recorded as "done".
        delta.finish_reason = str(obj.get("done_reason") or "done")
        delta.completion_tokens = usage_count(obj.get("eval_count"), "eval_count", delta)
        delta.prompt_tokens = usage_count(obj.get("prompt_eval_count"), "prompt_eval_count", delta)
        delta.server_timings = _timings(obj)
    return delta, obj


def _fill(delta: Delta, content: object, thinking: object) -> None:
    if isinstance(content, str) and content:
        delta.content_chars = len(content)
        delta.text = content
    if isinstance(thinking, str) and thinking:
        delta.reasoning_chars = len(thinking)


def _timings(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The final object's durations (ns) in ms, and its token counts."""
    fields: dict[str, Any] = {}
    for key, name in DURATIONS.items():
        fields[name] = duration_ms(obj.get(key), NS_PER_MS)
    fields["prefill_tokens"] = token_count(obj.get("prompt_eval_count"))
    fields["decode_tokens"] = token_count(obj.get("eval_count"))
    if all(v is None for v in fields.values()):
        return None
    return fields
