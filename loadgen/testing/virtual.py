"""The engine in virtual time: a clock that jumps, a loop that runs on it, no sockets.

`run_scripted(plans, handler)` runs plans through the real engine — the harness, the
pool's connections and their HTTP framing, the adapter, the exchange and its deadlines —
against `handler`'s scripts, the same steps `loadgen.testing.ScriptedServer` plays. No
socket, no thread: each request the engine writes is parsed as the scripted server parses
it, and the script's bytes are handed to the connection at the virtual times its pauses
say. The event loop runs on the same `VirtualClock` the engine reads: when nothing is
ready it jumps to its next timer instead of sleeping. A run of minutes takes
milliseconds, every interval a test reads is the one the script set, to the nanosecond,
and nothing a loaded machine does can move it.

What it does not check is the socket layer (kernel stamps, real reads): the loopback
tests against `ScriptedServer` and the simulator do.
"""

from __future__ import annotations

import asyncio
import errno
import json
import selectors
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from loadgen.adapters.generic import GenericSpec
from loadgen.engine.transport import Connection, Endpoint, Pool, make_endpoint
from loadgen.results.records import RequestRecord
from loadgen.testing import (
    CLOSE,
    RESET,
    Handler,
    ReceivedRequest,
    Step,
    engine_config,
    run_through,
)
from loadgen.workload.plans import RequestPlan, Work

START_NS = 1_000_000_000  # the virtual monotonic clock starts at 1 s (0 means "unset" to some)
WALL_START_NS = 1_767_225_600_000_000_000  # ... and the wall clock at 2026-01-01T00:00:00Z
DEADLOCK_S = 30.0  # real seconds a virtual loop waits for a thread before calling it stuck


class VirtualClock:
    """A `Clock` that moves only when told: the loop moves it to its next timer."""

    def __init__(self, start_ns: int = START_NS) -> None:
        self.ns = start_ns

    def now_ns(self) -> int:
        """The virtual monotonic time."""
        return self.ns

    def wall_ns(self) -> int:
        """The virtual wall clock: a fixed epoch plus the monotonic time."""
        return WALL_START_NS + self.ns


