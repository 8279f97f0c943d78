"""One HTTP/1.1 connection and its response parsing: the per-chunk hot path.

`Connection` stamps every read as it arrives (`data_received`, or the kernel's receive
time handed in by `StampedSocket`) and parses later, once the loop's I/O callbacks have run
(`Pool._drain`): the status line and headers, then a chunked, Content-Length or
close-delimited body, handed to the exchange (`ExchangeSink.on_body`) without a task
switch. A compressed body asked for is inflated as it arrives (`Inflating`). Why a
connection ended mid-response is said in words here (`lost_reason`).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from loadgen.engine.tls import handshake_refusal
from loadgen.engine.transport.codings import INFLATE_SLICE, compression_note, window_bits
from loadgen.engine.transport.interfaces import ExchangeSink

if TYPE_CHECKING:
    from loadgen.engine.transport.endpoint import Endpoint
    from loadgen.engine.transport.pool import Pool

# Caps on what one response may make the client hold: its status line and headers, and
# one line of chunked framing (a size line, a trailer). Past one, the exchange ends as a
# broken stream naming the cap, and the connection is closed.
MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE = 4096
MAX_CHUNK_SIZE_DIGITS = 16  # hex digits: a size past 2**64 bytes is not a size
_HEX = re.compile(rb"[0-9A-Fa-f]+")  # a bare chunk size (int() would also accept spaces, _)
# The usual chunk sizes, as sent, to their values: one dict lookup both validates and parses
# a size line (the regex check plus int() cost ~0.3 µs per chunk, measured). Other spellings
# (leading zeros, mixed case, ≥ 4 KiB) take the regex path, with the same result.
_CHUNK_SIZES = {b"%x" % n: n for n in range(1, 4096)} | {b"%X" % n: n for n in range(1, 4096)}


HTTP2_ANSWER = (
    "the server answered in HTTP/2 (prior knowledge: a binary SETTINGS frame where an "
    "HTTP/1.1 status line belongs); loadgen speaks HTTP/1.1: point --url at the server's "
    "HTTP/1.1 listener (turn off its HTTP/2-only mode) or at a proxy that speaks HTTP/1.1"
)


def http2_frame(data: bytes) -> bool:
    """Does `data` open with an HTTP/2 SETTINGS or GOAWAY frame on stream 0 (what a server
    that speaks only HTTP/2 answers an HTTP/1.1 request with)?"""
    return len(data) >= 9 and data[3] in (0x04, 0x07) and data[5:9] == b"\x00\x00\x00\x00"


QUIET_CLOSE_S = 1.0  # a close after this much silence is said with its silence


def lost_reason(exc: Exception | None, silent_ns: int, got_bytes: bool, endpoint: Endpoint) -> str:
    """Why a connection ended mid-exchange, as seen: a TLS alert about this client's
    certificate, the error, or a close after `silent_ns` without a byte (since the last
    read, or since the request when nothing came), which is how a proxy's read timeout
    looks from the client."""
    if exc is not None:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, ssl.SSLError):
            return handshake_refusal(text, endpoint.tls) or text
        return text
    silent_s = silent_ns / 1e9
    if silent_s < QUIET_CLOSE_S:
        return "connection closed by server"
    since = "the last read" if got_bytes else "the request was sent"
    return (
        f"silence for {silent_s:.1f} s after {since}, then the connection closed (a proxy's "
        "read timeout closes a stream that goes quiet that long, e.g. nginx's "
        "proxy_read_timeout, 60 s by default: raise it above the server's longest silence)"
    )


# A status code as RFC 9110 (section 15) defines it: three digits, the first 1-5. Anything
# else (`3000000000`, `10^20`, `099`, `600`) is a protocol error, kept as text, never a number
# a record must hold.
_STATUS = re.compile(r"[1-5][0-9][0-9]")


def _digits(text: str) -> bool:
    """ASCII digits only (str.isdigit also accepts superscripts that int() rejects)."""
    return text.isascii() and text.isdigit()


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one exchange at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._now = pool.clock.now_ns  # bound once: data_received stamps every read with it
        self.transport: asyncio.Transport | None = None
        self.sink: ExchangeSink | None = None
        self._rx: list[tuple[bytes, int]] = []  # reads stamped but not yet parsed
        # No read can arrive before its request was written, nor before the previous read:
        # stamps are floored here, so an error in moving a kernel stamp between clocks can
        # never make a latency or a gap negative.
        self._floor_ns = 0
        self.closed = False
        self.reused = False
        self.warm = False
        self.exchanges = 0
        self._reset_response()

    def _reset_response(self) -> None:
        self._head = b""
        self._in_body = False
        self._chunked = False
        self._remaining = -1  # bytes left of the current chunk / Content-Length body
        self._chunk_state = 0  # 0: size line, 1: data, 2: CRLF after data, 3: trailers
        self._line = b""
        self._keep_alive = True
        self._got_bytes = False

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        # Stamp now, parse later: every socket readable in this loop iteration is stamped
        # before any of them is parsed (Pool._drain runs once the I/O callbacks are done),
        # so a burst of chunks on many streams is not stamped late by its own parsing.
        self.received(data, self._now())

    def received(self, data: bytes, t_ns: int) -> None:
        """Bytes that arrived at `t_ns` (the kernel's receive time, where it is known)."""
        if t_ns < self._floor_ns:
            t_ns = self._floor_ns
        self._floor_ns = t_ns
        self._rx.append((data, t_ns))
        self._got_bytes = True
        if len(self._rx) == 1:
            self.pool.schedule(self)

    def process(self) -> None:
        """Parse the reads stamped since the last call."""
        rx, self._rx = self._rx, []
        for data, t_ns in rx:
            self._parse(data, t_ns)

    def _parse(self, data: bytes, t_ns: int) -> None:
        sink = self.sink
        if sink is None:
            self._abort()  # bytes nobody asked for: the connection is not reusable
            return
        if not self._in_body:
            data = self._read_head(data, sink, t_ns)
            if not self._in_body or self.sink is None:
                return
            sink = self.sink  # the exchange's, or the one inflating a compressed body for it
        if self._chunked:
            self._read_chunked(data, sink, t_ns)
        elif self._remaining >= 0:
            take = data[: self._remaining]
            self._remaining -= len(take)
            if take:
                sink.on_body(take, t_ns)
            if self._remaining == 0:
                self._finish(t_ns)
        elif data:
            sink.on_body(data, t_ns)  # close-delimited body

    def connection_lost(self, exc: Exception | None) -> None:
        if self._rx:
            self.process()  # what was read before the close belongs to the response
        self.closed = True
        self.pool.forget(self)
        sink, self.sink = self.sink, None
        if sink is None:
            return
        t_ns = self._now()
        if self._in_body and not self._chunked and self._remaining < 0 and exc is None:
            sink.on_end(t_ns)  # a close-delimited body ends with the connection's clean close
        else:
            reason = lost_reason(exc, t_ns - self._floor_ns, self._got_bytes, self.pool.endpoint)
            sink.on_lost(reason, self._got_bytes, t_ns)

    # -- framing --------------------------------------------------------------------------
    def _read_head(self, data: bytes, sink: ExchangeSink, t_ns: int) -> bytes:
        """Parse the status line and headers; return the body bytes that followed them.

        Interim (1xx) responses are skipped in a loop: a server may send any number.
        """
        self._head += data
        if self._head[:1] == b"\x00" and http2_frame(self._head):
            self._fail(sink, HTTP2_ANSWER, t_ns)
            return b""
        while True:
            end = self._head.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
            if end < 0:
                if len(self._head) > MAX_HEAD_BYTES:  # the same limit however bytes are split
                    cap = f"{MAX_HEAD_BYTES // 1024} KiB"
                    self._fail(sink, f"response headers over the {cap} cap (or not HTTP)", t_ns)
                return b""
            head, self._head = self._head[:end], self._head[end + 4 :]
            lines = head.decode("latin-1").split("\r\n")
            status_line = lines[0].split(" ", 2)
            if len(status_line) < 2 or not status_line[0].startswith("HTTP/"):
                # The whole line (under the cap): the exchange redacts, then cuts it.
                self._fail(sink, f"not an HTTP response: {lines[0]!r}", t_ns)
                return b""
            if not _STATUS.fullmatch(status_line[1]):  # 3 digits, 100-599 (RFC 9110 15)
                self._fail(sink, f"a status code outside 100-599: {lines[0]!r}", t_ns)
                return b""
            status = int(status_line[1])
            if not 100 <= status < 200:
                break
        rest, self._head = self._head, b""
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding in self.pool.codings:  # asked for: inflated as it arrives
            self.sink = sink = Inflating(sink, encoding, self)
        elif status < 300 and encoding not in ("", "identity"):  # a stream, not an error body
            note = compression_note(self.pool.endpoint)
            self._fail(sink, f"a compressed stream (Content-Encoding: {encoding:.40}) {note}", t_ns)
            return b""
        self._in_body = True
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if not self._chunked and length is not None and _digits(length):
            self._remaining = int(length)
        connection = headers.get("connection", "").lower()
        self._keep_alive = status_line[0] != "HTTP/1.0" and "close" not in connection
        if not self._chunked and self._remaining < 0:
            self._keep_alive = False
        sink.on_head(status, headers, t_ns)
        if self._remaining == 0:
            self._finish(t_ns)
            return b""
        return rest

    def _read_chunked(self, data: bytes, sink: ExchangeSink, t_ns: int) -> None:
        if self._chunk_state == 0 and not self._line:
            # Fast path: the read is exactly one whole chunk, `SIZE\r\n<data>\r\n`.
            head_end = data.find(b"\r\n", 0, 18)
            length = _CHUNK_SIZES.get(data[:head_end], 0) if head_end > 0 else 0
            if not length and head_end > 0 and _HEX.fullmatch(data[:head_end]):
                length = int(data[:head_end], 16)
            if length:
                end = head_end + 2 + length
                if len(data) == end + 2 and data.endswith(b"\r\n"):
                    sink.on_body(data[head_end + 2 : end], t_ns)
                    return
        pos, size = 0, len(data)
        while pos < size and self.sink is not None:
            state = self._chunk_state
            if state == 1:  # chunk data
                take = data[pos : pos + self._remaining]
                pos += len(take)
                self._remaining -= len(take)
                sink.on_body(take, t_ns)
                if self._remaining == 0:
                    self._chunk_state = 2
                continue
            newline = data.find(b"\n", pos)
            if newline < 0:
                self._line += data[pos:]
                if len(self._line) > MAX_CHUNK_LINE:
                    reason = f"malformed chunked encoding (a line over {MAX_CHUNK_LINE} bytes)"
                    self._fail(sink, reason, t_ns)
                return
            line = (self._line + data[pos:newline]).rstrip(b"\r")
            self._line = b""
            pos = newline + 1
            if state == 0:  # chunk size line (optional ;extensions)
                size_text = line.split(b";", 1)[0].strip()
                if not _HEX.fullmatch(size_text) or len(size_text) > MAX_CHUNK_SIZE_DIGITS:
                    self._fail(sink, f"malformed chunk size {line!r}", t_ns)
                    return
                self._remaining = int(size_text, 16)
                self._chunk_state = 1 if self._remaining > 0 else 3
            elif state == 2:  # CRLF after the data
                if line:
                    self._fail(sink, "malformed chunked encoding", t_ns)
                    return
                self._chunk_state = 0
            elif not line:  # state 3: trailers end with an empty line
                self._finish(t_ns)
                return

    def _finish(self, t_ns: int) -> None:
        """The response is complete: report it, and keep the connection if allowed."""
        sink, self.sink = self.sink, None
        keep = self._keep_alive
        self._reset_response()
        if keep and not self.closed:
            self.pool.release(self)
        else:
            self._abort()
        if sink is not None:
            sink.on_end(t_ns)

    def _fail(self, sink: ExchangeSink, reason: str, t_ns: int) -> None:
        self.sink = None
        self._abort()
        sink.on_lost(reason, True, t_ns)

    def fail(self, reason: str) -> None:
        """End the current exchange as a broken stream and drop the connection."""
        sink, self.sink = self.sink, None
        self._rx = []
        self._abort()
        if sink is not None:
            sink.on_lost(reason, True, self._now())

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    # -- used by the exchange -----------------------------------------------------------
    def send(self, sink: ExchangeSink, request: bytes) -> None:
        """Write one request; responses go to `sink` until it ends or is detached."""
        assert self.transport is not None
        self.sink = sink
        self.exchanges += 1
        self._reset_response()
        self._floor_ns = self._now()
        self.transport.write(request)

    def is_usable(self) -> bool:
        """Open, idle, and not closed by the server (warm connections are checked with it)."""
        if self.closed or self.transport is None or self.sink is not None or self._rx:
            return False
        alive = getattr(self.transport, "is_alive", None)  # StampedSocket: a MSG_PEEK
        if alive is not None:
            return bool(alive())
        return not self.transport.is_closing()

    def detach(self) -> None:
        """The exchange gave up (deadline, cancel): the connection cannot be reused."""
        self.sink = None
        self._abort()


class Inflating:
    """The sink of a compressed response (a Content-Encoding asked for with Accept-Encoding):
    each read is inflated as it arrives and handed on with that read's stamp, the arrival of
    the compressed bytes, which is when a client that accepts compression has them too.
    Bytes held back by the compressor (a proxy that flushes a deflate block only when it is
    full) arrive late, as they do for such clients. Handed on `INFLATE_SLICE` at a time: a
    body that inflates to gigabytes ends at the exchange's caps, never in memory at once.
    """

    __slots__ = ("_conn", "_encoding", "_inflater", "_pending", "_sink")

    def __init__(self, sink: ExchangeSink, encoding: str, conn: Connection) -> None:
        self._sink, self._encoding, self._conn = sink, encoding, conn
        self._inflater: Any = None  # a zlib decompressor, once the first bytes tell which
        self._pending = b""  # a body's first byte, until its second comes

    def on_head(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        self._sink.on_head(status, headers, t_ns)

    def on_body(self, data: bytes, t_ns: int) -> None:
        if self._inflater is None:
            data = self._pending + data
            if len(data) < 2:  # a deflate body's first two bytes say which kind it is
                self._pending = data
                return
            self._inflater = zlib.decompressobj(window_bits(self._encoding, data))
        try:
            out = self._inflater.decompress(data, INFLATE_SLICE)
            while True:
                if out:
                    self._sink.on_body(out, t_ns)
                tail = self._inflater.unconsumed_tail
                if not tail or self._conn.sink is not self:  # done, or the exchange ended
                    return
                out = self._inflater.decompress(tail, INFLATE_SLICE)
        except zlib.error as exc:
            reason = f"a {self._encoding} body that does not inflate ({exc})"
            self._conn._fail(self._sink, reason, t_ns)  # the connection cannot be read on

    def on_end(self, t_ns: int) -> None:
        if self._inflater is not None:
            try:
                rest = self._inflater.flush()
            except zlib.error:  # a corrupt tail: what inflated before it was handed on
                rest = b""
            if rest:
                self._sink.on_body(rest, t_ns)
        self._sink.on_end(t_ns)

    def on_lost(self, reason: str, got_response_bytes: bool, t_ns: int) -> None:
        self._sink.on_lost(reason, got_response_bytes, t_ns)
