"""Test fixtures others can reuse: a scripted streaming server and a one-call engine run.

`run_engine` runs plans through the engine harness (`loadgen.engine.harness`, as `loadgen
run` does) against a URL in real time; `loadgen.testing.virtual` runs the same scripts
without sockets, in virtual time, where every interval is exact. Records, run folders and
workload files are built by `loadgen.testing.builders` (its record builders and
`write_run` are exported here too).

`ScriptedServer` is a raw-socket HTTP/1.1 server on loopback, in its own thread and event
loop, whose every response is a script of steps (bytes to write, pauses, a close or a
reset). It exists to produce exactly the byte sequences real servers produce (early role
chunks, heartbeats, coalesced tokens, missing `[DONE]`, closes after each stream, resets
mid-stream), which a well-behaved simulator would not. It shares no code with the client.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ssl import SSLContext
from time import perf_counter_ns
from typing import Any

import anyio

from loadgen.adapters import adapter_for
from loadgen.adapters.generic import GenericSpec
from loadgen.adapters.protocol import BodyOptions
from loadgen.engine import harness
from loadgen.engine.harness import run_beside
from loadgen.engine.runner import Engine, EngineConfig
from loadgen.engine.transport import Connector, Pool, make_endpoint
from loadgen.results.records import RequestRecord
from loadgen.testing.builders import failed_record as failed_record
from loadgen.testing.builders import split_record as split_record
from loadgen.testing.builders import streamed_record as streamed_record
from loadgen.testing.builders import write_run as write_run
from loadgen.workload.plans import RequestPlan, Work
from loadgen.workload.spec import Deadlines

CLOSE = "close"  # step: close the connection gracefully (FIN)
RESET = "reset"  # step: abort the connection (RST)
Step = bytes | float | str  # bytes: write; float: sleep seconds; CLOSE / RESET


class NullTransport:
    """A transport that keeps what is written and sends nothing: a connection's writes
    without a socket (the simulator's protocol in tests, the send path in benchmarks)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str) -> None:
        return None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


@dataclass(slots=True)
class ReceivedRequest:
    """What the scripted server saw: method, path, headers (lower-case), JSON body."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    connection: int  # which accepted connection carried it (0, 1, ...)
    received_ns: int
    header_names: list[str] = field(default_factory=list)  # lower-case, as sent, repeats kept
    head: bytes = b""  # the request line and headers as they came on the wire


Handler = Callable[[ReceivedRequest], Iterable[Step]]  # a generator may play for ever


def sse(obj: Mapping[str, Any] | str) -> bytes:
    """One SSE event: `data: <json>` (or a raw string such as `[DONE]`) and a blank line."""
    payload = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {payload}\n\n".encode()


def chat_chunk(
    content: str | None = None,
    *,
    role: str | None = None,
    reasoning: str | None = None,
    finish: str | None = None,
    usage: Mapping[str, int] | None = None,
    no_choices: bool = False,
) -> bytes:
    """An OpenAI chat.completion.chunk event."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
        delta["content"] = content
    elif content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta["reasoning_content"] = reasoning
    obj: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    obj["choices"] = [] if no_choices else [{"index": 0, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        obj["usage"] = dict(usage)
    return sse(obj)


def usage(completion: int, prompt: int = 10) -> dict[str, int]:
    """An OpenAI usage object."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def head(
    status: int = 200, *, chunked: bool = True, close: bool = False, length: int | None = None
) -> bytes:
    """Response status line and headers."""
    reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error"}.get(status, "X")
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: text/event-stream"]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def stream_steps(
    events: Sequence[bytes],
    *,
    gap_s: float = 0.0,
    first_delay_s: float = 0.0,
    done: bool = True,
    chunked: bool = True,
    close: bool = False,
) -> list[Step]:
    """A 200 streaming response: events `gap_s` apart, `[DONE]`, and the end of the body."""
    steps: list[Step] = [head(chunked=chunked, close=close or not chunked)]
    if first_delay_s:
        steps.append(first_delay_s)
    body = [*events, sse("[DONE]")] if done else list(events)
    for i, event in enumerate(body):
        if i and gap_s:
            steps.append(gap_s)
        steps.append(chunk(event) if chunked else event)
    if chunked:
        steps.append(LAST_CHUNK)
    if close or not chunked:
        steps.append(CLOSE)
    return steps


def simple_chat(tokens: int, *, gap_s: float = 0.0, first_delay_s: float = 0.0) -> list[Step]:
    """A well-behaved chat stream: role chunk, `tokens` one-word chunks, finish, usage, DONE."""
    events = [chat_chunk(role="assistant")]
    events += [chat_chunk(f" w{i}") for i in range(tokens)]
    events += [chat_chunk(finish="stop"), chat_chunk(usage=usage(tokens), no_choices=True)]
    steps = stream_steps(events, gap_s=gap_s)
    if first_delay_s:
        steps.insert(2, first_delay_s)  # after the head and the role chunk
    return steps


def compressed_chat(
    tokens: int, *, encoding: str = "gzip", wbits: int = 31, sync: bool = True,
    gap_s: float = 0.0,
) -> list[Step]:  # fmt: skip
    """`simple_chat`'s events compressed with zlib `wbits` (31 gzip, 15 zlib, −15 raw
    deflate) under `Content-Encoding: encoding`, `gap_s` apart: each flushed as written
    (`sync`, as a server compressing a stream should), or left to the compressor, which
    writes a block only when it fills or the stream ends (as a proxy's gzip does)."""
    events = [chat_chunk(role="assistant"), *(chat_chunk(f" w{i}") for i in range(tokens)),
              chat_chunk(finish="stop"), chat_chunk(usage=usage(tokens), no_choices=True),
              sse("[DONE]")]  # fmt: skip
    compressor = zlib.compressobj(wbits=wbits)
    steps: list[Step] = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked"
        b"\r\nContent-Encoding: " + encoding.encode() + b"\r\n\r\n"
    ]
    for index, event in enumerate(events):
        if index and gap_s:
            steps.append(gap_s)
        out = compressor.compress(event) + (compressor.flush(zlib.Z_SYNC_FLUSH) if sync else b"")
        if out:
            steps.append(chunk(out))
    return [*steps, chunk(compressor.flush()), LAST_CHUNK]


class ScriptedServer:
    """A loopback HTTP/1.1 server whose responses come from `handler(request)` scripts
    (over TLS with `ssl`, a server context: an https URL)."""

    def __init__(self, handler: Handler, *, ssl: SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl = ssl
        self.requests: list[ReceivedRequest] = []
        self.finished: dict[str, int] = {}  # X-Request-Id → when its script's last step was played
        self.connections = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._open: set[asyncio.StreamWriter] = set()  # connections not yet closed

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:PORT (https:// with `ssl`)."""
        return f"{'https' if self.ssl else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> ScriptedServer:
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("scripted server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        # TLS is started in `_connection` (start_tls), not by the server: a handshake that
        # fails then fails in a connection this server tracks and closes; one failing inside
        # asyncio's server was left to the garbage collector when the loop ended first.
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            # Close every connection now, on this loop: one left to the loop's teardown
            # leaves its socket to the garbage collector (an unclosed-socket warning in
            # whichever test runs then). A connection accepted just before the stop first
            # finishes its set-up (closing the server under it, Python 3.11 leaves its socket
            # unclosed), and every handler runs to its first await, where it is known.
            for _ in range(3):
                await asyncio.sleep(0)
            server.close()
            await asyncio.sleep(0)
            handlers = asyncio.all_tasks() - {asyncio.current_task()}
            for writer in list(self._open):
                writer.transport.abort()
            for handler in handlers:
                handler.cancel()
            if handlers:
                await asyncio.wait(handlers, timeout=5)
            for _ in range(3):
                await asyncio.sleep(0)  # the aborts' connection_lost callbacks run

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        self._open.add(writer)
        try:
            if self.ssl is not None:
                await writer.start_tls(self.ssl)
            while True:
                request = await self._read_request(reader, index)
                if request is None:
                    return
                self.requests.append(request)
                played = await self._play(self.handler(request), writer)
                self.finished[request.headers.get("x-request-id", "")] = perf_counter_ns()
                if not played:
                    return
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return  # the client went away (or refused the handshake), or the server stops
        finally:
            self._open.discard(writer)
            if not writer.is_closing():
                writer.close()

    async def _read_request(
        self, reader: asyncio.StreamReader, index: int
    ) -> ReceivedRequest | None:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        lines = raw.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers, names = {}, []
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
                names.append(name.strip().lower())
        body_bytes = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(body_bytes) if body_bytes else None
        return ReceivedRequest(method, path, headers, body, index, perf_counter_ns(), names, raw)

    async def _play(self, steps: Iterable[Step], writer: asyncio.StreamWriter) -> bool:
        """Play one script; False when it closed the connection."""
        for step in steps:
            if isinstance(step, bytes):
                writer.write(step)
                await writer.drain()
            elif isinstance(step, float | int):
                await asyncio.sleep(step)
            elif step == CLOSE:
                writer.close()
                return False
            elif step == RESET:
                transport = writer.transport
                sock = transport.get_extra_info("socket")
                if sock is not None:  # linger 0: the close sends an RST, not a FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
                return False
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanFactory:
    """Makes plans for engine tests: one class, fixed sizes, given intended times."""

    class_name: str = "chat"
    prompt_tokens: int = 8
    output_tokens: int = 4
    deadlines: Deadlines = field(default_factory=Deadlines)

    def at(self, *times_s: float) -> list[RequestPlan]:
        """One plan per intended time (seconds since t0)."""
        return [
            RequestPlan(
                request_id=i,
                class_name=self.class_name,
                intended_ns=int(t * 1e9),
                prompt_tokens=self.prompt_tokens,
                output_tokens=self.output_tokens,
                deadlines=self.deadlines,
            )
            for i, t in enumerate(times_s)
        ]


def engine_config(
    api: str = "openai-chat",
    *,
    max_in_flight: int | None = None,
    headers_for: Callable[[RequestPlan], Mapping[str, str]] | None = None,
    priority_header: str | None = None,
    generic: GenericSpec | None = None,
) -> EngineConfig:
    """The engine configuration the test harness runs with (model "m", seed 0). Early stops
    are allowed: a scripted server streams the tokens its script holds, whatever length the
    body forces (the forced-length rule has its own tests, tests/adapters/test_stream_ends.py)."""
    return EngineConfig(
        adapter=adapter_for(api, generic),
        body_options=BodyOptions(model="m"),
        seed=0,
        allow_early_stops=True,
        max_in_flight=max_in_flight,
        headers_for=headers_for,
        priority_header=priority_header,
    )


def run_through(
    plans: Sequence[RequestPlan] | Work,
    connector: Connector,
    config: EngineConfig,
    *,
    stop_after_s: float | None = None,
    loop_options: Mapping[str, Any] | None = None,
    t0_ns: int | None = None,
    warm: int = 0,
) -> list[RequestRecord]:
    """Run plans through the engine harness on `connector` from `t0_ns` (absolute, on the
    connector's clock; default 20 ms after the loop is up, after warming `warm`
    connections), with `engine.stop()` plus a cancel after `stop_after_s`; records by
    request id."""
    records: list[RequestRecord] = []

    async def session(engine: Engine) -> None:
        async def stop_later() -> None:
            assert stop_after_s is not None
            await anyio.sleep(stop_after_s)
            engine.stop()
            engine.requests.cancel()

        companions = [stop_later] if stop_after_s is not None else []
        if warm:
            await engine.connector.warm(warm)
        start_ns = engine.clock.now_ns() + 20_000_000 if t0_ns is None else t0_ns
        await run_beside(engine, start_ns, *companions)

    harness.run_engine(plans, connector, config, records.append, session, quiet=False,
                       loop_options=loop_options)  # fmt: skip
    return sorted(records, key=lambda r: r.request_id)


def run_engine(
    plans: Sequence[RequestPlan] | Work,
    url: str,
    *,
    api: str = "openai-chat",
    max_in_flight: int | None = None,
    headers_for: Callable[[RequestPlan], Mapping[str, str]] | None = None,
    path: str | None = None,
    priority_header: str | None = None,
    stop_after_s: float | None = None,
    generic: GenericSpec | None = None,
    t0_ns: int | None = None,
) -> list[RequestRecord]:
    """Run plans through the real engine against `url` (loopback, real time) from `t0_ns`
    (absolute perf_counter_ns; default 20 ms after the loop is up); records sorted by
    request id."""
    config = engine_config(api, max_in_flight=max_in_flight, headers_for=headers_for,
                           priority_header=priority_header, generic=generic)  # fmt: skip
    adapter = config.adapter
    endpoint = make_endpoint(url, path or adapter.default_path, adapter.headers(None))
    return run_through(plans, Pool(endpoint), config, stop_after_s=stop_after_s, t0_ns=t0_ns)
