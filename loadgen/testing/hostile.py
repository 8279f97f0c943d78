"""Hostile servers: one scripted response per way a server can misbehave on the wire.

Fixtures for the hostile-server suite (`tests/engine/test_hostile.py`) and its benchmark
(`benchmarks/hostile.py`), played by `loadgen.testing.ScriptedServer`. Each case is a
script and what the client must make of it: the outcome every request ends with, a
phrase its error says, and the phrase the preflight's error says. Long or endless
responses are generators, so the server holds one piece at a time (a 100 MB line costs
the server 1 MiB), and they stop when the client closes the connection.

The cases use the suite's short deadlines (`DEADLINES`): a case that waits on a deadline
ends by it, however much or little the server sends.

Below them, the servers that once made loadgen's memory or time grow without bound (a
stream of tiny events, empty `data:` lines, a huge answer in a session, a huge or trickled
refusal of `--cache reset`, huge or trickled `/metrics`): `benchmarks/memory_bounds.py`
plays them at full size (peak RSS before and after the caps), the suite with small caps.
"""

from __future__ import annotations

import base64
import itertools
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from loadgen.engine.request_ids import plan_number
from loadgen.results.records import Outcome
from loadgen.testing import (
    CLOSE,
    LAST_CHUNK,
    RESET,
    ReceivedRequest,
    Step,
    chat_chunk,
    chunk,
    head,
    sse,
    stream_steps,
)
from loadgen.units import MIB
from loadgen.workload.spec import Deadlines

DEADLINES = Deadlines(first_token_s=1.0, stall_s=0.5, total_s=2.0)
FOREVER = 3600.0  # a pause longer than any deadline of the suite: a silent socket
TOKENS = [chat_chunk(role="assistant"), *(chat_chunk(f" w{i}") for i in range(3))]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostileCase:
    """A misbehaving response and what loadgen must make of it."""

    name: str
    what: str  # the misbehaviour, in a few words
    script: Callable[[ReceivedRequest], Iterator[Step]]
    outcome: Outcome  # every request of a run against it ends so
    error: str  # a phrase of each record's error ("" for ok)
    preflight: str  # a phrase of the preflight's error ("" when the preflight passes)


def _sse_head() -> Iterator[Step]:
    yield head()


def html_200(_request: ReceivedRequest) -> Iterator[Step]:
    page = b"<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>\n"
    yield (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(page), page)
    )


