"""Fuzz properties of the decoders on the per-chunk path: SSE, NDJSON, the adapters, HTTP
framing.

Any bytes must end as data (an event, a Delta, MalformedEvent, on_lost), never as an
exception out of a decoder, and how the bytes were split across reads must not change what
comes out. `benchmarks/fuzz_decoders.py` runs the same checks for millions of inputs.

The HTTP framing is driven the way a socket drives it, with one shortcut: inside a running
event loop (`data_received` schedules parsing through the real `Pool`), each read is parsed
by calling `Connection.process()` right after `data_received`, so an exception reaches the
test instead of the loop's exception handler (where `Pool._drain` would log it).

The `@example`s pin the inputs that broke these properties before (a truthy non-list
`choices`, superscript digits in the status code and Content-Length, 2,000 interim
responses in one read), so they are checked on every run, not only when Hypothesis finds them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loadgen.adapters import APIS, adapter_for
from loadgen.adapters.generic import generic_spec
from loadgen.adapters.ndjson import NdjsonDecoder
from loadgen.adapters.protocol import Adapter, Delta, MalformedEvent
from loadgen.adapters.sse import EventTooLarge, SseDecoder
from loadgen.engine.transport import Connection, Pool, make_endpoint

ENDPOINT = make_endpoint("http://127.0.0.1:1", "/v1/chat/completions", {})
ADAPTERS = list(APIS)  # every family, `generic` last
GENERIC = generic_spec(
    {
        "body": {"p": "$prompt", "n": "$max_tokens"}, "content": "choices[0].delta.content",
        "reasoning": "choices[0].delta.reasoning", "done": {"path": "done", "equals": True},
        "output_tokens": "usage.completion_tokens", "prompt_tokens": "usage.prompt_tokens",
        "error": "error",
    },
    "fuzz.yaml",
)  # fmt: skip
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- helpers ------------------------------------------------------------------------------


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (out-of-range offsets are clamped)."""
    bounds = sorted({0, len(data), *(min(max(c, 0), len(data)) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def byte_by_byte(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def decode_sse(pieces: list[bytes]) -> tuple[list[tuple[bytes, bytes]], int]:
    decoder = SseDecoder()
    events = [event for piece in pieces for event in decoder.feed(piece)]
    events.extend(decoder.close())
    return events, decoder.comments


def decode_ndjson(pieces: list[bytes]) -> list[tuple[bytes, bytes]]:
    decoder = NdjsonDecoder()
    events = [event for piece in pieces for event in decoder.feed(piece)]
    return events + decoder.close()


def adapter(api: str) -> Adapter:
    return adapter_for(api, GENERIC)


class FakeTransport:
    """The four transport methods `Connection` uses; records whether it was aborted."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


class Recorder:
    """An ExchangeSink that keeps every callback in order, without timestamps."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_head(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        self.calls.append(("head", status))

    def on_body(self, data: bytes, t_ns: int) -> None:
        self.calls.append(("body", data))

    def on_end(self, t_ns: int) -> None:
        self.calls.append(("end",))

    def on_lost(self, reason: str, got_response_bytes: bool, t_ns: int) -> None:
        self.calls.append(("lost", got_response_bytes))

    def outcome(self) -> tuple[int | None, bytes, str | None]:
        """(status, the body bytes joined, the terminal callback) — what must not depend on splits."""
        status = next((c[1] for c in self.calls if c[0] == "head"), None)
        body = b"".join(c[1] for c in self.calls if c[0] == "body")
        terminal = next((c[0] for c in self.calls if c[0] in ("end", "lost")), None)
        return status, body, terminal

    def check_order(self) -> None:
        """At most one head, body only after it, at most one terminal and nothing after it."""
        kinds = [c[0] for c in self.calls]
        assert kinds.count("head") <= 1
        assert kinds.count("end") + kinds.count("lost") <= 1
        if "body" in kinds:
            assert "head" in kinds
            assert kinds.index("head") < kinds.index("body")
        if kinds and kinds[-1] not in ("end", "lost"):
            assert "end" not in kinds
            assert "lost" not in kinds


def feed_connection(pieces: list[bytes]) -> Recorder:
    """Feed `pieces` as successive reads, then close the connection; return what the sink saw."""
    recorder = Recorder()
    loop_errors: list[dict[str, Any]] = []

    async def drive() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        conn = Connection(Pool(ENDPOINT))
        conn.connection_made(FakeTransport())
        conn.sink = recorder  # what Connection.send does besides writing the request
        for piece in pieces:
            conn.data_received(piece)
            conn.process()
        conn.connection_lost(None)
        await asyncio.sleep(0)  # let the pool's scheduled drain run (it finds nothing left)

    asyncio.run(drive())
    assert not loop_errors
    recorder.check_order()
    return recorder


# -- strategies ---------------------------------------------------------------------------

cuts = st.lists(st.integers(0, 4096), max_size=10)

SSE_FIELDS = (b"data:", b"data: ", b"event: ", b"id: 1", b"retry: 5", b": ping", b":")
SSE_ENDINGS = (b"\n", b"\r", b"\r\n", b"\n\n", b"\r\n\r\n")
SSE_VALUES = (b"[DONE]", b'{"choices":[]}', b" ", b"x", b"\xff")
sse_tokens = st.sampled_from([*SSE_FIELDS, *SSE_ENDINGS, *SSE_VALUES])
sse_streams = st.one_of(st.binary(max_size=400), st.lists(sse_tokens, max_size=40).map(b"".join))

OUTPUT_KEYS = ("choices", "delta", "content", "text", "reasoning", "reasoning_content")
OTHER_KEYS = ("tool_calls", "usage", "completion_tokens", "prompt_tokens", "error", "message")
NEW_API_KEYS = (
    "type", "index", "content_block", "partial_json", "thinking", "stop_reason", "input_tokens",
    "output_tokens", "token", "special", "details", "generated_tokens", "generated_text",
    "error_type", "response", "done", "eval_count", "prompt_eval_count", "eval_duration",
    "total_duration", "incomplete_details", "reason",
)  # fmt: skip
EVENT_TYPES = (
    "content_block_delta", "content_block_start", "message_start", "message_delta",
    "message_stop", "text_delta", "thinking_delta", "input_json_delta", "tool_use", "error",
    "response.output_text.delta", "response.reasoning_text.delta", "response.completed",
    "response.incomplete", "response.failed", "max_output_tokens",
)  # fmt: skip
json_keys = st.sampled_from([*OUTPUT_KEYS, *OTHER_KEYS, *NEW_API_KEYS, "finish_reason"]) | st.text(
    max_size=5
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
    | st.sampled_from(EVENT_TYPES)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(json_keys, inner, max_size=4),
    max_leaves=20,
)


@st.composite
def envelopes(draw: st.DrawFn) -> Any:
    """A JSON value alone, or put where an OpenAI chunk has its choices, delta, usage or error."""
    value = draw(json_values)
    places = ["top", "choices", "choice", "delta", "usage", "error", "typed", "token", "done"]
    place = draw(st.sampled_from(places))
    kind = draw(st.sampled_from(EVENT_TYPES))
    return {
        "top": value,
        "choices": {"choices": value},
        "choice": {"choices": [value]},
        "delta": {"choices": [{"delta": value, "text": value, "finish_reason": value}]},
        "usage": {"usage": value, "choices": []},
        "error": {"error": value},
        # Anthropic / Responses: a typed event whose payload slots hold the value
        "typed": {
            "type": kind,
            "delta": value,
            "content_block": value,
            "message": value,
            "usage": value,
            "response": value,
            "error": value,
        },
        # TGI and Ollama
        "token": {"token": value, "details": value, "generated_text": value},
        "done": {
            "done": True,
            "message": value,
            "response": value,
            "eval_count": value,
            "total_duration": value,
            "prompt_eval_count": value,
        },
    }[place]


VALID_STATUS_LINES = (b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 100 Continue")
ODD_STATUS_LINES = (b"HTTP/1.1 503 Busy", b"HTTP/1.1 200", b"HTTP/1.1 ", b"ICY 200 OK")
INVALID_STATUS_LINES = (b"HTTP/1.1", b"", b"\x00\xff", b"HTTP/x 2 0", b"HTTP/1.1 OK 200")
status_lines = st.sampled_from([*VALID_STATUS_LINES, *ODD_STATUS_LINES, *INVALID_STATUS_LINES])
header_names = st.sampled_from(
    ["Content-Length", "Transfer-Encoding", "Connection", "Content-Type", "X-Any"]
)
latin1_text = st.text(st.characters(max_codepoint=255, exclude_characters="\r\n"), max_size=12)


@st.composite
def valid_responses(draw: st.DrawFn) -> tuple[bytes, int, bytes]:
    """A well-formed response (chunked, Content-Length or close-delimited) and its status and body."""
    chunks = draw(st.lists(st.binary(min_size=1, max_size=60), max_size=6))
    body = b"".join(chunks)
    status = draw(st.sampled_from([200, 201, 400, 429, 500]))
    framing = draw(st.sampled_from(["chunked", "length", "close"]))
    head = [f"HTTP/1.{draw(st.sampled_from('01'))} {status} Whatever".encode()]
    head.append(b"Content-Type: text/event-stream")
    if draw(st.booleans()):
        head.append(b"Connection: " + draw(st.sampled_from([b"keep-alive", b"close"])))
    if framing == "chunked":
        head.append(b"Transfer-Encoding: " + draw(st.sampled_from([b"chunked", b"Chunked"])))
        ext = draw(st.sampled_from([b"", b";x=1", b"; name"]))
        hex_case = draw(st.sampled_from([str.lower, str.upper]))
        payload = b"".join(
            hex_case(f"{len(c):x}").encode() + ext + b"\r\n" + c + b"\r\n" for c in chunks
        )
        payload += b"0\r\n" + draw(st.sampled_from([b"", b"X-Trailer: 1\r\n"])) + b"\r\n"
    elif framing == "length":
        head.append(f"Content-Length: {len(body)}".encode())
        payload = body
    else:
        payload = body
    interim = draw(st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n"]))
    return interim + b"\r\n".join(head) + b"\r\n\r\n" + payload, status, body


# -- SSE --------------------------------------------------------------------------------------


@FUZZ
@given(sse_streams, cuts)
def test_sse_any_bytes_decode_the_same_however_split(data: bytes, where: list[int]) -> None:
    """Any bytes decode without error to the same events and comment count, whole, byte by byte or split anywhere."""
    whole = decode_sse([data])
    assert decode_sse(split_at(data, where)) == whole
    assert decode_sse(byte_by_byte(data)) == whole


def decode_capped(
    decoder: SseDecoder | NdjsonDecoder, pieces: list[bytes]
) -> tuple[list[tuple[bytes, bytes]], int, bool]:
    """Events, comments and whether the cap ended the stream."""
    events: list[tuple[bytes, bytes]] = []
    try:
        for piece in pieces:
            events.extend(decoder.feed(piece))
        events.extend(decoder.close())
    except EventTooLarge as exc:
        return events + exc.events, decoder.comments, True
    return events, decoder.comments, False


@FUZZ
@given(sse_streams, cuts, st.sampled_from([8, 16, 64, 256]))
def test_sse_and_ndjson_caps_decide_the_same_however_split(
    data: bytes, where: list[int], cap: int
) -> None:
    """Under a small event cap, any bytes give the same events, comments and verdict (capped
    or not), whole, byte by byte or split anywhere."""
    for make in (SseDecoder, NdjsonDecoder):
        whole = decode_capped(make(cap), [data])
        assert decode_capped(make(cap), split_at(data, where)) == whole
        assert decode_capped(make(cap), byte_by_byte(data)) == whole


# -- NDJSON -----------------------------------------------------------------------------------

ndjson_tokens = st.sampled_from([b"\n", b"\r\n", b"\r", b" ", b"\t", b"{}", b'{"done":true}', b"x",
                                 b"\xff", b"\n\n", b"\x0b"])  # fmt: skip
ndjson_streams = st.one_of(
    st.binary(max_size=400), st.lists(ndjson_tokens, max_size=40).map(b"".join)
)


@FUZZ
@given(ndjson_streams, cuts)
def test_ndjson_any_bytes_decode_the_same_however_split(data: bytes, where: list[int]) -> None:
    """Any bytes decode without error to the same lines, whole, byte by byte or split anywhere;
    no line is blank or padded, and every non-whitespace byte is kept, in order."""
    whole = decode_ndjson([data])
    assert decode_ndjson(split_at(data, where)) == whole
    assert decode_ndjson(byte_by_byte(data)) == whole
    assert all(line and line == line.strip() for _, line in whole)
    space = b" \t\r\n\f\v"
    kept = b"".join(line for _, line in whole)
    assert bytes(b for b in kept if b not in space) == bytes(b for b in data if b not in space)


# -- adapters ---------------------------------------------------------------------------------


def parse_or_malformed(api: str, event: bytes, data: bytes) -> None:
    try:
        delta = adapter(api).parse(event, data)
    except MalformedEvent:
        return
    assert isinstance(delta, Delta)


@pytest.mark.parametrize("api", ADAPTERS)
@FUZZ
@given(event=st.binary(max_size=10), data=st.binary(max_size=200))
def test_adapter_any_bytes_give_a_delta_or_malformed(api: str, event: bytes, data: bytes) -> None:
    """Arbitrary bytes as an event's data parse to a Delta or raise MalformedEvent, nothing else."""
    parse_or_malformed(api, event, data)


@pytest.mark.parametrize("api", ADAPTERS)
@FUZZ
@given(value=envelopes())
@example(value={"choices": 1})
@example(value={"type": "content_block_start", "content_block": {"type": {"a": 1}}})
def test_adapter_any_json_value_gives_a_delta_or_malformed(api: str, value: Any) -> None:
    """Any JSON value, alone or in an API's event slots, parses to a Delta or raises MalformedEvent."""
    parse_or_malformed(api, b"", json.dumps(value).encode())


# -- HTTP framing -------------------------------------------------------------------------


@FUZZ
@given(status_lines, st.binary(max_size=600), cuts)
def test_http_any_bytes_after_a_status_line_never_raise(
    line: bytes, rest: bytes, where: list[int]
) -> None:
    """Arbitrary bytes after a valid or invalid status line never raise and end in at most one terminal callback."""
    data = line + b"\r\n" + rest
    feed_connection([data])
    feed_connection(split_at(data, where))


@FUZZ
@given(
    code=latin1_text,
    headers=st.lists(st.tuples(header_names, latin1_text), max_size=4),
    rest=st.binary(max_size=100),
)
@example(code="²00", headers=[], rest=b"")
@example(code="200", headers=[("Content-Length", "¹")], rest=b"x")
def test_http_any_status_code_and_header_values_never_raise(
    code: str, headers: list[tuple[str, str]], rest: bytes
) -> None:
    """Any latin-1 status code and Content-Length / Transfer-Encoding / Connection values never raise."""
    lines = [f"HTTP/1.1 {code} OK", *(f"{name}: {value}" for name, value in headers)]
    feed_connection([("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + rest])


def test_http_many_interim_responses_in_one_read_never_raise() -> None:
    """2,000 `100 Continue` heads in one read (50 kB, under the head limit) are skipped without error."""
    data = (
        b"HTTP/1.1 100 Continue\r\n\r\n" * 2000 + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    )
    assert feed_connection([data]).outcome() == (200, b"ok", "end")


@FUZZ
@given(valid_responses(), cuts)
def test_http_framing_does_not_depend_on_the_split(
    response: tuple[bytes, int, bytes], where: list[int]
) -> None:
    """A valid chunked, Content-Length or close-delimited response gives the same status, body and end, whole, byte by byte or split anywhere."""
    data, status, body = response
    expected = (status, body, "end")
    assert feed_connection([data]).outcome() == expected
    assert feed_connection(split_at(data, where)).outcome() == expected
    assert feed_connection(byte_by_byte(data)).outcome() == expected
