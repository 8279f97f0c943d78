"""The adapter protocol: what every API family's adapter implements, and what they share.

An adapter is the one place that knows its API family: the request target for a model
(`target`: the path, where a model may sit), the headers and body for a conversation, where
the request id and a class's priority go in that body (`request_id_field`,
`priority_field`), which body fields loadgen's options add (`optional_fields`, what the
preflight may tell the user to turn off), and how one decoded stream event reads as a
`Delta`. It does no I/O, keeps no clock and no per-request state (one instance serves every
request): the runner stamps each chunk's arrival before the adapter parses it. Its
`framing` says how the body is cut into events: `sse` (server-sent events,
`loadgen.adapters.sse`) or `ndjson` (one JSON object per line, `loadgen.adapters.ndjson`).
`request_body` is the one function that shapes a request's body from them. The registry
from the workload's `target.api` name is `loadgen.adapters`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import orjson

from loadgen.adapters.ndjson import NdjsonDecoder
from loadgen.adapters.sse import DEFAULT_MAX_EVENT_BYTES, SseDecoder


@dataclass(frozen=True, slots=True, kw_only=True)
class BodyOptions:
    """Request options that come from the workload's target section."""

    model: str
    include_usage: bool = True
    force_output_tokens: bool = True
    extra_body: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class IdField:
    """Where an API lets the caller put its own identifier in the body: `name`, or `key`
    inside the object `name` (`metadata.request_id`). `by_default`: sent with
    `target.request_id.body: auto` (a metadata field is; a field the API books as an end
    user, OpenAI's `user`, only with `on`)."""

    name: str
    key: str | None = None
    by_default: bool = False


# `optional_fields` of an API none of whose body fields come from loadgen's options.
NO_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType({})


class Delta:
    """What one stream event carried. Counts are characters of text, not tokens.

    `content_chars`/`reasoning_chars`/`has_tool_call` say whether the event carried generated
    output (and so counts for TTFT and ITL); `token_only` marks an event the API sends for
    one generated token whose text is empty (a partial UTF-8 character held back: it counts
    in N when N is counted, not for TTFT or ITL); `done` marks an explicit end of stream
    (`[DONE]`, `message_stop`, `done: true`), `finish_reason` the model's stop; `error` a
    server error event (the stream failed), in the server's words, uncut (see
    MalformedEvent). Usage-only events carry only the token counts;
    `server_timings` what the server reported about its own work (Ollama's durations), by
    the name of the record's field each figure fills (`results.records.ServerTimings`: ms
    and token counts; None where it did not say), a plain mapping: the record types it;
    `cached_tokens` the prompt tokens it served from its prefix cache (OpenAI
    `usage.prompt_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`,
    llama.cpp `timings.cache_n`); `response_id` the response's own id, where it has one.
    `usage_problem` names a usage count the server sent that cannot be one (negative, not an
    integer, 2**31 or more), its value kept as text (`usage_count`): the count itself is then
    None, never a figure.
    """

    __slots__ = (
        "cached_tokens",
        "completion_tokens",
        "content_chars",
        "done",
        "error",
        "finish_reason",
        "has_tool_call",
        "prompt_tokens",
        "reasoning_chars",
        "response_id",
        "server_timings",
        "text",
        "token_only",
        "usage_problem",
    )

    def __init__(self) -> None:
        self.content_chars = 0
        self.reasoning_chars = 0
        self.has_tool_call = False
        self.text = ""
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.done = False
        self.error: str | None = None
        self.server_timings: dict[str, Any] | None = None
        self.cached_tokens: int | None = None
        self.response_id: str | None = None
        self.token_only = False
        self.usage_problem: str | None = None

    @property
    def has_output(self) -> bool:
        """True when the event carried generated output of any kind."""
        return bool(self.content_chars or self.reasoning_chars or self.has_tool_call)


Message = tuple[str, str]  # (role: system | user | assistant | tool, text)

# An agent's tool call and its result are an assistant message followed by a `tool` message
# (the tool's output). Adapters of chat APIs give the pair their API's own shape: the
# assistant message calls this tool with this id, the tool message answers that id.
TOOL_NAME = "run_tool"


