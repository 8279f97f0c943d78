"""No burst of work holds the event loop: task starts, record bookkeeping and the
simulator's writes go a slice per loop iteration, the sockets polled between slices.

A read that waits for the loop merges with the chunks that arrive meanwhile, and carries
the kernel stamp of its last segment: a burst of 512 task steps (~20 ms) stamped a first
token up to a decode step late. The simulator, for its part, stamps each request as it
reads it and handles a burst of them a slice at a time. Each test counts, per loop iteration, how much of a burst
ran, and fails when a burst runs in one iteration (the code before slicing).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import pytest

from loadgen.engine.starts import START_SLICE, Starts
from loadgen.engine.transport import Pool, make_endpoint
from loadgen.engine.transport import pool as transport_pool
from loadgen.run.processes.simulator import running_sim
from loadgen.sim import protocol
from loadgen.sim.config import config_from_mapping
from loadgen.sim.engine import StepResult
from loadgen.sim.server import DELIVER_SLICE, SimServer
from loadgen.sim.trace import NullTrace
from loadgen.testing import NullTransport


def per_iteration(count: Callable[[], int], until: Callable[[], bool]) -> asyncio.Future[list[int]]:
    """How far `count()` moved in each loop iteration, sampled by a callback that
    re-arms itself (a callback scheduled during an iteration runs in the next one)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[int]] = loop.create_future()
    steps: list[int] = []
    last = [count()]

    def sample() -> None:
        now = count()
        steps.append(now - last[0])
        last[0] = now
        if until():
            done.set_result([s for s in steps if s])
        else:
            loop.call_soon(sample)

    loop.call_soon(sample)
    return done


def test_starts_hand_a_burst_of_tasks_to_the_group_a_slice_per_iteration() -> None:
    """100 tasks started at once: at most START_SLICE first steps per loop iteration, all
    100 started, in order; `wait` returns once the last is handed over."""
    total = 100
    started: list[int] = []

    async def task(i: int) -> None:
        started.append(i)

    async def main() -> list[int]:
        steps: list[int] = []
        async with anyio.create_task_group() as tg:
            sampled = per_iteration(lambda: len(started), lambda: len(started) == total)
            starts = Starts(tg)
            for i in range(total):
                starts.start(task, i)
            await starts.wait()
            steps += await sampled
        return steps

    steps = anyio.run(main, backend="asyncio")
    assert started == list(range(total))
    assert START_SLICE == 32
    assert steps == [32, 32, 32, 4]  # all at once (one iteration of 100) before slicing


class EndsTogether:
    """A connection whose one read ends `n` exchanges (as 512 streams ending in one step
    end one each): each asks the pool to run its bookkeeping after the reads."""

    def __init__(self, pool: Pool, n: int, ran: list[int]) -> None:
        self.pool, self.n, self.ran = pool, n, ran

    def process(self) -> None:
        for i in range(self.n):
            self.pool.after_reads(partial(self.ran.append, i))


def test_after_reads_callbacks_run_a_slice_per_iteration_in_order() -> None:
    """200 exchanges end in one drain: their bookkeeping runs AFTER_SLICE per iteration
    (the sockets read between), every one of them, in the order they ended."""
    total = 200
    ran: list[int] = []

    async def main() -> list[int]:
        pool = Pool(make_endpoint("http://127.0.0.1:9", "/v1/chat/completions", {}))
        steps = per_iteration(lambda: len(ran), lambda: len(ran) == total)
        pool.schedule(EndsTogether(pool, total, ran))  # type: ignore[arg-type]
        return await steps

    steps = asyncio.run(main())
    assert ran == list(range(total))
    assert transport_pool.AFTER_SLICE == 32
    assert steps == [32] * 6 + [8]  # [200] before slicing


def test_after_reads_runs_at_once_only_when_nothing_waits_before_it() -> None:
    """With callbacks still queued, a new one waits its turn (order kept); with none and
    no reads pending, it runs at once."""
    ran: list[str] = []

    async def main() -> None:
        pool = Pool(make_endpoint("http://127.0.0.1:9", "/v1/chat/completions", {}))
        pool.after_reads(lambda: ran.append("idle"))
        assert ran == ["idle"]
        pool.schedule(EndsTogether(pool, transport_pool.AFTER_SLICE + 1, []))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the drain ran: one slice done, one callback left
        pool.after_reads(lambda: ran.append("late"))
        assert ran == ["idle"]  # behind the one still queued
        for _ in range(5):
            await asyncio.sleep(0)
        assert ran == ["idle", "late"]

    asyncio.run(main())


