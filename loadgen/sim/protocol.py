"""A minimal HTTP/1.1 server connection for the simulator (no framework: it must be fast).

Supports keep-alive, `Content-Length` request bodies, pipelined requests (answered one
at a time, in order), fixed-length responses and chunked streaming responses. Chunked
request bodies are refused with 411. One `Connection` serves one TCP connection; the
handler answers each `HttpRequest` by calling `send_simple` or `start_stream` …
`end_stream`, and must call exactly one of `send_simple`, `end_stream` or `close`.

Every request carries `received_ns`, when the read that brought its last byte returned:
the server's door, before any of its own work. With an `Inbox`, connections are only read
and stamped in their I/O callbacks and their requests handled `READ_SLICE` per loop
iteration after them: a burst of 512 requests that arrive together is stamped within the
~2 ms it takes to read them, not over the ~20 ms it takes to handle them one after
another (a request handled last would otherwise carry the server's own queue in the
client's share of the latency, not in the server's TTFT).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import cast

from loadgen import __version__

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
READ_SLICE = 32  # requests handled per loop iteration (~1 ms) before the sockets are read again
READ_STAMPS = 64  # reads' stamps kept per connection; a client trickling bytes keeps the latest
_SERVER = f"loadgen-sim/{__version__}".encode()
perf_counter_ns = time.perf_counter_ns


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One parsed request; header names are lower-case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool
    received_ns: int = 0  # when the read that brought its last byte returned (perf_counter)


class ExchangeLike:
    """What a connection notifies when its client goes away mid-response."""

    def on_connection_lost(self) -> None:
        """The peer closed or reset the connection before the response ended."""


Handler = Callable[["Connection", HttpRequest], None]


class Inbox:
    """Connections with a request read, handled `READ_SLICE` per loop iteration, in order.

    One per server. Reading and stamping stay in each connection's I/O callback; the
    handling (parse, plan, queue, response head) runs here, after the iteration's reads.
    """

    def __init__(self) -> None:
        self._ready: deque[Connection] = deque()
        self._scheduled = False

    def put(self, conn: Connection) -> None:
        """Handle `conn`'s next buffered request in this iteration's slice or a later one."""
        self._ready.append(conn)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._slice)

    def _slice(self) -> None:
        ready = self._ready
        for _ in range(min(READ_SLICE, len(ready))):
            ready.popleft().dispatch()
        if ready:
            asyncio.get_running_loop().call_soon(self._slice)
        else:
            self._scheduled = False


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"


def _head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [b"HTTP/1.1 %d %b\r\nserver: %b\r\n" % (status, _reason(status), _SERVER)]
    lines.extend(b"%b: %b\r\n" % (k.encode(), v.encode()) for k, v in headers)
    lines.append(b"\r\n")
    return b"".join(lines)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """(method, path, version, headers) of a request head; ValueError if malformed."""
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    method, target, version = request_line.split(" ")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    return method, target.split("?", 1)[0], version, headers


class Connection(asyncio.Protocol):
    """One client connection: parse requests, hand them to `handler`, write responses."""

    def __init__(
        self, handler: Handler, registry: set[Connection], inbox: Inbox | None = None
    ) -> None:
        self._handler = handler
        self._registry = registry
        self._inbox = inbox  # None: each request is handled in the read that completes it
        self._queued = False  # in the inbox, not yet dispatched
        self._buffer = bytearray()
        # (bytes read in all, when) per read not yet fully consumed: a request's stamp is
        # that of the read that brought its last byte (pipelined requests each get theirs).
        self._reads: deque[tuple[int, int]] = deque()
        self._read_total = 0
        self._consumed_total = 0
        self._busy = False
        self._keep_alive = True
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self.exchange: ExchangeLike | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._registry.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._registry.discard(self)
        exchange, self.exchange = self.exchange, None
        if exchange is not None:
            exchange.on_connection_lost()

    def data_received(self, data: bytes) -> None:
        self._read_total += len(data)
        reads = self._reads
        if len(reads) >= READ_STAMPS:  # bounded: a request ending in a dropped read gets
            reads.popleft()  # the next kept read's (later) stamp
        reads.append((self._read_total, perf_counter_ns()))
        self._buffer += data
        if not self._busy:
            self._request_next()

    def _request_next(self) -> None:
        """Handle the next buffered request now, or in the inbox's next slice."""
        inbox = self._inbox
        if inbox is None:
            self._next_request()
        elif not self._queued:
            self._queued = True
            inbox.put(self)

    def dispatch(self) -> None:
        """The inbox's turn: handle the next complete buffered request, if still idle."""
        self._queued = False
        if not self._busy and not self.closed:
            self._next_request()

    def _stamp(self, end_total: int) -> int:
        """When the read that brought byte `end_total` (counted from the first) returned."""
        reads = self._reads
        while len(reads) > 1 and reads[0][0] < end_total:
            reads.popleft()
        total, stamp = reads[0]
        if total <= end_total:
            reads.popleft()
        return stamp

    def _next_request(self) -> None:
        """Dispatch the next complete buffered request, if any."""
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                self._refuse(431, "request head too large")
            return
        try:
            method, path, version, headers = _parse_head(bytes(buffer[:end]))
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self._refuse(400, "malformed request")
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._refuse(411, "chunked request bodies are not supported; send Content-Length")
            return
        if length < 0 or length > MAX_BODY_BYTES:
            self._refuse(413, "request body too large")
            return
        if len(buffer) < end + 4 + length:
            return
        body = bytes(buffer[end + 4 : end + 4 + length])
        del buffer[: end + 4 + length]
        self._consumed_total += end + 4 + length
        received_ns = self._stamp(self._consumed_total)
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        self._busy = True
        self._handler(self, HttpRequest(method, path, headers, body, keep_alive, received_ns))

    def _refuse(self, status: int, message: str) -> None:
        body = b'{"error":{"message":"%b","type":"invalid_request_error","code":%d}}' % (
            message.encode(),
            status,
        )
        self._busy = True
        self.send_simple(status, body, keep_alive=False)

    def write(self, data: bytes) -> None:
        """Write raw bytes (no-op once the connection is closed)."""
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def send_simple(
        self,
        status: int,
        body: bytes,
        *,
        keep_alive: bool = True,
        content_type: str = "application/json",
        extra_headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        """A complete fixed-length response; ends the exchange."""
        headers = [
            ("content-type", content_type),
            ("content-length", str(len(body))),
            ("connection", "keep-alive" if keep_alive else "close"),
            *extra_headers,
        ]
        self.write(_head(status, headers) + body)
        self._done(keep_alive)

    def start_stream(self, *, keep_alive: bool, content_type: str = "text/event-stream") -> None:
        """Headers of a streamed response (SSE by default) with chunked transfer-encoding."""
        self._keep_alive = keep_alive
        headers = [
            ("content-type", content_type),
            ("cache-control", "no-cache"),
            ("transfer-encoding", "chunked"),
            ("connection", "keep-alive" if keep_alive else "close"),
        ]
        self.write(_head(200, headers))

    def end_stream(self, last: bytes = b"") -> None:
        """Write `last` plus the terminating zero-length chunk; ends the exchange."""
        self.write(last + b"0\r\n\r\n")
        self._done(self._keep_alive)

    def close(self) -> None:
        """Close now (FIN after buffered bytes), leaving any response unterminated."""
        self.exchange = None
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    def _done(self, keep_alive: bool) -> None:
        self.exchange = None
        if not keep_alive or self.closed:
            self.close()
            return
        self._busy = False
        if self._buffer:
            self._request_next()
