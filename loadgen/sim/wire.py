"""What every simulated API dialect shares: the request summary, tokens, framing, the format seam.

Token accounting, the same in every dialect: prompt tokens are whitespace-separated words of
the request's text (every message's text, system text included; roles and templates add
nothing). Output token `i` (1-based) is one vocabulary word with a leading space, so a
client counting words in the streamed text agrees with the usage the server reports.
Reasoning tokens are the first `k` output tokens, sent in the dialect's reasoning field.

A dialect module (`openai`, `anthropic`, `responses`, `tgi`, `ollama`) parses a body into a
`SimRequest` and builds one `StreamFormat` per response: the bytes of each event, from
templates where it is on the per-token path. The `Exchange` decides *when* to write;
the format decides *what*.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from loadgen.sim.config import Dialect, OutputDist

VOCAB = tuple(
    " " + word
    for word in (
        *("the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as"),
        *("by", "at", "from", "this", "be", "are", "or", "it", "not", "an", "which", "but"),
        *("have", "had", "has", "were", "all", "one", "can", "its", "more", "when", "will"),
    )
)
VOCAB_JSON = tuple(orjson.dumps(word) for word in VOCAB)
SSE_COMMENT = b": ping\n\n"
# Share of the output spent reasoning when a request asks for it by effort (a simulator rule).
EFFORT_FRACTIONS = {"none": 0.0, "minimal": 0.0, "low": 0.25, "medium": 0.5, "high": 0.75}


class BadRequest(ValueError):
    """The request body is not valid for its API (answered with 400)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimRequest:
    """The parts of a generation request, in any dialect, that shape the simulated response.

    `forced` means the output is exactly `max_tokens` (OpenAI `ignore_eos`; always in the
    other dialects when they give a limit). Reasoning: `reasoning_fraction` of the output,
    at most `reasoning_cap` tokens (None = no cap).
    """

    api: str
    stream: bool
    prompt_tokens: int
    max_tokens: int | None
    forced: bool
    min_tokens: int = 0
    priority: int = 0
    model: str | None = None
    is_chat: bool = True
    include_usage: bool = False
    reasoning_fraction: float = 0.0
    reasoning_cap: int | None = None
    details: bool = False  # TGI: the last event carries `details`
    seed: int | None = None  # TGI: echoed in `details`


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamEnd:
    """What the closing events report: lengths, and the server's own times (monotonic ns)."""

    finish_reason: str  # "length" or "stop"; each format maps it to its own word
    prompt_tokens: int
    output_tokens: int
    reasoning_tokens: int
    received_ns: int
    entered_ns: int  # when the request reached the engine (after any header delay)
    first_token_ns: int
    last_token_ns: int
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache; None: no cache
    # vLLM's per-request `metrics` object (`--per-request-metrics`, `X-Sim-Metrics: 1`): the
    # engine's own queue, prefill and generation times; None: not asked for.
    metrics: dict[str, float] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FormatArgs:
    """What a `StreamFormat` is built from: the request and its planned response."""

    request: SimRequest
    response_id: str
    created: int  # unix seconds
    model: str
    dialect: Dialect
    tokens: int  # output tokens this response will carry if nothing fails
    reasoning_tokens: int
    finish_reason: str  # "length" or "stop"
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache; None: no cache


class StreamFormat(Protocol):
    """The event bytes of one response in one dialect (events unframed unless named `_frame`)."""

    content_type: str

    def at_accept(self, role: str) -> bytes:
        """Events sent right after the headers, before queueing, for `role` == "early"."""
        ...

    def at_first(self, role: str, *, sent_early: bool) -> bytes:
        """Events that precede the first generated token in its write."""
        ...

    def token_frame(self, index: int) -> bytes:
        """The framed event of visible token `index` alone, in the text phase (hot path)."""
        ...

    def tokens(self, first: int, last: int, *, reasoning: bool) -> bytes:
        """Events of tokens `first..last` (one chunk), with any phase-change events before."""
        ...

    def cut(self) -> bytes:
        """The bare end of a stream cut short: the terminator, no stop reason or usage."""
        ...

    def empty_token(self) -> bytes:
        """The event of one token with empty text (partial UTF-8), b"" if the dialect has none."""
        ...

    def finish(self, end: StreamEnd) -> bytes:
        """The closing events after the last token."""
        ...

    def heartbeat(self) -> bytes:
        """A keep-alive event, or b"" when the dialect has none."""
        ...

    def error_event(self, message: str) -> bytes:
        """A mid-stream error in the dialect's own shape."""
        ...

    def garbage(self, junk: bytes) -> bytes:
        """Bytes no decoder of the dialect can accept."""
        ...

    def full_response(self, end: StreamEnd) -> bytes:
        """The non-streaming response body."""
        ...


