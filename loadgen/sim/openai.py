"""The OpenAI chat/completions dialect of the simulator: request parsing and event bytes.

Written independently of the client's adapters on purpose: the simulator exists to
check the client, so the two must not share a bug.

Output length follows `max_tokens` (or `max_completion_tokens`) exactly when `ignore_eos`
is set, else a draw from the output distribution capped by it (see `wire.output_length`).
Reasoning tokens (the `X-Sim-Reasoning-Tokens` dialect setting) go out as
`delta.reasoning_content` and count in `usage.completion_tokens`.

Streamed events are built from byte templates (no per-token dict → JSON), because the
per-token path is the simulator's hot path.
"""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.sim.wire import (
    SSE_COMMENT,
    VOCAB_JSON,
    BadRequest,
    FormatArgs,
    SimRequest,
    StreamEnd,
    content_words,
    count_words,
    frame,
    load_object,
    model_of,
    optional_int,
    priority,
    words,
)

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
DONE_EVENT = b"data: [DONE]\n\n"


def _prompt_tokens(body: dict[str, Any], is_chat: bool) -> int:
    if is_chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        return sum(content_words(m.get("content")) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count_words(prompt)
    if isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
        return len(prompt)  # token ids
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return sum(count_words(p) for p in prompt)
    raise BadRequest("'prompt' must be a string, a list of strings, or a list of token ids")


def parse_completion(body: bytes, is_chat: bool) -> SimRequest:
    """Parse a chat or text completion body; raises `BadRequest` with an OpenAI-ish message."""
    data = load_object(body)
    max_tokens = optional_int(data, "max_tokens", 1)
    if is_chat and max_tokens is None:
        max_tokens = optional_int(data, "max_completion_tokens", 1)
    options = data.get("stream_options")
    return SimRequest(
        api="openai-chat" if is_chat else "openai-completions",
        is_chat=is_chat,
        stream=data.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        prompt_tokens=_prompt_tokens(data, is_chat),
        max_tokens=max_tokens,
        min_tokens=optional_int(data, "min_tokens", 0) or 0,
        forced=data.get("ignore_eos") is True,
        priority=priority(data),
        model=model_of(data),
    )


def parse_chat(body: bytes) -> SimRequest:
    """`parse_completion` for /v1/chat/completions."""
    return parse_completion(body, is_chat=True)


def parse_text(body: bytes) -> SimRequest:
    """`parse_completion` for /v1/completions."""
    return parse_completion(body, is_chat=False)


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """OpenAI's usage object; with prefix-cache hits, `prompt_tokens_details.cached_tokens`
    (as vLLM reports it with `--enable-prompt-tokens-details`)."""
    obj: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        obj["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return obj


def error_body(status: int, message: str) -> bytes:
    """An OpenAI-style error JSON body for `status`."""
    kind = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error"}
    error_type = kind.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": None, "code": status}}
    )


class EventFormat:
    """SSE event bytes for one response (`data: {json}\\n\\n`), from precomputed templates."""

    __slots__ = ("_base", "_choice_tail", "_content_head", "_dialect", "_frames", "_request")

    content_type = "text/event-stream"

    def __init__(self, args: FormatArgs) -> None:
        request = self._request = args.request
        obj = "chat.completion.chunk" if request.is_chat else "text_completion"
        self._dialect = args.dialect
        self._base = b'{"id":%b,"object":"%b","created":%d,"model":%b' % (
            orjson.dumps(args.response_id),
            obj.encode(),
            args.created,
            orjson.dumps(args.model),
        )
        delta_key = b'"delta":{"content":' if request.is_chat else b'"text":'
        self._content_head = b'data: %b,"choices":[{"index":0,%b' % (self._base, delta_key)
        close = b"}" if request.is_chat else b""
        self._choice_tail = close + b',"logprobs":null,"finish_reason":null}]}\n\n'
        self._frames: list[bytes] | None = None

    def token_frame(self, index: int) -> bytes:
        """`frame(token(index))`, precomputed per vocabulary word on first use."""
        frames = self._frames
        if frames is None:
            frames = self._frames = [frame(self.token(i)) for i in range(len(VOCAB_JSON))]
        return frames[index % len(frames)]

    def token(self, index: int) -> bytes:
        """The content event for output token `index` alone (the hot path)."""
        return self._content_head + VOCAB_JSON[index % len(VOCAB_JSON)] + self._choice_tail

    def _event(self, choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
        tail = orjson.dumps({"choices": choices, **(extra or {})})
        return b"data: " + self._base + b"," + tail[1:] + b"\n\n"

    def _choice(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        if self._request.is_chat:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        text = delta.get("content") or ""
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def tokens(self, first: int, last: int, *, reasoning: bool) -> bytes:
        """One event carrying tokens first..last, as content or (chat) reasoning_content."""
        if first == last and not reasoning:
            return self.token(first)
        text = words(first, last)
        if reasoning and self._request.is_chat:
            return self._event([self._choice({"reasoning_content": text}, None)])
        return self._event([self._choice({"content": text}, None)])

    def _role(self) -> bytes:
        return self._event([self._choice({"role": "assistant", "content": None}, None)])

    def at_accept(self, role: str) -> bytes:
        """The role-only chunk at accept (chat, role "early"), as `transformers serve` does."""
        return self._role() if role == "early" and self._request.is_chat else b""

    def at_first(self, role: str, *, sent_early: bool) -> bytes:
        """The role-only chunk with the first token (chat, role "first"), as llama.cpp does."""
        return self._role() if role == "first" and self._request.is_chat else b""

    def finish(self, end: StreamEnd) -> bytes:
        """Finish chunk (usage inside it or in its own chunk, when asked), then `[DONE]`."""
        usage_obj: dict[str, Any] = {
            "usage": usage(end.prompt_tokens, end.output_tokens, end.cached_tokens)
        }
        if end.metrics is not None and self._request.include_usage:  # vLLM: on the usage chunk
            usage_obj["metrics"] = end.metrics
        in_finish = self._dialect.usage_in_finish
        extra = usage_obj if in_finish else None
        finish = self._dialect.finish_word or end.finish_reason
        parts = [self._event([self._choice({}, finish)], extra)]
        if self._request.include_usage and not in_finish:
            parts.append(self._event([], usage_obj))
        if not self._dialect.no_done:
            parts.append(DONE_EVENT)
        return b"".join(parts)

    def cut(self) -> bytes:
        """`[DONE]` with no finish chunk, as llama-cpp-python's server ends a stream it
        interrupts for a newer request (llama_cpp/server/app.py, interrupt_requests)."""
        return b"" if self._dialect.no_done else DONE_EVENT

    def empty_token(self) -> bytes:
        """`{"content": ""}` (chat) / `"text": ""`: a token ending inside a UTF-8 character."""
        return self._event([self._choice({"content": ""}, None)])

    def heartbeat(self) -> bytes:
        """An SSE comment."""
        return SSE_COMMENT

    def error_event(self, message: str) -> bytes:
        """An error object in a data event, as vLLM sends when generation fails mid-stream."""
        error = {"message": message, "type": "server_error", "param": None, "code": 500}
        return b"data: " + orjson.dumps({"error": error}) + b"\n\n"

    def garbage(self, junk: bytes) -> bytes:
        """An SSE data line that is not JSON, then raw bytes."""
        return b"data: {not json\n\n" + junk + b"\n\n"

    def full_response(self, end: StreamEnd) -> bytes:
        """The non-streaming response body."""
        request = self._request
        base = orjson.loads(self._base + b"}")
        reasoning = words(1, min(end.reasoning_tokens, end.output_tokens))
        text = words(end.reasoning_tokens + 1, end.output_tokens)
        choice: dict[str, Any]
        if request.is_chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning:
                message["reasoning_content"] = reasoning
            choice = {"index": 0, "message": message, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = end.finish_reason
        base["object"] = "chat.completion" if request.is_chat else "text_completion"
        return orjson.dumps(
            {
                **base,
                "choices": [choice],
                "usage": usage(end.prompt_tokens, end.output_tokens, end.cached_tokens),
            }
        )