class Writer:
    """A simulator exchange that only notes the order its tokens were written in."""

    def __init__(self, seq_id: int, log: list[int]) -> None:
        self.seq_id, self.log = seq_id, log
        self.last_token_sim_ns: int | None = None

    def on_token(self) -> None:
        self.log.append(self.seq_id)


def step(index: int, seq_ids: range) -> StepResult:
    return StepResult(start_ns=index, end_ns=index + 1, decode_batch=len(seq_ids),
                      prefill_tokens=0, emitted=tuple(seq_ids))  # fmt: skip


def test_the_simulator_writes_a_step_a_slice_per_iteration_steps_in_order() -> None:
    """A step of 150 tokens then one of 10: DELIVER_SLICE written at once, the rest a
    slice per iteration (requests are read between), every token once, steps in order;
    each step's trace record once its last token is written."""
    log: list[int] = []
    traced: list[tuple[int, int]] = []

    class Trace(NullTrace):
        def write(self, record: dict[str, object]) -> None:
            traced.append((int(record["emitted"]), len(log)))  # type: ignore[call-overload]

    async def main() -> tuple[int, list[int]]:
        loop = asyncio.get_running_loop()
        app = SimServer(config_from_mapping({}, "test"), loop, Trace())
        app.exchanges.update({i: Writer(i, log) for i in range(160)})  # type: ignore[misc]
        app._deliver(step(0, range(150)), 0)
        app._deliver(step(1, range(150, 160)), 0)
        at_once = len(log)
        steps = await per_iteration(lambda: len(log), lambda: len(log) == 160)
        return at_once, steps

    at_once, steps = asyncio.run(main())
    assert DELIVER_SLICE == 64
    assert at_once == 64  # the first slice at once: no step is written late for it
    assert log == list(range(160))
    assert steps == [64, 32]  # the rest of step 1, then its last 22 and step 2's 10
    assert traced == [(150, 150), (10, 160)]


def post(n: int = 0) -> bytes:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi %d"}],"stream":true}' % n
    return b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)


def sim_connections(
    n: int, inbox: protocol.Inbox | None
) -> tuple[list[protocol.Connection], list[tuple[int, int]]]:
    """`n` simulator connections whose handler logs (received_ns, handled at) per request."""
    handled: list[tuple[int, int]] = []

    def handler(conn: protocol.Connection, http: protocol.HttpRequest) -> None:
        handled.append((http.received_ns, protocol.perf_counter_ns()))

    conns = [protocol.Connection(handler, set(), inbox) for _ in range(n)]
    for conn in conns:
        conn.connection_made(NullTransport())  # type: ignore[arg-type]
    return conns, handled


def test_the_simulator_stamps_a_burst_as_read_and_handles_it_a_slice_per_iteration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 requests read in one iteration: each stamped in its own read (a clock that
    ticks once per call), every stamp before any handling; handled READ_SLICE per
    iteration after the reads. Without the inbox request k is stamped after request
    k − 1 was handled, the server's own queue counted before its receive stamp."""
    ticks = iter(range(1, 10_000))
    monkeypatch.setattr(protocol, "perf_counter_ns", lambda: next(ticks))

    async def main() -> list[int]:
        conns, handled = sim_connections(100, protocol.Inbox())
        for i, conn in enumerate(conns):
            conn.data_received(post(i))  # one loop iteration's reads
        assert handled == []  # nothing handled inside the reads
        slices = await per_iteration(lambda: len(handled), lambda: len(handled) == 100)
        stamps = [r for r, _ in handled]
        assert stamps == list(range(1, 101))  # in read order, one tick per read
        assert max(stamps) < min(at for _, at in handled)
        return slices

    assert protocol.READ_SLICE == 32
    assert asyncio.run(main()) == [32, 32, 32, 4]


