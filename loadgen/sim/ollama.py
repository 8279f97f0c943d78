"""The Ollama dialect of the simulator (POST /api/chat and /api/generate, NDJSON).

Stream: `application/x-ndjson`, one JSON object per line, each line in its own HTTP chunk:
`{model, created_at, message: {role: assistant, content}, done: false}` (chat) or
`{model, created_at, response, done: false}` (generate); thinking tokens go in
`message.thinking` / `thinking` with empty content. The last line is
`{done: true, done_reason, total_duration, load_duration, prompt_eval_count,
prompt_eval_duration, eval_count, eval_duration}`. A mid-stream failure is `{"error": ...}`.

Durations are the simulator's own monotonic nanoseconds (real time, so at `--speed X` they
are 1/X of the simulated physics, and comparable with a client's own clock):
load_duration = received → reached the engine (the header-delay fault), prompt_eval_duration
= reached the engine → first token (queueing included), eval_duration = first → last token,
total_duration = received → last token.

`stream` defaults to true, as in Ollama. Output is exactly `options.num_predict` when it
is >= 1 (else a draw from the output distribution). Thinking (a simulator rule): `think:
true` spends floor(N/2) of the N output tokens thinking; `think: "low" | "medium" | "high"`
spends 1/4, 1/2, 3/4; eval_count counts them. NDJSON has no comments: no heartbeat. Role
"early" sends an object with empty content before queueing.
"""

from __future__ import annotations

import datetime
from typing import Any

import orjson

from loadgen.sim.wire import (
    EFFORT_FRACTIONS,
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
    priority,
    words,
)

CHAT_PATH = "/api/chat"
GENERATE_PATH = "/api/generate"
THINK_FRACTION = 0.5


def _think_fraction(think: object) -> float:
    if think is None or think is False:
        return 0.0
    if think is True:
        return THINK_FRACTION
    if isinstance(think, str) and think in EFFORT_FRACTIONS:
        return EFFORT_FRACTIONS[think]
    raise BadRequest("'think' must be true, false, or one of low, medium, high")


def _num_predict(data: dict[str, Any]) -> int | None:
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'options' must be an object")
    value = options.get("num_predict")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("'options.num_predict' must be an integer")
    return value if value >= 1 else None  # -1 / -2: no limit


def _parse(body: bytes, is_chat: bool) -> SimRequest:
    data = load_object(body)
    if is_chat:
        prompt = messages_words(data.get("messages"))
    else:
        if not isinstance(data.get("prompt", ""), str):
            raise BadRequest("'prompt' must be a string")
        prompt = content_words(data.get("prompt")) + content_words(data.get("system"))
    max_tokens = _num_predict(data)
    return SimRequest(
        api="ollama-chat" if is_chat else "ollama-generate",
        is_chat=is_chat,
        stream=data.get("stream") is not False,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        forced=True,
        priority=priority(data),
        model=model_of(data),
        reasoning_fraction=_think_fraction(data.get("think")),
    )


def parse_chat(body: bytes) -> SimRequest:
    """Parse an /api/chat body."""
    return _parse(body, is_chat=True)


def parse_generate(body: bytes) -> SimRequest:
    """Parse an /api/generate body."""
    return _parse(body, is_chat=False)


def error_body(status: int, message: str) -> bytes:
    """Ollama's error body: `{"error": ...}`."""
    return orjson.dumps({"error": message})


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


class OllamaFormat:
    """NDJSON lines of one Ollama stream."""

    __slots__ = ("_args", "_created_at", "_frames", "_head", "_tail")

    content_type = "application/x-ndjson"

    def __init__(self, args: FormatArgs) -> None:
        self._args = args
        self._created_at = _now()
        head = b'{"model":%b,"created_at":%b,' % (
            orjson.dumps(args.model),
            orjson.dumps(self._created_at),
        )
        if args.request.is_chat:
            self._head = head + b'"message":{"role":"assistant","content":'
            self._tail = b'},"done":false}\n'
        else:
            self._head = head + b'"response":'
            self._tail = b',"done":false}\n'
        self._frames: list[bytes] | None = None

    def _line(self, obj: dict[str, Any]) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)

    def _object(self, text: str, thinking: str | None = None, **extra: Any) -> dict[str, Any]:
        args = self._args
        created_at = _now() if extra else self._created_at  # the final line has its own time
        obj: dict[str, Any] = {"model": args.model, "created_at": created_at}
        if args.request.is_chat:
            message = {"role": "assistant", "content": text}
            obj["message"] = message if thinking is None else {**message, "thinking": thinking}
        else:
            obj["response"] = text
            if thinking is not None:
                obj["thinking"] = thinking
        return {**obj, "done": False, **extra}

    def at_accept(self, role: str) -> bytes:
        """An object with empty content before queueing (role "early")."""
        return self._line(self._object(""))

    def at_first(self, role: str, *, sent_early: bool) -> bytes:
        """Nothing: Ollama's first line carries the first token."""
        return b""

    def token_frame(self, index: int) -> bytes:
        """The framed line of token `index`, precomputed per vocabulary word on first use."""
        frames = self._frames
        if frames is None:
            frames = self._frames = [frame(self._head + word + self._tail) for word in VOCAB_JSON]
        return frames[index % len(frames)]

    def tokens(self, first: int, last: int, *, reasoning: bool) -> bytes:
        """One line with tokens first..last as content or thinking."""
        text = words(first, last)
        if reasoning:
            return self._line(self._object("", text))
        return self._head + orjson.dumps(text) + self._tail

    def _stats(self, end: StreamEnd) -> dict[str, Any]:
        return {
            "done": True,
            "done_reason": self._args.dialect.finish_word or end.finish_reason,
            "total_duration": end.last_token_ns - end.received_ns,
            "load_duration": end.entered_ns - end.received_ns,
            "prompt_eval_count": end.prompt_tokens,
            "prompt_eval_duration": end.first_token_ns - end.entered_ns,
            "eval_count": end.output_tokens,
            "eval_duration": end.last_token_ns - end.first_token_ns,
        }

    def finish(self, end: StreamEnd) -> bytes:
        """The final `done: true` line with counts and durations."""
        return self._line(self._object("", **self._stats(end)))

    def cut(self) -> bytes:
        """Nothing: the body just ends, without the terminal event."""
        return b""

    def empty_token(self) -> bytes:
        """None: no empty text deltas in this dialect."""
        return b""

    def heartbeat(self) -> bytes:
        """Nothing: NDJSON has no comments."""
        return b""

    def error_event(self, message: str) -> bytes:
        """An `{"error": ...}` line, as Ollama sends when generation fails mid-stream."""
        return self._line({"error": message})

    def garbage(self, junk: bytes) -> bytes:
        """A line that is not JSON, then raw bytes."""
        return b"{not json\n" + junk.replace(b"\n", b" ") + b"\n"

    def full_response(self, end: StreamEnd) -> bytes:
        """The `stream: false` answer: one object with the whole text and the final stats."""
        thinking = words(1, end.reasoning_tokens) if end.reasoning_tokens else None
        text = words(end.reasoning_tokens + 1, end.output_tokens)
        return orjson.dumps(self._object(text, thinking, **self._stats(end)))