class _JumpingSelector(selectors.DefaultSelector):
    """The loop's selector: real events first; with none, jump the clock to the loop's
    next timer instead of waiting for it (the loop asks with `timeout` until it)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # no timer at all: only a thread can wake the loop
            events = super().select(DEADLOCK_S)
            if not events:
                raise RuntimeError("virtual time: nothing scheduled and nothing to wait for")
            return events
        # The timer's own time, to the ns: rounding (not ceil) removes float noise, so a
        # sleep of D ns from t wakes at exactly t + D (the loop fires timers due within 1 ns).
        due_ns = round((self._clock.ns / 1e9 + timeout) * 1e9)
        self._clock.ns = max(self._clock.ns, due_ns)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose time is a `VirtualClock` (in seconds, as loops count)."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_JumpingSelector(clock))
        self._virtual = clock

    def time(self) -> float:
        return self._virtual.ns / 1e9


class ScriptedPool(Pool):
    """A pool whose connections reach `handler` without a socket (see the module doc).

    `requests`, `connections` and `finished` say what the server saw, as `ScriptedServer`
    does; `refuse=True` refuses every connection (nothing listening).
    """

    def __init__(
        self,
        handler: Handler,
        endpoint: Endpoint,
        clock: VirtualClock,
        *,
        refuse: bool = False,
        connect_s: float = 0.0,
    ) -> None:
        super().__init__(endpoint, kernel_stamps=False, clock=clock)
        self.handler = handler
        self.refuse = refuse
        self.connect_s = connect_s  # virtual time each connect takes (a handshake)
        self.requests: list[ReceivedRequest] = []
        self.finished: dict[str, int] = {}  # X-Request-Id → when its script's last step played
        self.connections = 0

    async def connect(self) -> Connection:
        """A new scripted connection, at once (loopback connects take no virtual time)."""
        if self.connect_s:
            await asyncio.sleep(self.connect_s)
        if self.refuse:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        conn = Connection(self)
        transport = _ScriptedTransport(self, conn, self.connections)
        self.connections += 1
        conn.connection_made(cast(asyncio.BaseTransport, transport))
        self.opened += 1
        self._open.add(conn)
        return conn


class _ScriptedTransport:
    """The server end of one scripted connection: parses what the client writes, plays
    one script per request in order, and delivers the bytes as reads."""

    def __init__(self, pool: ScriptedPool, conn: Connection, index: int) -> None:
        self._pool = pool
        self._conn = conn
        self._index = index
        self._loop = asyncio.get_running_loop()
        self._inbox = b""
        self._queue: list[ReceivedRequest] = []
        self._steps: Iterator[Step] | None = None
        self._playing: ReceivedRequest | None = None
        self._timer: asyncio.Handle | None = None
        self._closed = False

    # -- what the client's connection calls --------------------------------------------
    def write(self, data: bytes) -> None:
        if self._closed:
            return
        self._inbox += data
        while (request := self._take_request()) is not None:
            self._pool.requests.append(request)
            self._queue.append(request)
        if self._playing is None and self._queue:
            self._timer = self._loop.call_soon(self._next_script)

    def is_closing(self) -> bool:
        """Closed (by either side): what `Connection.is_usable` asks of a transport."""
        return self._closed

    def abort(self) -> None:
        """The client gave up: stop playing; it hears of the close on the next iteration."""
        if not self._closed:
            self._shut()
            self._loop.call_soon(self._conn.connection_lost, None)

    # -- the server's side ---------------------------------------------------------------
    def _take_request(self) -> ReceivedRequest | None:
        end = self._inbox.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = self._inbox[:end].decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if len(self._inbox) < end + 4 + length:
            return None
        body_bytes = self._inbox[end + 4 : end + 4 + length]
        self._inbox = self._inbox[end + 4 + length :]
        method, path, _ = lines[0].split(" ", 2)
        body = json.loads(body_bytes) if body_bytes else None
        return ReceivedRequest(method, path, headers, body, self._index, self._pool.clock.now_ns())

    def _next_script(self) -> None:
        self._playing = self._queue.pop(0)
        self._steps = iter(self._pool.handler(self._playing))
        self._play()

    def _play(self) -> None:
        """Play steps up to the next pause (a timer resumes it), close or reset."""
        self._timer = None
        assert self._steps is not None
        for step in self._steps:
            if isinstance(step, bytes):
                self._conn.data_received(step)
            elif isinstance(step, float | int):
                self._timer = self._loop.call_later(step, self._play)
                return
            elif step in (CLOSE, RESET):
                self._script_done()
                self._close(
                    ConnectionResetError(errno.ECONNRESET, "reset") if step == RESET else None
                )
                return
        self._script_done()
        if self._queue:
            self._next_script()

    def _script_done(self) -> None:
        assert self._playing is not None
        self._pool.finished[self._playing.headers.get("x-request-id", "")] = (
            self._pool.clock.now_ns()
        )
        self._playing = self._steps = None

    def _close(self, exc: Exception | None) -> None:
        """The server closed (FIN, or RST with `exc`): the client reads the end now."""
        self._shut()
        self._conn.connection_lost(exc)

    def _shut(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def run_scripted(
    plans: Sequence[RequestPlan] | Work,
    handler: Handler,
    *,
    api: str = "openai-chat",
    max_in_flight: int | None = None,
    headers_for: Callable[[RequestPlan], Mapping[str, str]] | None = None,
    path: str | None = None,
    priority_header: str | None = None,
    stop_after_s: float | None = None,
    generic: GenericSpec | None = None,
    refuse: bool = False,
    warm: int = 0,
    connect_s: float = 0.0,
    headers: Mapping[str, str] | None = None,
) -> tuple[list[RequestRecord], ScriptedPool]:
    """`loadgen.testing.run_engine`, in virtual time against `handler`'s scripts: the
    records by request id, and the pool (what the server saw). Times in the records are
    relative to t0, which is 20 ms after the start (and after warming `warm`
    connections), as in `run_engine`; each connect takes `connect_s` of virtual time;
    `headers` are sent with every request (the endpoint's, as `--header` gives them)."""
    config = engine_config(api, max_in_flight=max_in_flight, headers_for=headers_for,
                           priority_header=priority_header, generic=generic)  # fmt: skip
    adapter = config.adapter
    endpoint = make_endpoint("http://127.0.0.1:8000", path or adapter.default_path,
                             {**adapter.headers(None), **(headers or {})})  # fmt: skip
    clock = VirtualClock()
    pool = ScriptedPool(handler, endpoint, clock, refuse=refuse, connect_s=connect_s)
    loop_options: dict[str, Any] = {"loop_factory": lambda: VirtualLoop(clock)}
    records = run_through(plans, pool, config, stop_after_s=stop_after_s,
                          loop_options=loop_options, warm=warm)  # fmt: skip
    return records, pool
