"""The streaming HTTP/1.1 client of the engine: lean asyncio protocols and a connection pool.

Why not httpx for the stream: measured on a 2-core machine with 20 ms token gaps, one
`httpx.AsyncClient` collapses at 256 concurrent streams (its pool does work proportional
to the number of connections on every event: ~400 chunks/s, timestamp error p99 ≈ 0.5 s),
and many small clients cost ~65 µs of CPU per chunk. This module costs a fraction of that:
the arrival time of every read is stamped in `data_received`, before anything is parsed,
and the body is handed to the exchange without a task switch. httpx stays the client for
the preflight and anything that is not the hot path.

The exchange (the caller) sees four callbacks: `on_head`, `on_body`, `on_end` and
`on_lost`; this module only frames HTTP (status line, headers, chunked, Content-Length or
close-delimited bodies) and keeps idle keep-alive connections for reuse.

Connection set-up is the endpoint's: https with the run's one TLS context (`engine.tls`),
and, behind a forward proxy (`engine.proxy`), a CONNECT tunnel with TLS inside it for
https, or the proxy's own socket (kernel-stamped like a direct one) and absolute-form
requests for http. Why a connection could not be opened, or ended mid-response, is said
here in words (`connect_failure`, `lost_reason`): which certificate check failed, what the
proxy answered, how long the silence was before a close.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import os
import re
import socket
import ssl
import sys
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast
from urllib.parse import SplitResult, urlsplit

from loadgen.engine.clock import SYSTEM_CLOCK, Clock, ReadClock
from loadgen.engine.proxy import (
    Proxy,
    ProxyRefused,
    connect_reply,
    connect_request,
    open_tunnel,
)
from loadgen.engine.tls import (
    TlsSettings,
    client_context,
    handshake_refusal,
    verify_failure,
)
from loadgen.workload.spec import redact_url

# Caps on what one response may make the client hold: its status line and headers, and
# one line of chunked framing (a size line, a trailer). Past one, the exchange ends as a
# broken stream naming the cap, and the connection is closed.
MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE = 4096
MAX_CHUNK_SIZE_DIGITS = 16  # hex digits: a size past 2**64 bytes is not a size
WARM_PARALLEL = 64  # connects in flight at once while warming (a listen backlog is ~128+)
WARM_GRACE_S = 0.01  # after warming: time for a server's immediate close to arrive
WARM_TIMEOUT_S = 10.0  # warming gives up on connects not done by then (SYNs dropped)
DRAIN_SLICE = 32  # connections parsed per loop iteration (~0.3 ms) before polling again
AFTER_EVERY_SLICES = 8  # `after_reads` callbacks wait at most this many slices
# `after_reads` callbacks run per loop iteration: each wakes a task that builds a record and
# makes a request (~60 µs); 512 at once held the loop ~30 ms without reading a socket, the
# reads queued meanwhile merged, and a merged read carries its last segment's stamp.
AFTER_SLICE = 32


class ExchangeSink(Protocol):
    """What the connection reports to the request using it. `t_ns` is on the pool's clock."""

    def on_head(self, status: int, headers: Mapping[str, str], t_ns: int) -> None: ...
    def on_body(self, data: bytes, t_ns: int) -> None: ...
    def on_end(self, t_ns: int) -> None: ...
    def on_lost(self, reason: str, got_response_bytes: bool, t_ns: int) -> None: ...


class Link(Protocol):
    """One connection as the engine sees it: it carries one exchange at a time."""

    reused: bool  # it came from the idle list (kept alive, or warmed before t0)
    warm: bool  # opened before t0 by `Connector.warm`, outside every latency
    exchanges: int  # exchanges written on it so far (the current one included)

    def send(self, sink: ExchangeSink, request: bytes) -> None: ...
    def detach(self) -> None: ...


