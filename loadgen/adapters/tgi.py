"""Hugging Face TGI `generate_stream` (`/generate_stream`): one SSE event per token.

Each event is `{"token": {"id", "text", "logprob", "special"}, "generated_text": null,
"details": null}`. A token's text is visible content; a `special` token (EOS, `<|eot_id|>`)
is not output at all: it does not stamp TTFT, is not an output chunk (so the EOS at the
end adds no inter-token gap), and an empty text carries nothing (as everywhere). The last
event also carries `generated_text` and `details` (`finish_reason`, `generated_tokens`,
`input_length`): it ends the stream (TGI sends no `[DONE]`); a stream that ends without it
was cut short. A non-special token with empty text (a partial UTF-8 character) is still
one token (`Delta.token_only`). N is `generated_tokens`
without that last token when it is special, so N counts the tokens a user saw plus any
special tokens mid-stream. `{"error": ..., "error_type": ...}` fails the stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loadgen.adapters.protocol import (
    NO_FIELDS,
    BodyOptions,
    Delta,
    IdField,
    MalformedEvent,
    Message,
    bearer_headers,
    flatten,
    json_object,
    usage_count,
)


class TgiGenerateStream:
    """The `tgi` adapter."""

    name = "tgi"
    default_path = "/generate_stream"
    framing = "sse"
    finish_signal = True  # the last event's details.finish_reason
    forces_length = False
    # The smallest event that carries output (a one-byte text; `Adapter.event_framing`)
    smallest_output_event = b'{"token":{"text":"x"}}'
    event_framing = len(smallest_output_event) - 1
    request_id_field: IdField | None = None
    priority_field: str | None = "priority"  # vLLM's field (lower first)
    optional_fields: Mapping[str, tuple[str, ...]] = NO_FIELDS

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The key as `Authorization: Bearer` (Inference Endpoints)."""
        return bearer_headers(api_key)

    def target(self, path: str, model: str) -> str:
        """The run's path (a TGI server serves one model, named nowhere)."""
        return path

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """The conversation flattened to text; `details` so the last event brings N.

        TGI has no way to force the output length: `force_output_tokens` is ignored.
        `extra_body.parameters` is merged into the generation parameters.
        """
        parameters: dict[str, Any] = {"max_new_tokens": max_tokens, "details": True}
        body: dict[str, Any] = {"inputs": flatten(messages), "parameters": parameters}
        extra = dict(options.extra_body or {})
        more = extra.pop("parameters", None)
        if isinstance(more, dict):
            parameters.update(more)
        body.update(extra)
        return body

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One token event, the final one with details, or an error."""
        delta = Delta()
        obj = json_object(data)
        error = obj.get("error")
        if error:
            kind = obj.get("error_type")
            delta.error = f"{kind}: {error}" if kind else str(error)
            return delta
        token = obj.get("token")
        special = False
        if token is not None:
            if not isinstance(token, dict):
                raise MalformedEvent("token is not an object", data)
            special = token.get("special") is True
            text = token.get("text")
            if not special and isinstance(text, str):
                if text:
                    delta.content_chars = len(text)
                    delta.text = text
                else:
                    delta.token_only = True
        details = obj.get("details")
        if isinstance(details, dict):
            _details(details, special, delta)
        if details is not None or obj.get("generated_text") is not None:
            delta.done = True
        return delta


def _details(details: dict[str, Any], last_is_special: bool, delta: Delta) -> None:
    finish = details.get("finish_reason")
    if finish:
        delta.finish_reason = str(finish)
    generated = usage_count(details.get("generated_tokens"), "generated_tokens", delta)
    if generated is not None:
        delta.completion_tokens = max(0, generated - last_is_special)
    delta.prompt_tokens = usage_count(details.get("input_length"), "input_length", delta)
