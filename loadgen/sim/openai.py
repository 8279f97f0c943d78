"""OpenAI-compatible request parsing and response bytes for the simulator.

Written independently of the client's adapters on purpose: the simulator exists to
check the client, so the two must not share a bug.

Token accounting: prompt tokens are whitespace-separated words of the request text (for
chat, every message's text content; roles and the template add nothing). Every output
token is one vocabulary word with a leading space, so a client counting whitespace
words in the streamed text agrees with `usage.completion_tokens` (reasoning tokens are
counted in usage but sent as `reasoning_content`).

Streamed events are built from byte templates (no per-token dict → JSON), because the
per-token path is the simulator's hot path.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from loadgen.sim.config import OutputDist

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"

VOCAB = tuple(
    " " + word
    for word in (
        *("the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as"),
        *("by", "at", "from", "this", "be", "are", "or", "it", "not", "an", "which", "but"),
        *("have", "had", "has", "were", "all", "one", "can", "its", "more", "when", "will"),
    )
)
_VOCAB_JSON = tuple(orjson.dumps(word) for word in VOCAB)
DONE_EVENT = b"data: [DONE]\n\n"
PING_EVENT = b": ping\n\n"


class BadRequest(ValueError):
    """The request body is not a valid completion request (answered with 400)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest:
    """The parts of a completion request that shape the simulated response."""

    is_chat: bool
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    priority: int
    model: str | None


def word(index: int) -> str:
    """The text of output token `index` (1-based)."""
    return VOCAB[index % len(VOCAB)]


def count_words(text: str) -> int:
    """Prompt tokens of one text: whitespace-separated words."""
    return len(text.split())


def _content_words(content: object) -> int:
    if isinstance(content, str):
        return count_words(content)
    if isinstance(content, list):
        return sum(
            count_words(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def _prompt_tokens(body: dict[str, Any], is_chat: bool) -> int:
    if is_chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        return sum(_content_words(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count_words(prompt)
    if isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
        return len(prompt)  # token ids
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return sum(count_words(p) for p in prompt)
    raise BadRequest("'prompt' must be a string, a list of strings, or a list of token ids")


def _optional_int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"'{key}' must be an integer >= {minimum}")
    return value


def parse_completion(body: bytes, is_chat: bool) -> CompletionRequest:
    """Parse a chat or text completion body; raises `BadRequest` with an OpenAI-ish message."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    max_tokens = _optional_int(data, "max_tokens", 1)
    if is_chat and max_tokens is None:
        max_tokens = _optional_int(data, "max_completion_tokens", 1)
    options = data.get("stream_options")
    return CompletionRequest(
        is_chat=is_chat,
        stream=data.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        prompt_tokens=_prompt_tokens(data, is_chat),
        max_tokens=max_tokens,
        min_tokens=_optional_int(data, "min_tokens", 0) or 0,
        ignore_eos=data.get("ignore_eos") is True,
        priority=_optional_int(data, "priority", -(2**62)) or 0,
        model=data.get("model") if isinstance(data.get("model"), str) else None,
    )


def output_length(
    request: CompletionRequest, dist: OutputDist, rng: random.Random
) -> tuple[int, str]:
    """(output tokens, finish_reason): `max_tokens` if `ignore_eos`, else a capped draw."""
    natural = dist.sample(rng)  # drawn every time, so the random stream is reproducible
    cap = request.max_tokens
    if request.ignore_eos and cap is not None:
        return cap, "length"
    tokens = max(natural, request.min_tokens, 1)
    if cap is not None and tokens >= cap:
        return cap, "length"
    return tokens, "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(status: int, message: str) -> bytes:
    """An OpenAI-style error JSON body for `status`."""
    kind = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}
    error_type = kind.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": None, "code": status}}
    )


def frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk (chunked transfer-encoding) carrying `payload`."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


class EventFormat:
    """SSE event bytes for one response (`data: {json}\\n\\n`), from precomputed templates."""

    __slots__ = ("_base", "_choice_tail", "_content_head", "_frames", "_is_chat")

    def __init__(self, *, is_chat: bool, response_id: str, created: int, model: str) -> None:
        obj = "chat.completion.chunk" if is_chat else "text_completion"
        self._is_chat = is_chat
        self._base = b'{"id":%b,"object":"%b","created":%d,"model":%b' % (
            orjson.dumps(response_id),
            obj.encode(),
            created,
            orjson.dumps(model),
        )
        delta_key = b'"delta":{"content":' if is_chat else b'"text":'
        self._content_head = b'data: %b,"choices":[{"index":0,%b' % (self._base, delta_key)
        close = b"}" if is_chat else b""
        self._choice_tail = close + b',"logprobs":null,"finish_reason":null}]}\n\n'
        self._frames: list[bytes] | None = None

    def token_frame(self, index: int) -> bytes:
        """`frame(token(index))`, precomputed per vocabulary word on first use."""
        frames = self._frames
        if frames is None:
            frames = self._frames = [frame(self.token(i)) for i in range(len(_VOCAB_JSON))]
        return frames[index % len(frames)]

    def token(self, index: int) -> bytes:
        """The content event for output token `index` alone (the hot path)."""
        return self._content_head + _VOCAB_JSON[index % len(_VOCAB_JSON)] + self._choice_tail

    def _event(self, choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
        tail = orjson.dumps({"choices": choices, **(extra or {})})
        return b"data: " + self._base + b"," + tail[1:] + b"\n\n"

    def _choice(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        if self._is_chat:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        text = delta.get("content") or ""
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def text(self, indices: Iterable[int], *, reasoning: bool = False) -> bytes:
        """One event carrying several tokens (coalesced), as content or reasoning_content."""
        text = "".join(word(i) for i in indices)
        if reasoning and self._is_chat:
            return self._event([self._choice({"reasoning_content": text}, None)])
        return self._event([self._choice({"content": text}, None)])

    def role(self) -> bytes:
        """The role-only chunk (chat only): `{"role": "assistant", "content": null}`."""
        return self._event([self._choice({"role": "assistant", "content": None}, None)])

    def finish(self, reason: str, usage_obj: dict[str, int] | None) -> bytes:
        """The finish chunk (empty delta), optionally carrying usage."""
        extra = {"usage": usage_obj} if usage_obj is not None else None
        return self._event([self._choice({}, reason)], extra)

    def usage(self, usage_obj: dict[str, int]) -> bytes:
        """The separate usage chunk sent when `stream_options.include_usage` is true."""
        return self._event([], {"usage": usage_obj})


def full_response(
    request: CompletionRequest,
    *,
    response_id: str,
    created: int,
    model: str,
    tokens: int,
    reasoning_tokens: int,
    finish_reason: str,
) -> bytes:
    """The non-streaming response body."""
    reasoning = "".join(word(i) for i in range(1, min(reasoning_tokens, tokens) + 1))
    text = "".join(word(i) for i in range(reasoning_tokens + 1, tokens + 1))
    choice: dict[str, Any]
    if request.is_chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        choice = {"index": 0, "message": message, "logprobs": None}
    else:
        choice = {"index": 0, "text": text, "logprobs": None}
    choice["finish_reason"] = finish_reason
    return orjson.dumps(
        {
            "id": response_id,
            "object": "chat.completion" if request.is_chat else "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage(request.prompt_tokens, tokens),
        }
    )