class Connector(Protocol):
    """What the engine sends through: connections to one endpoint, stamped on one clock.

    `Pool` is the real one; tests pass one that plays scripted responses in virtual time
    (`loadgen.testing.virtual`).
    """

    endpoint: Endpoint
    clock: Clock  # every stamp a connection reports is on this clock
    last_read_ns: int  # when bytes last arrived on any connection (the watchdog reads it)

    def take_idle(self) -> Link | None: ...
    async def connect(self) -> Link: ...
    async def warm(self, count: int) -> WarmReport: ...
    def after_reads(self, callback: Callable[[], None]) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmReport:
    """What `warm` did before t0: connections asked for, opened and verified, failed."""

    requested: int
    opened: int  # connected and still open after the grace: idle, ready for the first sends
    failed: int  # the connect failed, or the server closed it straight away
    error: str | None = None  # the first failure, for the message
    seconds: float = 0.0  # how long warming took (before t0: in no latency)


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """Where requests go: scheme, host, port, the request target path and fixed headers;
    the TLS settings of an https endpoint and the forward proxy on the way, if any."""

    scheme: str
    host: str
    port: int
    target: str  # path + query, as sent on the request line
    headers: Mapping[str, str] = field(default_factory=dict)
    tls: TlsSettings = field(default_factory=TlsSettings)
    proxy: Proxy | None = None  # None: connections go straight to host:port

    @property
    def origin(self) -> str:
        """scheme://host:port (no credentials, no path), for messages and run.json."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def tunnelled(self) -> bool:
        """https through a proxy: a CONNECT tunnel, TLS inside it."""
        return self.proxy is not None and self.scheme == "https"

    @property
    def request_target(self) -> str:
        """The request line's target: the path, or the absolute URL for an http proxy."""
        if self.proxy is None or self.scheme == "https":
            return self.target
        return f"http://{host_header(self)}{self.target}"


def split_url(url: str) -> SplitResult:
    """Parse a base URL; raise ValueError with a fixable message when it is not http(s)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"URL must look like http://host:port (got {redact_url(url)!r})")
    return parts


def make_endpoint(
    url: str, path: str, headers: Mapping[str, str], *, tls: TlsSettings | None = None,
    proxy: Proxy | None = None,
) -> Endpoint:  # fmt: skip
    """An endpoint from a base URL and the request path; URL user-info becomes Basic auth."""
    parts = split_url(url)
    base = parts.path.rstrip("/")
    if base and path.startswith(base + "/"):
        full = path  # the URL already holds the path's prefix, e.g. .../v1
    elif base.endswith(path):
        full = base  # the URL is the full endpoint
    elif base.endswith("/v1") and path.startswith("/v1/"):
        full = base + path[3:]
    else:
        full = base + path
    target = full + (f"?{parts.query}" if parts.query else "")
    all_headers = dict(headers)
    if parts.username is not None:
        creds = f"{parts.username}:{parts.password or ''}".encode()
        all_headers.setdefault("Authorization", "Basic " + base64.b64encode(creds).decode())
    scheme = parts.scheme
    port = parts.port or (443 if scheme == "https" else 80)
    return Endpoint(
        scheme=scheme, host=parts.hostname or "", port=port, target=target, headers=all_headers,
        tls=tls or TlsSettings(), proxy=proxy,
    )  # fmt: skip


def host_header(endpoint: Endpoint) -> str:
    """The Host header's value: host, and the port unless it is the scheme's default."""
    default_port = 443 if endpoint.scheme == "https" else 80
    host = endpoint.host if ":" not in endpoint.host else f"[{endpoint.host}]"
    return host if endpoint.port == default_port else f"{host}:{endpoint.port}"


def request_headers(
    endpoint: Endpoint, body_bytes: int, extra: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The headers of every POST loadgen sends, in order: the engine's requests and the
    preflight's are the same bytes (Accept-Encoding only when the endpoint's headers carry
    it: `target.accept_encoding`, `--accept-encoding`). A proxy's own header
    (`Proxy-Authorization`) is the connection's: `encode_request` adds it."""
    headers = [
        ("Host", host_header(endpoint)),
        ("Content-Type", "application/json"),
        ("Accept", "text/event-stream"),
        ("Content-Length", str(body_bytes)),
        ("User-Agent", "loadgen"),
    ]
    headers.extend(endpoint.headers.items())
    headers.extend(extra.items())
    return headers


