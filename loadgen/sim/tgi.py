"""The Hugging Face TGI dialect of the simulator (POST /generate_stream, /generate).

Stream: SSE `data:` events only (no `event:` names, no `[DONE]`), one per token:
`{"index", "token": {"id", "text", "logprob", "special": false}, "generated_text": null,
"details": null, "top_tokens": null}`. The last event carries `generated_text` (the
whole visible text) and, when the request asked for `parameters.details`, `details`
`{finish_reason, generated_tokens, seed, input_length}`. A natural stop ends with the EOS
token itself (`</s>`, `special: true`, counted in `generated_tokens`, not in the text), as
TGI sends it; `finish_reason` is then `eos_token`, else `length`. A mid-stream failure is
`data: {"error": ..., "error_type": "generation"}`.

Output is exactly `parameters.max_new_tokens` when given (else a draw from the output
distribution). TGI has no reasoning field: reasoning tokens go out as text. Coalesced
tokens (`tokens_per_chunk`) go out as one token event carrying several words.
"""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.sim.wire import (
    SSE_COMMENT,
    VOCAB,
    VOCAB_JSON,
    BadRequest,
    FormatArgs,
    SimRequest,
    StreamEnd,
    count_words,
    frame,
    load_object,
    optional_int,
    priority,
    words,
)

STREAM_PATH = "/generate_stream"
GENERATE_PATH = "/generate"
EOS_TEXT = "</s>"
EOS_ID = 2
_LOGPROB = b"-0.25"
_FINISH = {"length": "length", "stop": "eos_token"}


def _parameters(data: dict[str, Any]) -> dict[str, Any]:
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    return parameters


def _parse(body: bytes, stream: bool | None) -> SimRequest:
    data = load_object(body)
    inputs = data.get("inputs")
    if not isinstance(inputs, str):
        raise BadRequest("'inputs' must be a string")
    parameters = _parameters(data)
    max_tokens = optional_int(parameters, "max_new_tokens", 1)
    return SimRequest(
        api="tgi",
        stream=data.get("stream") is True if stream is None else stream,
        prompt_tokens=count_words(inputs),
        max_tokens=max_tokens,
        forced=True,
        priority=priority(data),
        details=parameters.get("details") is True,
        seed=optional_int(parameters, "seed", 0),
    )


def parse_stream(body: bytes) -> SimRequest:
    """Parse a /generate_stream body (always streamed)."""
    return _parse(body, stream=True)


def parse_generate(body: bytes) -> SimRequest:
    """Parse a /generate body (never streamed)."""
    return _parse(body, stream=False)


def error_body(status: int, message: str) -> bytes:
    """TGI's error body: `{"error", "error_type"}`."""
    kind = "overloaded" if status == 429 else "validation" if status < 500 else "generation"
    return orjson.dumps({"error": message, "error_type": kind})


def _token(token_id: int, text: bytes, *, special: bool = False) -> bytes:
    return b'{"id":%d,"text":%b,"logprob":%b,"special":%b}' % (
        token_id,
        text,
        _LOGPROB,
        b"true" if special else b"false",
    )


class TgiFormat:
    """Event bytes of one TGI stream."""

    __slots__ = ("_args",)

    content_type = "text/event-stream"

    def __init__(self, args: FormatArgs) -> None:
        self._args = args

    def at_accept(self, role: str) -> bytes:
        """Nothing: TGI sends no event before the first token."""
        return b""

    def at_first(self, role: str, *, sent_early: bool) -> bytes:
        """Nothing: TGI sends no event before the first token."""
        return b""

    def _event(self, index: int, token: bytes, last: bool = False) -> bytes:
        tail = b'"generated_text":null,"details":null'
        if last:
            tail = self._final_tail()
        return b'data: {"index":%d,"token":%b,%b,"top_tokens":null}\n\n' % (index, token, tail)

    def _final_tail(self) -> bytes:
        args = self._args
        visible = args.tokens - (1 if args.finish_reason == "stop" else 0)
        details = None
        if args.request.details:
            details = {
                "finish_reason": _FINISH[args.finish_reason],
                "generated_tokens": args.tokens,
                "seed": args.request.seed,
                "input_length": args.request.prompt_tokens,
            }
        generated = orjson.dumps(words(1, visible))
        return b'"generated_text":%b,"details":%b' % (generated, orjson.dumps(details))

    def token_frame(self, index: int) -> bytes:
        """The framed event of token `index` (not cached: each carries its own index)."""
        word_id = index % len(VOCAB)
        return frame(self._event(index, _token(word_id + 100, VOCAB_JSON[word_id])))

    def tokens(self, first: int, last: int, *, reasoning: bool) -> bytes:
        """One token event for first..last; the last of the response ends with EOS on a stop."""
        args = self._args
        is_last = last == args.tokens
        eos = is_last and args.finish_reason == "stop"
        parts = []
        end_word = last - 1 if eos else last
        if end_word >= first:
            text = orjson.dumps(words(first, end_word))
            word_id = end_word % len(VOCAB) + 100
            parts.append(self._event(end_word, _token(word_id, text), is_last and not eos))
        if eos:
            eos_token = _token(EOS_ID, orjson.dumps(EOS_TEXT), special=True)
            parts.append(self._event(last, eos_token, True))
        return b"".join(parts)

    def finish(self, end: StreamEnd) -> bytes:
        """Nothing more: the last token event carried the end."""
        return b""

    def cut(self) -> bytes:
        """Nothing: the body ends without the last event's details."""
        return b""

    def empty_token(self) -> bytes:
        """A non-special token event with empty text (a partial UTF-8 character)."""
        return self._event(0, _token(101, b'""'))

    def heartbeat(self) -> bytes:
        """An SSE comment (TGI's server sends keep-alive comments)."""
        return SSE_COMMENT

    def error_event(self, message: str) -> bytes:
        """TGI's in-stream error."""
        return b"data: " + orjson.dumps({"error": message, "error_type": "generation"}) + b"\n\n"

    def garbage(self, junk: bytes) -> bytes:
        """An SSE data line that is not JSON, then raw bytes."""
        return b"data: {not json\n\n" + junk + b"\n\n"

    def full_response(self, end: StreamEnd) -> bytes:
        """The /generate body: generated_text and, when asked, details."""
        visible = end.output_tokens - (1 if end.finish_reason == "stop" else 0)
        body: dict[str, Any] = {"generated_text": words(1, visible)}
        if self._args.request.details:
            body["details"] = {
                "finish_reason": _FINISH[end.finish_reason],
                "generated_tokens": end.output_tokens,
                "seed": self._args.request.seed,
                "prefill": [],
                "tokens": [],
            }
        return orjson.dumps(body)
