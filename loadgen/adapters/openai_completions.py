"""OpenAI text completions (`/v1/completions`), streamed: output is `choices[0].text`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.adapters.openai_common import OPENAI_OPTIONAL_FIELDS, common_body, parse_envelope
from loadgen.adapters.protocol import BodyOptions, Delta, IdField, Message, bearer_headers


class OpenAICompletions:
    """The `openai-completions` adapter."""

    name = "openai-completions"
    default_path = "/v1/completions"
    framing = "sse"
    finish_signal = True  # every chunk stream ends with a choice's finish_reason
    forces_length = True  # ignore_eos + min_tokens
    # The smallest event that carries output (a one-byte text; `Adapter.event_framing`)
    smallest_output_event = b'{"choices":[{"text":"x"}]}'
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
        """The conversation as plain text, one message per paragraph."""
        return common_body({"prompt": "\n\n".join(t for _, t in messages)}, max_tokens, options)

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One chunk: text, finish, usage, errors."""
        delta, choice = parse_envelope(data)
        if choice is None:
            return delta
        text = choice.get("text")
        if isinstance(text, str):
            if text:
                delta.content_chars = len(text)
                delta.text = text
            elif delta.finish_reason is None and delta.completion_tokens is None:
                delta.token_only = True  # a token ending inside a UTF-8 character
        return delta
