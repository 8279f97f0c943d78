"""OpenAI chat completions (`/v1/chat/completions`), streamed.

Generated output is `delta.content`, `delta.reasoning_content` / `delta.reasoning`
(vLLM, SGLang, DeepSeek) or `delta.tool_calls`. A role-only delta, `content: null` or an
empty string carries nothing visible. A delta that is only `{"content": ""}` (no role, no
finish, no tool call) is a token whose text is empty (`Delta.token_only`): llama-cpp-python's
server sends one for each token that ends inside a UTF-8 character (llama_cpp/llama.py,
`_create_completion`: the tail of a stream is sent one token per chunk, each decoded with
`errors="ignore"`), and vLLM streams a token that decodes to no text yet the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.adapters.openai_common import OPENAI_OPTIONAL_FIELDS, common_body, parse_envelope
from loadgen.adapters.protocol import (
    TOOL_NAME,
    BodyOptions,
    Delta,
    IdField,
    Message,
    bearer_headers,
    has_tool_messages,
    with_tool_calls,
)


class OpenAIChat:
    """The `openai-chat` adapter."""

    name = "openai-chat"
    default_path = "/v1/chat/completions"
    framing = "sse"
    finish_signal = True  # every chunk stream ends with a choice's finish_reason
    forces_length = True  # ignore_eos + min_tokens
    # The smallest event that carries output (a one-byte text; `Adapter.event_framing`)
    smallest_output_event = b'{"choices":[{"delta":{"content":"x"}}]}'
    event_framing = len(smallest_output_event) - 1
    # `user`, which LiteLLM books as an end user: sent only with `body: on`
    request_id_field: IdField | None = IdField("user")
    priority_field: str | None = "priority"  # vLLM's field (lower first)
    optional_fields: Mapping[str, tuple[str, ...]] = OPENAI_OPTIONAL_FIELDS

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The key as `Authorization: Bearer`."""
        return bearer_headers(api_key)

    def target(self, path: str, model: str) -> str:
        """The run's path: the model goes in the body."""
        return path

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """The conversation as chat messages; an agent's tool calls as the assistant's
        `tool_calls` and their results as `role: tool` messages."""
        if has_tool_messages(messages):
            chat = [_chat_message(r, t, call) for r, t, call in with_tool_calls(messages)]
        else:
            chat = [{"role": r, "content": t} for r, t in messages]
        return common_body({"messages": chat}, max_tokens, options)

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One chunk: text, reasoning and tool-call deltas, finish, usage, errors."""
        delta, choice = parse_envelope(data)
        if choice is None:
            return delta
        message = choice.get("delta")
        if not isinstance(message, dict):
            return delta
        content = message.get("content")
        if isinstance(content, str):
            if content:
                delta.content_chars = len(content)
                delta.text = content
            elif len(message) == 1 and delta.finish_reason is None:
                delta.token_only = True
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            delta.reasoning_chars = len(reasoning)
        if message.get("tool_calls"):
            delta.has_tool_call = True
        return delta


def _chat_message(role: str, text: str, call: str | None) -> dict[str, Any]:
    """One message of a conversation with tool calls (OpenAI chat completions shape)."""
    if role == "tool":
        return {"role": "tool", "tool_call_id": call, "content": text}
    if role == "assistant" and call is not None:
        function = {"name": TOOL_NAME, "arguments": "{}"}
        return {"role": "assistant", "content": text or None,
                "tool_calls": [{"id": call, "type": "function", "function": function}]}  # fmt: skip
    return {"role": role, "content": text}