def heartbeats_forever(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    while True:
        yield chunk(b": ping\n\n")
        yield 0.05


def one_byte_per_second(_request: ReceivedRequest) -> Iterator[Step]:
    whole = head() + b"".join(chunk(e) for e in [*TOKENS, sse("[DONE]")]) + LAST_CHUNK
    for i in range(len(whole)):
        yield whole[i : i + 1]
        yield 1.0


def line_100mb(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    yield chunk(TOKENS[0])
    piece = b"x" * MIB
    yield chunk(b"data: " + piece)
    for _ in range(99):
        yield chunk(piece)  # one line of 100 MiB: no newline ever comes


def invalid_utf8(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    yield chunk(b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe\xc3"}}]}\n\n')
    yield chunk(sse("[DONE]"))
    yield LAST_CHUNK


def invalid_json(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    yield chunk(b'data: {"choices": [{"delta": {"content": "hi"\n\n')
    yield chunk(sse("[DONE]"))
    yield LAST_CHUNK


def close_mid_chunk(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    yield chunk(TOKENS[0])
    event = TOKENS[1]
    yield b"%x\r\n" % len(event) + event[: len(event) // 2]
    yield CLOSE


def bogus_chunk_size(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    yield b"zz\r\n" + TOKENS[0] + b"\r\n"
    yield FOREVER


def chunk_size_overflow(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    yield b"1" + b"0" * 40 + b"\r\n" + TOKENS[0]  # 2**160 bytes: not a size
    yield FOREVER


def huge_chunk_size(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    yield b"ffffffffffffffff\r\n"  # 2**64 - 1 bytes announced; the tokens come inside it
    yield from TOKENS
    yield CLOSE  # long before the chunk could end


def headers_20mb(_request: ReceivedRequest) -> Iterator[Step]:
    yield b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    lines = (b"X-Pad: " + b"a" * 1016 + b"\r\n") * 16  # 16 lines of 1 KiB
    for _ in range(20 * 64):
        yield lines  # 20 MiB in all
    yield b"\r\n"


def silent_socket(_request: ReceivedRequest) -> Iterator[Step]:
    yield FOREVER  # reads the request, never answers


def tokens_then_pings(_request: ReceivedRequest) -> Iterator[Step]:
    yield from _sse_head()
    yield from (chunk(t) for t in TOKENS)
    for _ in itertools.count():
        yield 0.05
        yield chunk(b": ping\n\n")


def http10_no_length(_request: ReceivedRequest) -> Iterator[Step]:
    yield b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
    yield from TOKENS
    yield chat_chunk(finish="stop")
    yield sse("[DONE]")
    yield CLOSE  # the body ends with the connection


def _with_usage(usage: bytes) -> Callable[[ReceivedRequest], Iterator[Step]]:
    """A valid stream of 3 tokens whose usage chunk is `usage` (raw JSON text, so a float
    or a 64-bit overflow goes out exactly as written)."""

    def script(_request: ReceivedRequest) -> Iterator[Step]:
        yield from stream_steps([*TOKENS, chat_chunk(finish="stop"),
                                 b'data: {"choices": [], "usage": ' + usage + b"}\n\n",
                                 sse("[DONE]")])  # fmt: skip

    return script


def bad_status(status: bytes) -> Callable[[ReceivedRequest], Iterator[Step]]:
    """A status line whose code is no HTTP status (`3000000000`, `10^20`, `099`, `600`)."""

    def script(_request: ReceivedRequest) -> Iterator[Step]:
        yield b"HTTP/1.1 " + status + b" X\r\nContent-Type: text/event-stream\r\n\r\n"
        yield from TOKENS
        yield CLOSE

    return script


def reset_close_delimited(_request: ReceivedRequest) -> Iterator[Step]:
    yield b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    yield from TOKENS
    yield 0.05
    yield RESET  # an RST, not the FIN that ends a close-delimited body


TRICKLED_BODY = b'{"error": {"message": "overloaded, try again later"}}'


def trickled_error(status: int) -> Callable[[ReceivedRequest], Iterator[Step]]:
    """An error status, then its body one byte every 0.3 s: slower than any deadline."""

    def script(_request: ReceivedRequest) -> Iterator[Step]:
        yield head(status, chunked=False, length=len(TRICKLED_BODY))
        for i in range(len(TRICKLED_BODY)):
            yield TRICKLED_BODY[i : i + 1]
            yield 0.3

    return script


NO_TOKEN = "streamed no generated token within the preflight's"
CASES = [
    HostileCase(name="html-200", what="200 with text/html", script=html_200,
                outcome=Outcome.STREAM_ERROR, error="content-type 'text/html'",
                preflight="streamed no generated output"),
    HostileCase(name="heartbeats-forever", what="SSE comments, never a token",
                script=heartbeats_forever, outcome=Outcome.TIMEOUT_FIRST_TOKEN,
                error="no generated token in 1 s", preflight=NO_TOKEN),
    HostileCase(name="one-byte-per-second", what="a valid stream, 1 byte a second",
                script=one_byte_per_second, outcome=Outcome.TIMEOUT_FIRST_TOKEN,
                error="no generated token in 1 s", preflight="sent no response headers"),
    HostileCase(name="line-100mb", what="one 100 MiB SSE line", script=line_100mb,
                outcome=Outcome.STREAM_ERROR, error="a stream event over the 1 MiB cap",
                preflight="a stream event over the 1 MiB cap"),
    HostileCase(name="invalid-utf8", what="bytes that are not UTF-8 in data:",
                script=invalid_utf8, outcome=Outcome.STREAM_ERROR,
                error="malformed event: not JSON", preflight="not with a openai-chat stream"),
    HostileCase(name="invalid-json", what="data: that is not JSON", script=invalid_json,
                outcome=Outcome.STREAM_ERROR, error="malformed event: not JSON",
                preflight="not with a openai-chat stream"),
    HostileCase(name="close-mid-chunk", what="connection closed inside a chunk",
                script=close_mid_chunk, outcome=Outcome.STREAM_ERROR,
                error="connection closed", preflight="peer closed connection"),
    HostileCase(name="bogus-chunk-size", what="chunk size 'zz'", script=bogus_chunk_size,
                outcome=Outcome.STREAM_ERROR, error="malformed chunk size",
                preflight="chunk"),
    HostileCase(name="chunk-size-overflow", what="a 41-digit chunk size",
                script=chunk_size_overflow, outcome=Outcome.STREAM_ERROR,
                error="malformed chunk size", preflight="chunk"),
    HostileCase(name="huge-chunk-size", what="a 2**64-byte chunk, closed early",
                script=huge_chunk_size, outcome=Outcome.STREAM_ERROR,
                error="connection closed", preflight=""),
    HostileCase(name="headers-20mb", what="20 MiB of response headers", script=headers_20mb,
                outcome=Outcome.STREAM_ERROR, error="response headers over the 64 KiB cap",
                preflight="header"),
    HostileCase(name="silent-socket", what="reads the request, never answers",
                script=silent_socket, outcome=Outcome.TIMEOUT_FIRST_TOKEN,
                error="no generated token in 1 s", preflight="sent no response headers"),
    HostileCase(name="tokens-then-pings", what="3 tokens, then only heartbeats",
                script=tokens_then_pings, outcome=Outcome.TIMEOUT_STALL,
                error="no token for 0.5 s", preflight=""),
    HostileCase(name="http10-no-length", what="HTTP/1.0, body ends at close",
                script=http10_no_length, outcome=Outcome.OK, error="", preflight=""),
    HostileCase(name="usage-1e18", what="usage completion_tokens: 1e18",
                script=_with_usage(b'{"completion_tokens": 1e18, "prompt_tokens": 9}'),
                outcome=Outcome.STREAM_ERROR, error="completion_tokens=1e+18", preflight=""),
    HostileCase(name="usage-2**64", what="usage completion_tokens: 2**64 - 1",
                script=_with_usage(b'{"completion_tokens": 18446744073709551615}'),
                outcome=Outcome.STREAM_ERROR, error="completion_tokens=18446744073709551615",
                preflight=""),
    HostileCase(name="usage-negative", what="usage completion_tokens: -8, prompt_tokens: -200",
                script=_with_usage(b'{"completion_tokens": -8, "prompt_tokens": -200}'),
                outcome=Outcome.STREAM_ERROR,
                error="completion_tokens=-8; prompt_tokens=-200", preflight=""),
    HostileCase(name="usage-beyond-the-stream", what="usage completion_tokens: 2**31 - 1",
                script=_with_usage(b'{"completion_tokens": 2147483647}'),
                outcome=Outcome.STREAM_ERROR, error="more than the", preflight=""),
    # 600 tokens: under the bytes that arrived (the door's bound), far over what 3 events of
    # 3 characters carry: the usage is kept, N (and TPOT) come from the events, still ok.
    HostileCase(name="usage-beyond-the-events", what="usage completion_tokens: 600 after 3",
                script=_with_usage(b'{"completion_tokens": 600}'), outcome=Outcome.OK,
                error="", preflight=""),
    HostileCase(name="status-3000000000", what="HTTP/1.1 3000000000 X",
                script=bad_status(b"3000000000"), outcome=Outcome.STREAM_ERROR,
                error="a status code outside 100-599: 'HTTP/1.1 3000000000 X'",
                preflight="illegal status line"),
    HostileCase(name="status-10^20", what="a 21-digit status code",
                script=bad_status(b"1" + b"0" * 20), outcome=Outcome.STREAM_ERROR,
                error="a status code outside 100-599", preflight="illegal status line"),
    HostileCase(name="reset-close-delimited", what="an RST ends a close-delimited stream",
                script=reset_close_delimited, outcome=Outcome.STREAM_ERROR,
                error="Connection reset by peer", preflight=""),
    HostileCase(name="trickled-500", what="a 500 whose body comes a byte per 0.3 s",
                script=trickled_error(500), outcome=Outcome.HTTP_ERROR,
                error="HTTP 500: {", preflight="answered HTTP 500"),
]  # fmt: skip


# -- servers that echo a secret where a cut falls -----------------------------------------
# The key is echoed back (as the Authorization header it came in, or base64 of it) into
# each kind of server text loadgen shows, placed so that loadgen's cut of that text falls
# at every offset of it; or the server cuts it itself. No artifact of the run may then hold
# any 8 characters of the key or of its base64 forms (`FORBIDDEN`).
CUT_KEY = "sk-SuperSecret-7f3a9b2c1"
CUT_HEADER = f"Bearer {CUT_KEY}"
ECHOES = {"raw": CUT_HEADER, "b64": base64.b64encode(f"auth={CUT_HEADER};".encode()).decode()}
# Where loadgen cuts each kind of text (runner.QUOTE_CHARS, QUOTE_EVENT_CHARS; the status
# line comes after its reason's prefix): restated here, so a changed cut shows in the test.
SHOWN = {"body": 300, "event": 300, "malformed": 120}
SHOWN["status"] = 300 - len("not an HTTP response: '")
CHANNELS = (*SHOWN, "server-cut")
CUTS = [(c, e, i) for c in CHANNELS for e, text in ECHOES.items() for i in range(len(text) + 1)]


def base64_forms(secret: str) -> list[str]:
    """`secret` as it appears inside any base64 text: both alphabets, each byte alignment
    (only the characters fixed by the secret's own bytes). Written apart from
    `loadgen.engine.secrets`, so that a mistake there cannot hide behind the same one here."""
    raw, forms = secret.encode(), []
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for shift in range(3):
            whole = (shift + len(raw)) // 3 * 4
            forms.append(encode(b"\0" * shift + raw).decode()[4 if shift else 0 : whole])
    return forms


def windows(text: str, size: int = 8) -> set[str]:
    """Every `size`-character window of `text`."""
    return {text[i : i + size] for i in range(len(text) - size + 1)}


FORBIDDEN = windows(CUT_KEY) | {w for form in base64_forms(CUT_KEY) for w in windows(form)}


def leaks(text: str) -> list[str]:
    """The 8-character windows of the key (or its base64) that `text` holds."""
    return sorted(w for w in FORBIDDEN if w in text)


def key_pieces(text: str, size: int = 4) -> list[str]:
    """The `size`-character windows of the key that `text` holds. Where loadgen made the
    cut, redacting before cutting leaves none of the key at all: a cut made first would
    leave the piece before it (shorter than 8 characters, so `leaks` misses it)."""
    return sorted(w for w in windows(CUT_KEY, size) if w in text)


def cut_echo(channel: str, echo: str, offset: int) -> list[Step]:
    """A response that puts the echoed key where loadgen's cut of `channel` falls `offset`
    characters into it (for `server-cut`: the server cut it there itself, and sends both
    pieces)."""
    text = ECHOES[echo]
    if channel == "server-cut":
        body = f"bad key {text[:offset]} / ...{text[offset:]} end".encode()
        return [head(401, chunked=False, length=len(body)), body]
    payload = "e" * (SHOWN[channel] - offset) + text + " tail"
    if channel == "body":
        body = payload.encode()
        return [head(500, chunked=False, length=len(body)), body]
    if channel == "event":
        return stream_steps([sse({"error": {"message": payload}})], done=False)
    if channel == "malformed":
        return stream_steps([f"data: {payload}\n\n".encode()], done=False)
    return [f"{payload}\r\n\r\n".encode()]  # a status line that is not HTTP


def echo_cuts(request: ReceivedRequest) -> list[Step]:
    """The handler: request N plays `CUTS[N]`; the preflight (its own id) an error
    body cut 12 characters into the key."""
    number = plan_number(request.headers.get("x-request-id"))
    if number is None:
        return cut_echo("body", "raw", 12)
    return cut_echo(*CUTS[number])


def artifact_texts(root: Path) -> dict[str, str]:
    """Every file under `root` as text: Parquet as every value of every column (its bytes
    are compressed), PNG as its bytes and its compressed text chunks, the rest as bytes
    (latin-1: every byte is kept)."""
    import polars as pl

    texts = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        text = raw.decode("latin-1")
        if path.suffix == ".parquet":
            frame = pl.read_parquet(path, glob=False)
            text += "\n".join(str(v) for column in frame.iter_columns() for v in column)
        elif path.suffix == ".png":
            text += "".join(_png_texts(raw))
        texts[str(path.relative_to(root))] = text
    return texts


def _png_texts(raw: bytes) -> Iterator[str]:
    pos = 8  # after the signature: chunks of length, type, data, CRC
    while pos + 8 <= len(raw):
        size = int.from_bytes(raw[pos : pos + 4], "big")
        kind, data = raw[pos + 4 : pos + 8], raw[pos + 8 : pos + 8 + size]
        if kind == b"zTXt":  # keyword, NUL, method, compressed text (tEXt is plain bytes)
            yield zlib.decompress(data.split(b"\0", 1)[1][1:]).decode("latin-1")
        elif kind == b"iTXt":  # keyword, NUL, flag, method, language, NUL, keyword, NUL, text
            rest = data.split(b"\0", 1)[1]
            text = rest[2:].split(b"\0", 2)[2]
            yield (zlib.decompress(text) if rest[0] else text).decode("latin-1")
        pos += 12 + size


# -- memory and time: what once grew without bound ----------------------------------------
# The smallest event a chat stream's output can come in (one character of content).
TINY = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
FINISH = [chat_chunk(finish="stop"), sse("[DONE]")]


def empty_data_lines(_request: ReceivedRequest) -> Iterator[Step]:
    """One event of empty `data:` lines that never ends (822 MiB, growing, before they
    counted against the event cap)."""
    yield from _sse_head()
    yield chunk(TOKENS[0])
    lines = chunk(b"data:\n" * 8192)
    while True:
        yield lines


def tiny_events(
    count: int | None = None, *, per_write: int = 512
) -> Callable[[ReceivedRequest], Iterator[Step]]:
    """`count` one-character content events, `per_write` to a write (None: for ever; 2 GiB
    of stamps in 25 s before the stamp cap), then a stop and `[DONE]`."""

    def script(_request: ReceivedRequest) -> Iterator[Step]:
        yield from _sse_head()
        yield chunk(TOKENS[0])
        sent = 0
        while count is None or sent < count:
            n = per_write if count is None else min(per_write, count - sent)
            yield chunk(TINY * n)
            sent += n
        yield from (chunk(e) for e in FINISH)
        yield LAST_CHUNK

    return script


def long_answer(
    chars: int, *, event_chars: int = 65_536
) -> Callable[[ReceivedRequest], Iterator[Step]]:
    """An answer of `chars` characters in events of `event_chars` (a 1.2 GB answer took
    4.9 GiB when a session kept all of it), then a stop and `[DONE]`; the next turn gets a
    short answer."""
    piece = chunk(chat_chunk("y" * event_chars))

    def script(request: ReceivedRequest) -> Iterator[Step]:
        messages = (request.body or {}).get("messages", [])
        if any(m.get("role") == "assistant" for m in messages):
            yield from stream_steps([*TOKENS, chat_chunk(finish="stop")])
            return
        yield from _sse_head()
        yield chunk(TOKENS[0])
        for _ in range(chars // event_chars):
            yield piece
        if chars % event_chars:
            yield chunk(chat_chunk("y" * (chars % event_chars)))
        yield from (chunk(e) for e in FINISH)
        yield LAST_CHUNK

    return script


def exposition(series: int, *, labels: int = 8) -> bytes:
    """A Prometheus text exposition a vLLM could serve, plus `series` samples of a gauge with
    `labels` labels each (~25 bytes a label): 100,000 series of 8 labels are ~22 MB."""
    head_lines = [
        b"# TYPE vllm:num_requests_running gauge",
        b'vllm:num_requests_running{model_name="m"} 1.0',
        b"# TYPE vllm:num_requests_waiting gauge",
        b'vllm:num_requests_waiting{model_name="m"} 0.0',
        b"# TYPE junk gauge",
    ]
    names = [b"label_%d" % i for i in range(labels)]
    lines = [
        b"junk{" + b",".join(b'%b="value-%08d"' % (n, i) for n in names) + b"} %d" % i
        for i in range(series)
    ]
    return b"\n".join([*head_lines, *lines]) + b"\n"


def metrics_reply(body: bytes, *, trickle_s: float = 0.0) -> list[Step]:
    """`/metrics` answered with `body` (with `trickle_s`: one byte every `trickle_s`, for
    ever in practice: httpx's timeout restarts on every read)."""
    head_bytes = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))  # fmt: skip
    if not trickle_s:
        return [head_bytes, body]
    return [head_bytes, *(s for i in range(len(body)) for s in (body[i : i + 1], trickle_s))]


def serving_metrics(
    body: bytes, *, trickle_s: float = 0.0
) -> Callable[[ReceivedRequest], Iterator[Step] | list[Step]]:
    """A chat server whose `GET /metrics` is `metrics_reply(body, trickle_s)`."""

    def handler(request: ReceivedRequest) -> Iterator[Step] | list[Step]:
        if request.path.startswith("/metrics"):
            return metrics_reply(body, trickle_s=trickle_s)
        return stream_steps([*TOKENS, chat_chunk(finish="stop")])

    return handler


RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")


def refusing_reset(
    body_bytes: int, *, trickle_s: float = 0.0
) -> Callable[[ReceivedRequest], Iterator[Step] | list[Step]]:
    """A chat server that refuses `--cache reset` (HTTP 400) with a body of `body_bytes` (a
    400 MB one took 1.6 GiB when read whole), sent a MiB at a time, or one byte every
    `trickle_s` (never given up on, when each read had its own timeout)."""

    def refusal() -> Iterator[Step]:
        yield (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
               b"Content-Length: %d\r\n\r\n" % body_bytes)  # fmt: skip
        left, piece = body_bytes, b"refused " * (MIB // 8)
        while left > 0:
            if trickle_s:
                yield b"r"
                yield trickle_s
                left -= 1
            else:
                yield piece[:left]
                left -= len(piece)

    def handler(request: ReceivedRequest) -> Iterator[Step] | list[Step]:
        if request.path in RESET_PATHS:
            return refusal()
        return stream_steps([*TOKENS, chat_chunk(finish="stop")])

    return handler