def encode_request(endpoint: Endpoint, body: bytes, extra: Mapping[str, str]) -> bytes:
    """A POST request with a JSON body, as bytes (in absolute form, with the proxy's
    credentials, when it goes to an http proxy)."""
    lines = [f"POST {endpoint.request_target} HTTP/1.1"]
    lines.extend(f"{k}: {v}" for k, v in request_headers(endpoint, len(body), extra))
    lines.extend(_proxy_headers(endpoint))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _proxy_headers(endpoint: Endpoint) -> list[str]:
    """`Proxy-Authorization` for a request sent to an http proxy (a tunnel's is in its
    CONNECT, never inside TLS)."""
    proxy = endpoint.proxy
    if proxy is None or endpoint.scheme == "https" or proxy.authorization is None:
        return []
    return [f"Proxy-Authorization: {proxy.authorization}"]


HTTP2_ANSWER = (
    "the server answered in HTTP/2 (prior knowledge: a binary SETTINGS frame where an "
    "HTTP/1.1 status line belongs); loadgen speaks HTTP/1.1: point --url at the server's "
    "HTTP/1.1 listener (turn off its HTTP/2-only mode) or at a proxy that speaks HTTP/1.1"
)


def http2_frame(data: bytes) -> bool:
    """Does `data` open with an HTTP/2 SETTINGS or GOAWAY frame on stream 0 (what a server
    that speaks only HTTP/2 answers an HTTP/1.1 request with)?"""
    return len(data) >= 9 and data[3] in (0x04, 0x07) and data[5:9] == b"\x00\x00\x00\x00"


# The content codings loadgen inflates as they arrive, each with its zlib window bits (a
# `deflate` body is zlib-wrapped, as RFC 9110 says, or raw, as some servers send it: told
# apart by its first two bytes).
INFLATED = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
INFLATE_SLICE = 256 * 1024  # inflated bytes handed on at a time (a small body may inflate to GBs)


def accepted_codings(headers: Mapping[str, str]) -> frozenset[str]:
    """The codings of INFLATED an Accept-Encoding header among `headers` asks for (`q=0`
    refuses one)."""
    value = next((v for k, v in headers.items() if k.lower() == "accept-encoding"), "")
    asked = set()
    for item in value.lower().split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        weights = [p.partition("=")[2].strip() for p in params if p.startswith("q")]
        if coding and not (weights and _is_zero(weights[0])):
            asked.add(coding)
    if "gzip" in asked:
        asked.add("x-gzip")
    return frozenset(asked & INFLATED.keys())


def _is_zero(weight: str) -> bool:
    """A `q` weight of 0 (`0`, `0.0`, `0.000`): the coding is refused."""
    try:
        return float(weight) == 0.0
    except ValueError:
        return False


def compression_note(endpoint: Endpoint) -> str:
    """Why a compressed stream is refused, and what to change: loadgen inflates gzip and
    deflate when asked for them (`--accept-encoding`), and reads every other stream as sent."""
    asked = any(k.lower() == "accept-encoding" for k in endpoint.headers)
    if asked:
        return ("that loadgen cannot read as it arrives (it inflates gzip and deflate): ask "
                "for those only (--accept-encoding gzip,deflate), or remove the Accept-Encoding "
                "header")  # fmt: skip
    return ("although the request asked for none (no Accept-Encoding): turn compression off "
            "for this route (e.g. a proxy's gzip for text/event-stream), or read it as clients "
            "that accept gzip do: --accept-encoding")  # fmt: skip


def probe_request(endpoint: Endpoint) -> bytes:
    """What the diagnostic probe sends: an empty JSON POST to the endpoint's path, without
    its query, with loadgen's own headers only. None of the user's headers, the URL's query
    or the workload's body: whatever may carry a credential stays off the probe, whatever
    answers it."""
    path = endpoint.target.split("?", 1)[0]
    bare = Endpoint(scheme=endpoint.scheme, host=endpoint.host, port=endpoint.port, target=path,
                    proxy=endpoint.proxy)  # fmt: skip
    lines = [f"POST {bare.request_target} HTTP/1.1"]
    lines.extend(f"{k}: {v}" for k, v in request_headers(bare, 2, {}))
    lines.extend(_proxy_headers(endpoint))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + b"{}"


def probe_first_bytes(endpoint: Endpoint, *, timeout_s: float) -> bytes:
    """The first bytes the server answers `probe_request` with on a new connection (b""
    when it sends none in time, or the connection fails): what an unparseable answer was.

    The connection is made as every other one (through the proxy, TLS verified with the
    run's settings): a certificate that fails verification ends the probe before anything
    is sent. Not for a running event loop (the preflight calls it between its own).
    """
    try:
        return asyncio.run(asyncio.wait_for(_probe(endpoint), timeout_s))
    except (OSError, ValueError, EOFError, asyncio.LimitOverrunError):
        return b""