def with_tool_calls(messages: Sequence[Message]) -> list[tuple[str, str, str | None]]:
    """(role, text, call id): an assistant message followed by a tool message calls the
    tool (id `call_<n>`, counted from 0 in the conversation); the tool message answers it."""
    result: list[tuple[str, str, str | None]] = []
    calls = 0
    for index, (role, text) in enumerate(messages):
        call: str | None = None
        if role == "assistant" and index + 1 < len(messages) and messages[index + 1][0] == "tool":
            call = f"call_{calls}"
            calls += 1
        elif role == "tool":
            call = f"call_{calls - 1}" if calls else "call_orphan"
        result.append((role, text, call))
    return result


def has_tool_messages(messages: Sequence[Message]) -> bool:
    """True when the conversation holds a tool result (an agent's growing context)."""
    return any(role == "tool" for role, _ in messages)


class MalformedEvent(ValueError):
    """An event that is not what the API family sends (bad JSON, wrong shape).

    The message says what is wrong; `data` is the event as received, uncut: it is server
    text, so whoever shows it quotes it through the run's `Redactor` (which redacts it
    before cutting it: a cut made here could leave most of an echoed key unrecognised).
    """

    def __init__(self, reason: str, data: bytes = b"") -> None:
        super().__init__(reason)
        self.data = data


class Adapter(Protocol):
    """One API family: its request (target, headers, body, where the request id and a
    priority go, the fields loadgen's options add) and its stream (framing, event parser).

    `target(path, model)`: the request target (path and query) of a request to `model`,
    from the run's path (`target.path`, else `default_path`, joined to the URL's): the path
    itself for APIs whose model goes in the body; an API with the model in its path (Gemini's
    `/v1beta/models/{model}:streamGenerateContent`) fills it in. Called once per model, not
    per request. `request_id_field`: the body field for the request id (None: the API has
    none); `priority_field`: the body field for a class's `priority` when no
    `target.priority_header` is set (None: the API has none, so a priority needs the header);
    `optional_fields`: the body fields each of loadgen's options adds
    (`force_output_tokens`, `include_usage`), which a strict server may refuse and the
    preflight names with the option that turns them off.

    `finish_signal`: every complete stream of this API carries a stop reason (OpenAI
    `finish_reason`, Anthropic `stop_reason`, TGI `details.finish_reason`, Ollama
    `done: true`, a Responses terminal event), so a stream that ends without one was cut
    short (`truncated`). `forces_length`: `force_output_tokens` reaches the server (the
    body asks for exactly `max_tokens`), so fewer tokens without a stop reason is a cut.

    `event_framing`: the bytes of an event's payload that carry no output, at the least:
    the size of `smallest_output_event` (the shortest payload this adapter reads as output:
    one byte of text in its lightest shape, tested so) less one. A token takes at least a
    byte of text, so the output events that arrived carry at most
    Σ (payload bytes − event_framing) tokens: a usage count above that (and the token-only
    events, and the EOS) is more than the stream could carry (`Exchange.check_usage`).
    """

    name: str
    default_path: str
    framing: str  # "sse" or "ndjson"
    finish_signal: bool
    forces_length: bool
    smallest_output_event: bytes
    event_framing: int
    request_id_field: IdField | None
    priority_field: str | None
    optional_fields: Mapping[str, tuple[str, ...]]

    def headers(self, api_key: str | None) -> dict[str, str]:
        """Headers every request carries: the API's own, and the key where it expects it."""
        ...

    def target(self, path: str, model: str) -> str:
        """The request target of a request to `model`, from the run's path."""
        ...

    def build_body(
        self, messages: Sequence[Message], max_tokens: int, options: BodyOptions
    ) -> dict[str, Any]:
        """The JSON body for one streamed request of a conversation (role, text) so far."""
        ...

    def parse(self, event: bytes, data: bytes) -> Delta:
        """One event (SSE name and data; NDJSON: b"" and the line) as a Delta.

        Raises MalformedEvent when it is not what the API sends.
        """
        ...


def request_body(
    adapter: Adapter, messages: Sequence[Message], max_tokens: int, options: BodyOptions, *,
    priority: int | None = None, request_id: str | None = None, id_mode: str = "auto",
) -> dict[str, Any]:  # fmt: skip
    """The JSON body of one request, the one place it is shaped (the engine's requests and
    the preflight's alike): the adapter's body, a class's `priority` (None when it has none
    or goes as a header) in the adapter's `priority_field`, and the request id in its
    `request_id_field` as `id_mode` says: `on` where the API has a field, `auto` where that
    field is sent by default (metadata), `off` never. A field the workload's `extra_body`
    already sets is left as the user wrote it."""
    body = adapter.build_body(messages, max_tokens, options)
    if priority is not None and adapter.priority_field is not None:
        body[adapter.priority_field] = priority
    field = adapter.request_id_field
    if request_id is None or field is None or id_mode == "off":
        return body
    if id_mode == "auto" and not field.by_default:
        return body
    if field.key is None:
        body.setdefault(field.name, request_id)
        return body
    holder = body.get(field.name)
    if holder is None:
        body[field.name] = {field.key: request_id}
    elif isinstance(holder, dict):
        body[field.name] = {field.key: request_id, **holder}
    return body


