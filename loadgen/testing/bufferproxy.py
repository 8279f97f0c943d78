"""A TCP proxy that holds responses back, as buffering ingresses, CDNs and gateways do.

For tests of delivery (`analysis.delivery`): the client's bytes are no longer the server's
when something between them buffers. This proxy forwards each request at once and each
response either in `block`-byte blocks (a response's tail, shorter than a block, when the
response ends) or whole (held until its last byte). It reads HTTP/1.1 framing only to
find where each response ends (Content-Length, chunked, or the close), so keep-alive
connections carry one response after another, as through a real proxy.

    python -m loadgen.testing.bufferproxy --upstream http://127.0.0.1:8000 --block 4096
    python -m loadgen.testing.bufferproxy --upstream http://127.0.0.1:8000 --whole

`buffering_proxy(...)` starts one in a process of its own for a test; `held(steps)` plays a
scripted response (`loadgen.testing`) as a client behind it reads it, and `stalled(steps)`
as a direct reader that is away at times reads it, for tests in virtual time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from loadgen.testing import Step
from loadgen.testing.netpath import Started, _serving, free_port

MAX_HEAD_BYTES = 64 * 1024


class ResponseEnds:
    """Finds where each HTTP/1.1 response ends in a byte stream, fed as it arrives.

    Enough framing for a proxy's bookkeeping: status line and headers (1xx skipped),
    Content-Length or chunked bodies; a body with neither ends with the connection.
    """

    def __init__(self) -> None:
        self._state = "head"  # head, length, chunk_size, chunk_data, chunk_crlf, trailers, close
        self._line = bytearray()
        self._head: list[bytes] = []  # the lines of the head being read
        self._remaining = 0

    def feed(self, data: bytes) -> list[int]:
        """Offsets in `data` just after each response that ends in it."""
        ends: list[int] = []
        pos = 0
        while pos < len(data):
            state = self._state
            if state == "close":
                return ends
            if state in ("length", "chunk_data"):
                take = min(self._remaining, len(data) - pos)
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    if state == "length":
                        ends.append(pos)
                        self._state = "head"
                    else:
                        self._state = "chunk_crlf"
                continue
            newline = data.find(b"\n", pos)
            if newline < 0:
                self._line += data[pos:]
                if len(self._line) > MAX_HEAD_BYTES:
                    raise ValueError("a header or chunk line over 64 KiB: not HTTP/1.1")
                return ends
            self._line += data[pos:newline]
            pos = newline + 1
            line = bytes(self._line).rstrip(b"\r")
            self._line.clear()
            if self._line_done(line):
                ends.append(pos)
        return ends

    def _line_done(self, line: bytes) -> bool:
        """Take one line; True when it ended a response."""
        state = self._state
        if state == "head":
            return self._head_line(line)
        if state == "chunk_size":
            self._remaining = int(line.split(b";", 1)[0].strip() or b"0", 16)
            self._state = "chunk_data" if self._remaining else "trailers"
            return False
        if state == "chunk_crlf":
            self._state = "chunk_size"
            return False
        if not line:  # state "trailers": an empty line ends them, and the response
            self._state = "head"
            return True
        return False

    def _head_line(self, line: bytes) -> bool:
        if line:
            self._head.append(line)
            return False
        head, self._head = self._head, []
        if not head:
            return False
        status = int(head[0].split(b" ", 2)[1])
        fields = {}
        for item in head[1:]:
            name, _, value = item.partition(b":")
            fields[name.strip().lower()] = value.strip().lower()
        if 100 <= status < 200:
            return False
        if b"chunked" in fields.get(b"transfer-encoding", b""):
            self._state = "chunk_size"
        elif b"content-length" in fields:
            self._remaining = int(fields[b"content-length"])
            self._state = "length" if self._remaining else "head"
            return self._remaining == 0
        else:
            self._state = "close"
        return False


class Holder:
    """The bytes of one connection's responses on their way to the client: released to
    `write` in `block`-byte blocks, or (block 0) each response whole."""

    def __init__(self, write: Callable[[bytes], object], block: int) -> None:
        self._write = write
        self._block = block
        self._held = bytearray()
        self._ends = ResponseEnds()

    def take(self, data: bytes) -> None:
        """Hold `data`; write what its blocks and ends release."""
        start = len(self._held)
        self._held += data
        ends = [start + offset for offset in self._ends.feed(data)]
        released = 0
        for end in ends:  # a response ended: everything up to its last byte goes now
            released = self._release(released, end)
        if self._block:
            while len(self._held) - released >= self._block:
                released = self._release(released, released + self._block)
        del self._held[:released]

    def _release(self, start: int, end: int) -> int:
        step = self._block or end - start
        for at in range(start, end, step):  # blocks, the tail shorter; or all of it
            self._write(bytes(self._held[at : min(at + step, end)]))
        return end

    def flush(self) -> None:
        """The upstream closed: what is held goes now."""
        if self._held:
            self._write(bytes(self._held))
            self._held.clear()


def held(steps: Sequence[Step], *, block: int = 0) -> list[Step]:
    """A scripted response (`loadgen.testing` steps) as a client behind this proxy reads
    it: the same bytes, released in `block`-byte blocks (0: whole) at the time the byte that
    completes each was written; pauses between them, a close or reset kept at its time."""
    timeline: list[tuple[float, bytes | str]] = []
    now = 0.0
    holder = Holder(lambda data: timeline.append((now, data)), block)
    for step in steps:
        if isinstance(step, bytes):
            holder.take(step)
        elif isinstance(step, float | int):
            now += step
        else:
            holder.flush()
            timeline.append((now, step))
    holder.flush()
    return _steps(timeline)


def stalled(steps: Sequence[Step], stalls: Sequence[tuple[float, float]]) -> list[Step]:
    """A scripted response as a direct reader reads it that is away for each (start_s,
    length_s) of `stalls` (its process descheduled): what was written meanwhile is read at
    once when it is back; every other write is read as it comes."""
    timeline: list[tuple[float, bytes | str]] = []
    now = 0.0
    for step in steps:
        if isinstance(step, float | int):
            now += step
            continue
        back = next((a + d for a, d in stalls if a <= now < a + d), now)
        if timeline and isinstance(step, bytes) and timeline[-1][0] == back:
            last = timeline[-1][1]
            if isinstance(last, bytes):
                timeline[-1] = (back, last + step)  # one read
                continue
        timeline.append((back, step))
    return _steps(timeline)


def _steps(timeline: Sequence[tuple[float, bytes | str]]) -> list[Step]:
    """Writes at times → steps: each write, with the pause before it."""
    steps: list[Step] = []
    now = 0.0
    for at, item in timeline:
        if at > now:
            steps.append(at - now)
            now = at
        steps.append(item)
    return steps


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Client → upstream, as it comes."""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()