async def _probe(endpoint: Endpoint) -> bytes:
    proxy = endpoint.proxy
    host, port = (proxy.host, proxy.port) if proxy is not None else (endpoint.host, endpoint.port)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if endpoint.tunnelled:
            assert proxy is not None
            writer.write(connect_request(proxy, endpoint.host, endpoint.port))
            head = await reader.readuntil(b"\r\n\r\n")
            connect_reply(head[:-4], proxy, endpoint.host, endpoint.port)
        if endpoint.scheme == "https":
            await writer.start_tls(client_context(endpoint.tls), server_hostname=endpoint.host)
        writer.write(probe_request(endpoint))
        return await reader.read(64)
    finally:
        writer.close()


SO_TIMESTAMPNS = 35  # Linux: SCM_TIMESTAMPNS ancillary data (struct timespec, CLOCK_REALTIME)
# LOADGEN_KERNEL_STAMPS=0 turns them off (user-space stamps on the uvloop transport: ~4 µs
# less client CPU per chunk, measured, and timestamps late by however busy the client is).
KERNEL_STAMPS_AVAILABLE = sys.platform == "linux" and os.environ.get("LOADGEN_KERNEL_STAMPS") != "0"
READ_SIZE = 256 * 1024
_HEX = re.compile(rb"[0-9A-Fa-f]+")  # a bare chunk size (int() would also accept spaces, _)
# The usual chunk sizes, as sent, to their values: one dict lookup both validates and parses
# a size line (the regex check plus int() cost ~0.3 µs per chunk, measured). Other spellings
# (leading zeros, mixed case, ≥ 4 KiB) take the regex path, with the same result.
_CHUNK_SIZES = {b"%x" % n: n for n in range(1, 4096)} | {b"%X" % n: n for n in range(1, 4096)}


def connect_failure(exc: OSError, endpoint: Endpoint) -> str:
    """Why a connection to `endpoint` could not be opened, in words: a certificate that
    failed verification (which one, and the fix), a proxy's refusal, a refused client
    certificate, or the system's error text. No secret is in any of them."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        where = f"{endpoint.host}:{endpoint.port}"
        return verify_failure(exc, where, endpoint.tls, host=endpoint.host)
    text = exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, ssl.SSLError):
        return handshake_refusal(text, endpoint.tls) or text
    if endpoint.proxy is not None and not isinstance(exc, ProxyRefused):
        return f"{text} (through the proxy {endpoint.proxy.shown})"
    return text


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


def _report(loop: asyncio.AbstractEventLoop, exc: Exception) -> None:
    """Hand a parsing bug to the loop's exception handler (it is logged, not swallowed)."""
    loop.call_exception_handler({"message": "loadgen: parsing a response failed", "exception": exc})


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
            self._inflater = zlib.decompressobj(_window_bits(self._encoding, data))
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


def _window_bits(encoding: str, first: bytes) -> int:
    """zlib's window bits for a body of `encoding` that starts with `first`: a deflate
    body without the zlib header (CMF/FLG: method 8, a multiple of 31) is raw deflate."""
    if encoding != "deflate":
        return INFLATED[encoding]
    zlib_header = (first[0] & 0x0F) == 8 and (first[0] << 8 | first[1]) % 31 == 0
    return INFLATED[encoding] if zlib_header else -zlib.MAX_WBITS