def test_without_an_inbox_each_request_is_handled_in_its_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The contrast the inbox exists for: handled at once, each stamp after the previous
    request's handling (what every request's stamp was before read stamps)."""
    ticks = iter(range(1, 10_000))
    monkeypatch.setattr(protocol, "perf_counter_ns", lambda: next(ticks))
    conns, handled = sim_connections(3, None)
    for i, conn in enumerate(conns):
        conn.data_received(post(i))
    assert handled == [(1, 2), (3, 4), (5, 6)]


def test_a_request_is_stamped_by_the_read_that_brought_its_last_byte(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request split over two reads carries the second read's stamp; two pipelined
    requests in one read carry that read's; the next one, completed later, its own."""
    clock = [0]
    monkeypatch.setattr(protocol, "perf_counter_ns", lambda: clock[0])
    (conn,), handled = sim_connections(1, None)
    first, second, third = post(1), post(2), post(3)
    clock[0] = 100
    conn.data_received(first[:20])
    clock[0] = 200
    conn.data_received(first[20:] + second + third[:10])
    clock[0] = 250
    conn._done(keep_alive=True)  # the first answered: the second, read at 200, is next
    clock[0] = 300
    conn.data_received(third[10:])  # busy with the second: waits
    clock[0] = 350
    conn._done(keep_alive=True)
    assert [r for r, _ in handled] == [200, 200, 300]


def wait_stopped(pid: int) -> None:
    """Until the kernel says `pid` is stopped (state T in /proc/PID/stat), where it says."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        return  # no /proc: the stop is as prompt as the platform makes it
    for _ in range(10_000):  # ~10 s at most; a stop takes microseconds on an idle box
        if stat.read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} did not stop")


def test_the_running_simulator_reads_a_whole_burst_before_it_handles_any(tmp_path: Path) -> None:
    """20 requests written while the simulator is stopped (SIGSTOP) are all in its socket
    buffers when it resumes: it reads (stamps) all 20 before it handles the first, so the
    first handled request's handling starts after the last one's receive stamp. Without
    the inbox each is handled in its own read: no stamp after the first handling."""
    trace_file = tmp_path / "sim.jsonl"
    with running_sim(["--speed", "50"], trace_file=trace_file) as sim:
        host, port = sim.url.removeprefix("http://").rsplit(":", 1)
        socks = [socket.create_connection((host, int(port)), timeout=30) for _ in range(20)]
        for sock in socks:  # a round trip each: every connection accepted before the stop
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: sim\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(65536)
            length = int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            while len(head.split(b"\r\n\r\n", 1)[1]) < length:
                head += sock.recv(65536)
        os.kill(sim.pid, signal.SIGSTOP)
        try:
            wait_stopped(sim.pid)  # kill() only queues the stop: a busy box may delay it
            for i, sock in enumerate(socks):
                sock.sendall(post(i))
        finally:
            os.kill(sim.pid, signal.SIGCONT)
        for sock in socks:
            reply = b""
            while not reply.endswith(b"0\r\n\r\n"):
                data = sock.recv(65536)
                assert data, "the simulator closed the connection mid-response"
                reply += data
            sock.close()
    records = [json.loads(line) for line in trace_file.read_bytes().splitlines()]
    requests = [r for r in records if r.get("type") == "request"]
    assert len(requests) == 20
    first_handled = min(r["handled_ns"] for r in requests)
    assert all(r["received_ns"] <= r["handled_ns"] for r in requests)
    assert max(r["received_ns"] for r in requests) < first_handled


def test_a_client_trickling_a_request_keeps_the_simulators_read_stamps_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request sent one byte per read: at most READ_STAMPS stamps are kept while it
    arrives, and it carries the stamp of the read that brought its last byte."""
    clock = [0]
    monkeypatch.setattr(protocol, "perf_counter_ns", lambda: clock[0])
    (conn,), handled = sim_connections(1, None)
    request = post(7)
    for i, byte in enumerate(request):
        clock[0] = 1000 + i
        conn.data_received(bytes([byte]))
        assert len(conn._reads) <= protocol.READ_STAMPS
    assert [r for r, _ in handled] == [1000 + len(request) - 1]
