"""The pool: idle keep-alive connections to one endpoint, new ones opened on demand
(`connect.Dialer`) or before t0 (`warm`), and the loop-side scheduling of the per-chunk
path: reads are stamped as they arrive and parsed in slices (`_drain`), and bookkeeping
that can wait (`after_reads`) runs once the reads stamped before it are parsed.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

from loadgen.engine.clock import SYSTEM_CLOCK, Clock, ReadClock
from loadgen.engine.tls import client_context
from loadgen.engine.transport.codings import accepted_codings
from loadgen.engine.transport.connect import Dialer, connect_failure
from loadgen.engine.transport.endpoint import Endpoint
from loadgen.engine.transport.http11 import Connection
from loadgen.engine.transport.interfaces import WarmReport
from loadgen.engine.transport.stamped import (
    KERNEL_STAMPS_AVAILABLE,
    READ_SIZE,
    keep_kernel_timestamping_on,
)

WARM_PARALLEL = 64  # connects in flight at once while warming (a listen backlog is ~128+)
WARM_GRACE_S = 0.01  # after warming: time for a server's immediate close to arrive
WARM_TIMEOUT_S = 10.0  # warming gives up on connects not done by then (SYNs dropped)
DRAIN_SLICE = 32  # connections parsed per loop iteration (~0.3 ms) before polling again
AFTER_EVERY_SLICES = 8  # `after_reads` callbacks wait at most this many slices
# `after_reads` callbacks run per loop iteration: each wakes a task that builds a record and
# makes a request (~60 µs); 512 at once held the loop ~30 ms without reading a socket, the
# reads queued meanwhile merged, and a merged read carries its last segment's stamp.
AFTER_SLICE = 32


def _report(loop: asyncio.AbstractEventLoop, exc: Exception) -> None:
    """Hand a parsing bug to the loop's exception handler (it is logged, not swallowed)."""
    loop.call_exception_handler({"message": "loadgen: parsing a response failed", "exception": exc})


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
        tls: ssl.SSLContext | None = None
        if endpoint.scheme == "https":  # the run's one trust (engine.tls), unless a test's
            tls = ssl_context or client_context(endpoint.tls)
        self.opened = 0  # every connection opened, warm ones included
        self.warm_opened = 0  # of which opened before t0 by `warm`
        # Plain HTTP on Linux: sockets of our own, read with the kernel's receive time (to
        # the proxy, for an http target behind one: its reads are this client's reads).
        if kernel_stamps is None:
            kernel_stamps = KERNEL_STAMPS_AVAILABLE and tls is None
        self.kernel_stamps = kernel_stamps
        if kernel_stamps:
            keep_kernel_timestamping_on()
        self._dialer = Dialer(endpoint, tls, kernel_stamps=kernel_stamps)
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
        """A new connection (`connect.Dialer.open`: OSError when it cannot be opened)."""
        conn = await self._dialer.open(self)
        self.opened += 1
        self._open.add(conn)
        return conn

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