FormatFactory = Callable[[FormatArgs], StreamFormat]


def word(index: int) -> str:
    """The text of output token `index` (1-based)."""
    return VOCAB[index % len(VOCAB)]


def words(first: int, last: int) -> str:
    """The text of output tokens `first..last` (empty when last < first)."""
    return "".join(word(i) for i in range(first, last + 1))


def count_words(text: str) -> int:
    """Prompt tokens of one text: whitespace-separated words."""
    return len(text.split())


def content_words(content: object) -> int:
    """Words of a message content: a string, or a list of parts with a "text" string (or
    an Anthropic `tool_result` part's own content)."""
    if isinstance(content, str):
        return count_words(content)
    if isinstance(content, list):
        return sum(
            count_words(part["text"]) if isinstance(part.get("text"), str)
            # an Anthropic tool_result block: its content is a string or a list of parts
            else content_words(part.get("content")) if part.get("type") == "tool_result"
            else 0
            for part in content
            if isinstance(part, dict)
        )  # fmt: skip
    return 0


def messages_words(messages: object) -> int:
    """Words of every message's content; BadRequest unless a non-empty list."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    return sum(content_words(m.get("content")) for m in messages if isinstance(m, dict))


def load_object(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body; BadRequest otherwise."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data


def optional_int(body: Mapping[str, Any], key: str, minimum: int) -> int | None:
    """An integer field >= `minimum`, or None when absent; BadRequest otherwise."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"'{key}' must be an integer >= {minimum}")
    return value


def priority(body: Mapping[str, Any]) -> int:
    """The optional scheduling priority (lower runs first), in any dialect's body."""
    return optional_int(body, "priority", -(2**62)) or 0


def model_of(body: Mapping[str, Any]) -> str | None:
    """The requested model id, if a string."""
    model = body.get("model")
    return model if isinstance(model, str) else None


def output_length(request: SimRequest, dist: OutputDist, rng: random.Random) -> tuple[int, str]:
    """(output tokens, "length" | "stop"): `max_tokens` when forced, else a capped draw."""
    natural = dist.sample(rng)  # drawn every time, so the random stream is reproducible
    cap = request.max_tokens
    if request.forced and cap is not None:
        return cap, "length"
    tokens = max(natural, request.min_tokens, 1)
    if cap is not None and tokens >= cap:
        return cap, "length"
    return tokens, "stop"


def reasoning_tokens(request: SimRequest, tokens: int) -> int:
    """Tokens the request asked to spend reasoning: floor(fraction x output), capped."""
    asked = int(tokens * request.reasoning_fraction)
    return asked if request.reasoning_cap is None else min(asked, request.reasoning_cap)


def frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk (chunked transfer-encoding) carrying `payload`."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def sse(name: str | None, obj: Any) -> bytes:
    """One SSE event: an optional `event:` line and `data: <json>`."""
    data = b"data: " + orjson.dumps(obj) + b"\n\n"
    return data if name is None else b"event: " + name.encode() + b"\n" + data


def unix_s() -> int:
    """Wall-clock seconds, for `created` fields."""
    return int(time.time())


def trace_id(traceparent: str | None) -> str | None:
    """The trace id of a W3C traceparent (`00-<32 hex>-<16 hex>-<2 hex>`), else None: what
    the simulator records of an incoming trace context (its spans would be parented there)."""
    if traceparent is None:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) != 4 or [len(p) for p in parts] != [2, 32, 16, 2]:
        return None
    try:
        if int(parts[1], 16) == 0 or int(parts[2], 16) == 0:
            return None
    except ValueError:
        return None
    return parts[1].lower()