def _literal_address(host: str, port: int) -> tuple[int, Any] | None:
    """(family, sockaddr) of an IP-literal host, without a lookup (None for a name)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        return family, ((host, port) if family == socket.AF_INET else (host, port, 0, 0))
    return None


_timestamping_keeper: list[socket.socket] = []  # at most one, open for the process's life


def keep_kernel_timestamping_on() -> None:
    """Hold one socket with SO_TIMESTAMPNS open for the rest of the process.

    Linux stamps received packets only while some socket asks for it, and turns that on
    asynchronously (a deferred work item) when the first one does: segments received just
    after are not stamped and their reads fall back to the time of the read. One socket
    that keeps it on from the pool's creation (a run's t0 is 200 ms later) means every
    request of the run gets kernel stamps, even when its connections come and go.
    """
    if _timestamping_keeper:
        return
    try:
        keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError:
        return  # reads are stamped when they are read, as without kernel stamps
    try:
        keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        keeper.close()
        return
    _timestamping_keeper.append(keeper)
    atexit.register(keeper.close)


class StampedSocket:
    """The transport of a plain-HTTP connection that reads with the kernel's receive time.

    A read stamped in user space is late by however long the process was busy or not
    scheduled when the bytes arrived: on a loaded machine, several ms. With SO_TIMESTAMPNS
    the kernel stamps each segment as it is received, and `recvmsg` hands back the time of
    the last segment it read; a read that finds several chunks queued stamps them all with
    the last one's time (still no later than a user-space stamp). The kernel clock is
    CLOCK_REALTIME; `ReadClock` moves it onto the monotonic clock, never after the read itself.

    Only the four calls `Connection` makes of a transport: write, abort, and the
    `connection_lost` it reports back.
    """

    __slots__ = ("_buffer", "_clock", "_closed", "_conn", "_fd", "_loop", "_pending", "_sock")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, conn: Connection
    ) -> None:
        self._loop = loop
        self._buffer = conn.pool.read_buffer
        self._clock = conn.pool.read_clock
        self._sock = sock
        self._fd = sock.fileno()
        self._conn = conn
        self._pending = b""
        self._closed = False

    @classmethod
    def attach(
        cls, loop: asyncio.AbstractEventLoop, sock: socket.socket, conn: Connection
    ) -> StampedSocket:
        """Make `sock` the transport of `conn` and start reading."""
        transport = cls(loop, sock, conn)
        conn.connection_made(cast(asyncio.BaseTransport, transport))
        loop.add_reader(transport._fd, transport._readable)
        return transport

    def _readable(self) -> None:
        try:
            # Into the pool's one buffer: recvmsg(READ_SIZE) would allocate (and, at this
            # size, mmap and unmap) a fresh READ_SIZE bytes object per read.
            size, ancillary, _, _ = self._sock.recvmsg_into(self._buffer, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(exc)
            return
        if not size:
            self._close(None)
            return
        self._conn.received(self._buffer[0][:size].tobytes(), self._clock.stamp(ancillary))

    def write(self, data: bytes) -> None:
        """Send `data`; what the socket does not take now is sent when it is writable."""
        if self._closed:
            return
        if self._pending:
            self._pending += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._close(exc)
            return
        if sent < len(data):
            self._pending = data[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(exc)
            return
        self._pending = self._pending[sent:]
        if not self._pending:
            self._loop.remove_writer(self._fd)

    def abort(self) -> None:
        """Close at once; the connection hears of it on the next loop iteration."""
        if not self._closed:
            self._shut()
            self._loop.call_soon(self._conn.connection_lost, None)

    def is_alive(self) -> bool:
        """Open, with nothing to read: a peek that would block (EOF or bytes: not usable)."""
        if self._closed:
            return False
        try:
            self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False  # b"": the server closed it; bytes: it spoke before being asked

    def _close(self, exc: Exception | None) -> None:
        if not self._closed:
            self._shut()
            self._conn.connection_lost(exc)

    def _shut(self) -> None:
        self._closed = True
        self._loop.remove_reader(self._fd)
        if self._pending:
            self._loop.remove_writer(self._fd)
            self._pending = b""
        self._sock.close()


class Pool:
    """Idle keep-alive connections to one endpoint; new ones are opened on demand (the
    engine's `Connector`)."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        ssl_context: ssl.SSLContext | None = None,
        kernel_stamps: bool | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.endpoint = endpoint
        self.clock = clock
        self.codings = accepted_codings(endpoint.headers)  # inflated as they arrive
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()
        self._ready: list[Connection] = []  # connections with stamped, unparsed reads
        self._drain_scheduled = False
        self._after: list[Callable[[], None]] = []  # `after_reads` callbacks, in order
        self._slices = 0
        self._after_scheduled = False  # an `_after_step` is due (callbacks left, no drain)
        self.last_read_ns = 0  # when bytes last arrived on any connection (the watchdog)
        self._ssl: ssl.SSLContext | None = None
        if endpoint.scheme == "https":  # the run's one trust (engine.tls), unless a test's
            self._ssl = ssl_context or client_context(endpoint.tls)
        # Where sockets connect: the proxy, when there is one (engine.proxy).
        proxy = endpoint.proxy
        self._dial = (proxy.host, proxy.port) if proxy else (endpoint.host, endpoint.port)
        self.opened = 0  # every connection opened, warm ones included
        self.warm_opened = 0  # of which opened before t0 by `warm`
        # Plain HTTP on Linux: sockets of our own, read with the kernel's receive time (to
        # the proxy, for an http target behind one: its reads are this client's reads).
        if kernel_stamps is None:
            kernel_stamps = KERNEL_STAMPS_AVAILABLE and self._ssl is None
        self.kernel_stamps = kernel_stamps
        if kernel_stamps:
            keep_kernel_timestamping_on()
        self._addresses: list[tuple[int, Any]] = []  # (family, sockaddr), once resolved
        # Every StampedSocket reads into this and copies out what it got (one loop thread).
        self.read_buffer = [memoryview(bytearray(READ_SIZE))]
        self.read_clock = ReadClock(clock)

    def take_idle(self) -> Connection | None:
        """An idle kept-alive connection (marked reused), or None."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return None

    async def connect(self) -> Connection:
        """A new connection (through the proxy's tunnel for https behind one). OSError when
        it cannot be opened (`proxy.ProxyRefused` when the proxy declines the tunnel,
        `ssl.SSLCertVerificationError` when the certificate fails verification)."""
        loop = asyncio.get_running_loop()
        endpoint = self.endpoint
        if self.kernel_stamps:
            conn = Connection(self)
            StampedSocket.attach(loop, await self._open_socket(loop), conn)
            self.opened += 1
            self._open.add(conn)
            return conn
        if endpoint.tunnelled:
            assert endpoint.proxy is not None
            sock = await self._open_socket(loop, stamps=False)
            try:
                await open_tunnel(loop, sock, endpoint.proxy, endpoint.host, endpoint.port)
                _, protocol = await loop.create_connection(
                    lambda: Connection(self), sock=sock, ssl=self._ssl,
                    server_hostname=endpoint.host,
                )  # fmt: skip
            except BaseException:
                sock.close()
                raise
        else:
            _, protocol = await loop.create_connection(
                lambda: Connection(self), *self._dial, ssl=self._ssl,
                server_hostname=endpoint.host if self._ssl else None,
            )  # fmt: skip
        self.opened += 1
        self._open.add(protocol)
        return protocol

    async def warm(self, count: int) -> WarmReport:
        """Open `count` connections before t0, check each is usable, and keep them idle.

        Opened `WARM_PARALLEL` at a time (a burst of a thousand SYNs overflows a server's
        listen backlog, and each lost SYN costs a 1 s retransmit). After `WARM_GRACE_S` each
        is checked: still open, nothing unasked to read (a server that accepts and closes at
        once, e.g. past its connection limit, fails here, not in a request); connects not
        done within `WARM_TIMEOUT_S` are given up (failed). The usable ones
        go to the idle list marked `warm`; the first requests take them, so connection setup
        (TCP, and TLS when it is https) is in no latency. A server that later drops an idle
        one is handled as for any kept-alive connection: one retry on a fresh connection.
        """
        start_ns = self.clock.now_ns()
        opened: list[Connection] = []
        errors: list[str] = []
        gate = asyncio.Semaphore(WARM_PARALLEL)

        async def open_one() -> None:
            async with gate:
                try:
                    opened.append(await self.connect())
                except OSError as exc:
                    errors.append(connect_failure(exc, self.endpoint))

        tasks = [asyncio.ensure_future(open_one()) for _ in range(max(0, count))]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=WARM_TIMEOUT_S)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
                errors.append(f"{len(late)} not connected within {WARM_TIMEOUT_S:g} s")
        await asyncio.sleep(WARM_GRACE_S)
        usable = [conn for conn in opened if conn.is_usable()]
        for conn in opened:
            if conn not in usable:
                conn.detach()
        for conn in usable:
            conn.warm = True
            self._idle.append(conn)
        self.warm_opened += len(usable)
        failed = count - len(usable)
        if failed and not errors:
            errors.append("closed by the server right after it was opened")
        return WarmReport(
            requested=count, opened=len(usable), failed=max(0, failed),
            error=errors[0] if errors else None,
            seconds=(self.clock.now_ns() - start_ns) / 1e9,
        )  # fmt: skip

    async def _open_socket(
        self, loop: asyncio.AbstractEventLoop, *, stamps: bool = True
    ) -> socket.socket:
        """A connected non-blocking socket to the endpoint (or its proxy), with kernel
        receive timestamps switched on unless `stamps` is False.

        The name is resolved once per pool (a lookup per connection would cost a thread-pool
        round trip each, at thousands of connections; an IP literal needs none). Addresses
        are tried in order, as `create_connection` does; the one that connects is kept first.
        """
        host, port = self._dial
        if not self._addresses:
            literal = _literal_address(host, port)
            if literal is not None:
                self._addresses = [literal]
            else:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                self._addresses = [(info[0], info[4]) for info in infos]
            if not self._addresses:
                raise OSError(f"cannot resolve {host}")
        error: OSError | None = None
        for index, (family, address) in enumerate(self._addresses):
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if stamps:
                    with contextlib.suppress(OSError):  # refused: reads stamped in user space
                        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                error = exc
                continue
            except BaseException:
                sock.close()
                raise
            if index:
                self._addresses.insert(0, self._addresses.pop(index))
            return sock
        assert error is not None
        raise error

    def schedule(self, conn: Connection) -> None:
        """Parse `conn`'s reads once this loop iteration's I/O callbacks have run."""
        self._ready.append(conn)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        """Parse a slice of the stamped reads, then let the loop poll (and stamp) again.

        Parsing a 256-stream burst takes ~2 ms; done in one go, a chunk arriving meanwhile
        would be stamped up to that late. In slices it waits at most one slice.
        """
        self.last_read_ns = self.clock.now_ns()
        self.read_clock.expire()
        ready = self._ready
        self._ready = ready[DRAIN_SLICE:]
        loop = asyncio.get_running_loop()
        for conn in ready[:DRAIN_SLICE]:
            try:
                conn.process()
            except Exception as exc:  # a bug: report it, end that exchange, keep the rest going
                _report(loop, exc)
                try:
                    conn.fail(f"internal error while parsing: {exc!r}")
                except Exception as again:  # the exchange itself is what failed
                    _report(loop, again)
        if self._ready:
            loop.call_soon(self._drain)
            self._slices += 1
            if self._after and self._slices % AFTER_EVERY_SLICES == 0:
                self._run_after(loop)
        else:
            self._drain_scheduled = False
            self._slices = 0
            if self._after:
                self._run_after(loop)

    def after_reads(self, callback: Callable[[], None]) -> None:
        """Run `callback` once the reads stamped so far are parsed (at once when there are
        none and nothing waits before it), or after `AFTER_EVERY_SLICES` slices when more
        keep coming; in order, `AFTER_SLICE` per loop iteration.

        What waits here is bookkeeping that can wait (waking the task that records an
        exchange): when 512 streams end in one step, every stream's end, and a closed
        loop's next send, is handled before any record is built, not one slice at a time
        with the records of the slice before in between; the records are then built a
        slice per loop iteration, the sockets read between slices, so no read waits for
        all 512.
        """
        if self._drain_scheduled or self._after:
            self._after.append(callback)
        else:
            callback()

    def _run_after(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the next `AFTER_SLICE` callbacks; the rest in later loop iterations."""
        after = self._after
        self._after = after[AFTER_SLICE:]
        for callback in after[:AFTER_SLICE]:
            try:
                callback()
            except Exception as exc:  # a bug: report it, run the rest
                _report(loop, exc)
        if self._after and not self._drain_scheduled and not self._after_scheduled:
            self._after_scheduled = True
            loop.call_soon(self._after_step)

    def _after_step(self) -> None:
        """The next slice of callbacks, unless a drain (which runs them as it goes) is due."""
        self._after_scheduled = False
        if self._after and not self._drain_scheduled:
            self._run_after(asyncio.get_running_loop())

    def release(self, conn: Connection) -> None:
        """Return a connection whose response completed cleanly."""
        if not conn.closed:
            conn.reused = True
            self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        """Drop a connection that closed."""
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    def close(self) -> None:
        """Close every connection, idle or still finishing a response nobody waits for."""
        for conn in list(self._open):
            conn.detach()
        self._open.clear()
        self._idle.clear()