async def _hold(reader: asyncio.StreamReader, holder: Holder, writer: asyncio.StreamWriter) -> None:
    """Upstream → client, held back by `holder`."""
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            holder.take(data)
            await writer.drain()
    holder.flush()
    with contextlib.suppress(OSError):
        await writer.drain()
        writer.close()


def serve(upstream: str, port: int, block: int) -> None:
    """Listen on 127.0.0.1:`port`, forwarding to `upstream` (http://host:port) with
    responses in `block`-byte blocks (0: each whole), until killed."""
    parts = urlsplit(upstream)
    host, up_port = parts.hostname or "127.0.0.1", parts.port or 80

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(host, up_port)
        except OSError:
            client_w.close()
            return
        holder = Holder(client_w.write, block)
        await asyncio.gather(_pipe(client_r, up_w), _hold(up_r, holder, client_w))
        up_w.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


@contextlib.contextmanager
def buffering_proxy(folder: Path, upstream: str, *, block: int = 0) -> Iterator[Started]:
    """The proxy in front of `upstream` on a free loopback port, in a process of its own,
    until the block ends: responses in `block`-byte blocks, or (0) each whole."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    mode = ["--block", str(block)] if block else ["--whole"]
    cmd = [sys.executable, "-m", "loadgen.testing.bufferproxy", "--upstream", upstream,
           "--port", str(port), *mode]  # fmt: skip
    log = folder / "stdout.log"
    with _serving(cmd, port=port, folder=folder, log=log, url=f"http://127.0.0.1:{port}") as s:
        yield s


def main(argv: list[str] | None = None) -> None:
    """The command line: --upstream URL --port N (--block BYTES | --whole)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--upstream", required=True, help="http://host:port of the server")
    parser.add_argument("--port", type=int, default=8080)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--block", type=int, help="forward responses in blocks of BYTES")
    mode.add_argument("--whole", action="store_true", help="forward each response whole")
    args = parser.parse_args(argv)
    if args.block is not None and args.block <= 0:
        parser.error("--block must be > 0")
    serve(args.upstream, args.port, 0 if args.whole else args.block)


if __name__ == "__main__":
    main()