class StreamDecoder(Protocol):
    """Bytes in, complete events out, independent of how the bytes were split."""

    comments: int

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """The events `chunk` completed, as (event name, data) pairs."""
        ...

    def close(self) -> list[tuple[bytes, bytes]]:
        """End of stream: the last event, if it had no terminator."""
        ...


def new_decoder(adapter: Adapter, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> StreamDecoder:
    """A fresh decoder for one response body of `adapter`'s framing (events capped at
    `max_event_bytes`: a longer one raises `EventTooLarge`)."""
    if adapter.framing == "ndjson":
        return NdjsonDecoder(max_event_bytes)
    return SseDecoder(max_event_bytes)


def json_object(data: bytes) -> dict[str, Any]:
    """One event's payload as a JSON object, else MalformedEvent (what the adapters share)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise MalformedEvent("not JSON", data) from None
    if not isinstance(obj, dict):
        raise MalformedEvent("not a JSON object", data)
    return obj


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer <key>`, the OpenAI convention most servers follow."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# The largest usage count taken as a figure: a server's count at or above 2**31 (the most a
# 32-bit counter holds; no context window comes near it) is not a count. Summed over the
# records of any run (at most 10**8 requests), such counts stay far inside 64 bits.
MAX_USAGE_COUNT = 2**31 - 1
# The longest duration a server's own timing may report, in ms (11.6 days: past any
# deadline a request can have); a longer, negative or non-finite one is no duration.
MAX_SERVER_MS = 1e9


def token_count(value: object) -> int | None:
    """`value` when it is a plausible token count (an int in [0, MAX_USAGE_COUNT]), else
    None: a server's timings and cache counts are diagnostics, dropped when absurd (the
    2**63 - 1 of three requests summed past 64 bits)."""
    if type(value) is int and 0 <= value <= MAX_USAGE_COUNT:
        return value
    return None


def duration_ms(value: object, per_ms: float = 1.0) -> float | None:
    """`value` (a server's duration, `per_ms` of its units to a ms) in ms when it is a
    number in [0, MAX_SERVER_MS] ms, else None (negative, Infinity-sized, a bool, text)."""
    if type(value) not in (int, float):
        return None
    ms = value / per_ms  # type: ignore[operator]  # an int or a float, checked above
    return float(ms) if math.isfinite(ms) and 0 <= ms <= MAX_SERVER_MS else None


def usage_count(value: object, name: str, delta: Delta) -> int | None:
    """`value` when it is a usage count (an int in [0, MAX_USAGE_COUNT], not a bool); None
    when absent (null); otherwise None, and `name=value` (as text, cut to 40 characters)
    noted in `delta.usage_problem`: a number the server cannot mean is checked here, at the
    door, and never stored as a figure."""
    if value is None:
        return None
    if type(value) is int and 0 <= value <= MAX_USAGE_COUNT:
        return value
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # an int past 64 bits (the JSON parser keeps up to 2**64 - 1)
        text = str(value)
    shown = f"{name}={text[:40]}"
    delta.usage_problem = f"{delta.usage_problem}; {shown}" if delta.usage_problem else shown
    return None


def error_message(obj: Mapping[str, Any]) -> str | None:
    """The server's message when `obj` is an error event, with or without a `type` field:
    `{"type": "error", "message": ...}`, `{"type": "error", "error": {...}}` or a bare
    `{"error": {"message": ...}}` / `{"error": "..."}` (a gateway's mid-stream failure, e.g.
    LiteLLM's); None when it is not one."""
    error = obj.get("error")
    if not error and obj.get("type") != "error":
        return None
    if isinstance(error, dict):
        message = error.get("message") or error.get("type") or error.get("code")
        return str(message or error)
    if error:
        return str(error)
    return str(obj.get("message") or obj.get("code") or "error event")


def flatten(messages: Sequence[Message]) -> str:
    """A conversation as plain text, one message per paragraph (for text-in APIs)."""
    return "\n\n".join(text for _, text in messages)
