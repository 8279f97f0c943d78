"""The Anthropic Messages dialect of the simulator (POST /v1/messages, SSE with `event:` names).

Stream: `message_start` (usage.input_tokens), then per content block `content_block_start`,
`content_block_delta` (`thinking_delta` or `text_delta`), `content_block_stop` (a thinking
block ends with a `signature_delta` first, as the real API does), then `message_delta`
(`stop_reason`, `usage.output_tokens`) and `message_stop`. One `ping` follows the first
block start, as the real API sends; the heartbeat fault sends more. A mid-stream failure
is an `error` event (`overloaded_error`).

Output is exactly `max_tokens` (required, as in the real API). Thinking (a simulator
rule): `thinking: {type: enabled, budget_tokens: K}` spends the first min(K, floor(N/2))
of the N output tokens in a thinking block; they count in `output_tokens`, as Anthropic
counts them. `system` text counts as prompt words, like an OpenAI system message.
"""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.sim.wire import (
    VOCAB_JSON,
    BadRequest,
    FormatArgs,
    SimRequest,
    StreamEnd,
    content_words,
    frame,
    load_object,
    messages_words,
    model_of,
    optional_int,
    priority,
    sse,
    words,
)

MESSAGES_PATH = "/v1/messages"
THINKING_FRACTION = 0.5
_STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
PING = sse("ping", {"type": "ping"})


def _thinking_cap(data: dict[str, Any]) -> int | None:
    """The thinking budget if the request enables thinking, else None."""
    thinking = data.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget = optional_int(thinking, "budget_tokens", 1)
    if budget is None:
        raise BadRequest("'thinking.budget_tokens' is required when thinking is enabled")
    return budget


def parse_messages(body: bytes) -> SimRequest:
    """Parse a Messages request body; `max_tokens` is required."""
    data = load_object(body)
    max_tokens = optional_int(data, "max_tokens", 1)
    if max_tokens is None:
        raise BadRequest("'max_tokens' is required")
    cap = _thinking_cap(data)
    return SimRequest(
        api="anthropic",
        stream=data.get("stream") is True,
        prompt_tokens=messages_words(data.get("messages")) + content_words(data.get("system")),
        max_tokens=max_tokens,
        forced=True,
        priority=priority(data),
        model=model_of(data),
        reasoning_fraction=THINKING_FRACTION if cap is not None else 0.0,
        reasoning_cap=cap,
    )


def error_body(status: int, message: str) -> bytes:
    """The Messages API error body."""
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


class AnthropicFormat:
    """Event bytes of one Messages stream; tracks the open content block."""

    __slots__ = ("_args", "_block", "_frames", "_index")

    content_type = "text/event-stream"

    def __init__(self, args: FormatArgs) -> None:
        self._args = args
        self._block: str | None = None  # "thinking" | "text" while a block is open
        self._index = -1
        self._frames: list[bytes] | None = None

    def _message(self, output_tokens: int) -> dict[str, Any]:
        args = self._args
        return {
            "id": args.response_id,
            "type": "message",
            "role": "assistant",
            "model": args.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                # Anthropic's input_tokens exclude the tokens read from the cache.
                "input_tokens": args.request.prompt_tokens - (args.cached_tokens or 0),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": args.cached_tokens or 0,
                "output_tokens": output_tokens,
            },
        }

    def _message_start(self) -> bytes:
        message = self._message(1)
        if self._args.dialect.input_usage_late:
            message["usage"].update(input_tokens=0, cache_read_input_tokens=0)
        return sse("message_start", {"type": "message_start", "message": message})

    def at_accept(self, role: str) -> bytes:
        """`message_start` before queueing (role "early")."""
        return self._message_start()

    def at_first(self, role: str, *, sent_early: bool) -> bytes:
        """`message_start` with the first token unless it went out early (it is never omitted)."""
        return b"" if sent_early else self._message_start()

    def token(self, index: int) -> bytes:
        """One `text_delta` event of token `index` in the open text block."""
        return (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
            b'"delta":{"type":"text_delta","text":%b}}\n\n'
            % (self._index, VOCAB_JSON[index % len(VOCAB_JSON)])
        )

    def token_frame(self, index: int) -> bytes:
        """`frame(token(index))`, precomputed per vocabulary word once the text block is open."""
        frames = self._frames
        if frames is None:
            frames = self._frames = [frame(self.token(i)) for i in range(len(VOCAB_JSON))]
        return frames[index % len(frames)]

    def _close_block(self) -> bytes:
        if self._block is None:
            return b""
        index, parts = self._index, []
        if self._block == "thinking":
            delta = {"type": "signature_delta", "signature": "c2ltdWxhdGVk"}
            parts.append(
                sse(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        parts.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        self._block = None
        return b"".join(parts)

    def _open_block(self, kind: str) -> bytes:
        self._index += 1
        self._block = kind
        block = {"type": "thinking", "thinking": "", "signature": ""}
        if kind == "text":
            block = {"type": "text", "text": ""}
        start = sse(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )
        return start + PING if self._index == 0 else start

    def tokens(self, first: int, last: int, *, reasoning: bool) -> bytes:
        """Block changes as needed, then one delta with tokens first..last."""
        kind = "thinking" if reasoning else "text"
        head = b""
        if self._block != kind:
            head = self._close_block() + self._open_block(kind)
        if kind == "text" and first == last:
            return head + self.token(first)
        text = words(first, last)
        delta = {"type": "thinking_delta", "thinking": text}
        if kind == "text":
            delta = {"type": "text_delta", "text": text}
        body = {"type": "content_block_delta", "index": self._index, "delta": delta}
        return head + sse("content_block_delta", body)

    def finish(self, end: StreamEnd) -> bytes:
        """Close the open block, `message_delta` with the stop reason and usage, `message_stop`."""
        dialect = self._args.dialect
        stop_reason = dialect.finish_word or _STOP_REASONS[end.finish_reason]
        usage: dict[str, Any] = {"output_tokens": end.output_tokens}
        if dialect.input_usage_late:  # LiteLLM's proxy: the input count only here
            usage = {"input_tokens": end.prompt_tokens, **usage}
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": usage,
        }
        parts = [self._close_block(), sse("message_delta", delta)]
        if not self._args.dialect.no_done:
            parts.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(parts)

    def cut(self) -> bytes:
        """`message_stop` with no `message_delta` (no stop_reason, no usage) before it."""
        return b"" if self._args.dialect.no_done else sse("message_stop", {"type": "message_stop"})

    def empty_token(self) -> bytes:
        """None: Anthropic sends no empty text deltas."""
        return b""

    def heartbeat(self) -> bytes:
        """A `ping` event."""
        return PING

    def error_event(self, message: str) -> bytes:
        """An `error` event with an `overloaded_error`, as the API sends under load."""
        error = {"type": "overloaded_error", "message": message}
        return sse("error", {"type": "error", "error": error})

    def garbage(self, junk: bytes) -> bytes:
        """A delta event whose data is not JSON, then raw bytes."""
        return b"event: content_block_delta\ndata: {not json\n\n" + junk + b"\n\n"

    def full_response(self, end: StreamEnd) -> bytes:
        """The non-streaming Message."""
        message = self._message(end.output_tokens)
        content: list[dict[str, Any]] = []
        if end.reasoning_tokens:
            thinking = words(1, end.reasoning_tokens)
            content.append({"type": "thinking", "thinking": thinking, "signature": "c2lt"})
        text = words(end.reasoning_tokens + 1, end.output_tokens)
        content.append({"type": "text", "text": text})
        message.update(content=content, stop_reason=_STOP_REASONS[end.finish_reason])
        return orjson.dumps(message)
