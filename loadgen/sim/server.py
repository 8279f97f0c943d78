"""The simulator's I/O edge: drives the pure engine on the event loop and speaks HTTP.

`Scheduler` maps the engine's simulated nanoseconds onto `time.perf_counter_ns()`
(real = t0 + simulated / speed) and wakes at each step's *intended* end, an absolute
deadline, so timer error never accumulates: a timer is armed up to `spin_ns` early and
the last stretch is busy-waited (the event loop's timers are millisecond-grained).
Each `Exchange` turns one completion request into engine work and engine tokens into
bytes, applying its `FaultPlan`. `serve` runs until SIGINT/SIGTERM, then ends every open
request in the trace (outcome `shutdown`) and flushes it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from loadgen import __version__
from loadgen.sim.config import SimConfig, format_decode_table
from loadgen.sim.engine import NS_PER_S, SeqRequest, StepModel, StepResult, build_engine
from loadgen.sim.faults import BadFaultHeader, FaultPlan, plan_faults
from loadgen.sim.openai import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DONE_EVENT,
    PING_EVENT,
    BadRequest,
    CompletionRequest,
    EventFormat,
    error_body,
    frame,
    full_response,
    output_length,
    parse_completion,
    usage,
)
from loadgen.sim.protocol import Connection, ExchangeLike, HttpRequest
from loadgen.sim.trace import NullTrace, TraceWriter

perf_counter_ns = time.perf_counter_ns
SPIN_NS = 1_000_000  # the event loop's timer grain; busy-wait at most this long per step


class SimClock:
    """Simulated time ↔ monotonic time: real_ns = t0_ns + sim_ns / speed."""

    def __init__(self, speed: float) -> None:
        self.speed = speed
        self.t0_ns = perf_counter_ns()

    def sim_ns(self, real_ns: int) -> int:
        """Simulated nanoseconds at monotonic time `real_ns`."""
        return int((real_ns - self.t0_ns) * self.speed)

    def real_ns(self, sim_ns: int) -> int:
        """Monotonic time of simulated instant `sim_ns` (rounded up)."""
        return self.t0_ns + math.ceil(sim_ns / self.speed)

    def real_s(self, sim_s: float) -> float:
        """Real seconds lasting `sim_s` simulated seconds."""
        return sim_s / self.speed


Deliver = Callable[[StepResult, int], None]


class Scheduler:
    """Sleeps until each engine event's intended time, then delivers finished steps."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        engine: StepModel,
        clock: SimClock,
        deliver: Deliver,
    ) -> None:
        self._loop = loop
        self._engine = engine
        self._clock = clock
        self._deliver = deliver
        self._spin_ns = min(SPIN_NS, int(SPIN_NS / clock.speed))
        self._timer: asyncio.TimerHandle | None = None
        self._target_sim: int | None = None

    def submit(self, request: SeqRequest) -> bool:
        """Queue a request arriving now; False when the queue cap refuses it."""
        accepted = self._engine.submit(request, self._clock.sim_ns(perf_counter_ns()))
        if accepted:
            self.reschedule()
        return accepted

    def cancel(self, seq_id: int) -> None:
        """Abort a sequence; a timer that finds nothing to do just re-arms."""
        self._engine.cancel(seq_id)

    def reschedule(self) -> None:
        """Arm the timer for the engine's next event, unless an earlier one is armed."""
        event_sim = self._engine.next_event_ns()
        if event_sim is None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._target_sim = None
            return
        if self._target_sim is not None and self._target_sim <= event_sim:
            return
        self._arm(event_sim)

    def _arm(self, event_sim: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._target_sim = event_sim
        delay_ns = self._clock.real_ns(event_sim) - self._spin_ns - perf_counter_ns()
        self._timer = self._loop.call_later(max(delay_ns, 0) / NS_PER_S, self._fire)

    def _fire(self) -> None:
        """Timer callback: re-arm if woken early, spin to the deadline, then deliver."""
        self._timer = None
        target_sim = self._target_sim
        if target_sim is None:
            return
        target_real = self._clock.real_ns(target_sim)
        now = perf_counter_ns()
        if target_real - now > self._spin_ns:
            self._arm(target_sim)
            return
        while now < target_real:
            now = perf_counter_ns()
        self._target_sim = None
        for step in self._engine.advance(max(self._clock.sim_ns(now), target_sim)):
            self._deliver(step, now)
        self.reschedule()


class Exchange(ExchangeLike):
    """One completion request from accept to its last byte (or its failure)."""

    def __init__(
        self,
        server: SimServer,
        conn: Connection,
        http: HttpRequest,
        request: CompletionRequest,
        plan: FaultPlan,
        *,
        seq_id: int,
        tokens: int,
        finish_reason: str,
        received_ns: int,
    ) -> None:
        self._server = server
        self._conn = conn
        self._http = http
        self._request = request
        self._plan = plan
        self._dialect = plan.dialect
        self._seq_id = seq_id
        self._tokens = tokens
        self._finish_reason = finish_reason
        self._emitted = 0
        self._pending_from = 1  # first token not yet written (coalescing)
        self._slow_at = 1 if request.stream else 0  # tokens >= this take the slow path
        self._live = True
        self._timer: asyncio.TimerHandle | None = None
        self._chunk_ns: list[int] = []
        self._created = int(time.time())
        self._response_id = f"{'chatcmpl' if request.is_chat else 'cmpl'}-sim{seq_id}"
        self._format = EventFormat(
            is_chat=request.is_chat,
            response_id=self._response_id,
            created=self._created,
            model=server.model,
        )
        self._token_event = self._format.token
        self._token_frame = self._format.token_frame
        self.record: dict[str, Any] = {
            "type": "request",
            "id": seq_id,
            "x_request_id": http.headers.get("x-request-id"),
            "path": http.path,
            "stream": request.stream,
            "received_ns": received_ns,
            "first_token_ns": None,
            "done_ns": None,
            "chunk_ns": self._chunk_ns,
            "status": 200,
            "outcome": "ok",
            "prompt_tokens": request.prompt_tokens,
            "output_tokens": 0,
            "fault": plan.applied or None,
        }

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Answer a status fault at once, or (after any header delay) enter the engine."""
        self._server.exchanges[self._seq_id] = self
        if self._plan.status is not None:
            self._fail(self._plan.status, "simulated failure (fault injection)", "fault_status")
            return
        self._conn.exchange = self
        if self._plan.header_delay_s > 0:
            delay_s = self._server.clock.real_s(self._plan.header_delay_s)
            self._timer = self._server.loop.call_later(delay_s, self._enter)
            return
        self._enter()

    def _enter(self) -> None:
        self._timer = None
        plan = self._plan
        seq = SeqRequest(
            seq_id=self._seq_id,
            prompt_tokens=self._request.prompt_tokens,
            output_tokens=self._tokens,
            priority=self._request.priority,
            stall_after_tokens=plan.stall_after,
            stall_ns=round(plan.stall_s * NS_PER_S),
        )
        if not self._server.scheduler.submit(seq):
            self._fail(429, "the simulator's admission queue is full", "rejected")
            return
        if plan.drop_after == 0 and not self._request.stream:
            self._drop()
        elif plan.garbage_after == 0 and not self._request.stream:
            self._garbage()
        elif self._request.stream:
            self._open_stream()

    def _open_stream(self) -> None:
        dialect = self._dialect
        keep_alive = self._http.keep_alive and not dialect.close_after_stream
        self._conn.start_stream(keep_alive=keep_alive)
        if dialect.role == "early" and self._request.is_chat:
            self._conn.write(frame(self._format.role()))
        if dialect.heartbeat_s > 0:
            self._beat()
        if self._plan.drop_after == 0:
            self._drop()
        elif self._plan.garbage_after == 0:
            self._garbage()

    def _beat(self, *, send: bool = False) -> None:
        if not self._live:
            return
        if send:
            self._conn.write(frame(PING_EVENT))
        delay_s = self._server.clock.real_s(self._dialect.heartbeat_s)
        self._timer = self._server.loop.call_later(delay_s, self._heartbeat)

    def _heartbeat(self) -> None:
        self._beat(send=True)

    def on_connection_lost(self) -> None:
        """The client went away: free the engine slot and record it."""
        if self._live:
            self._server.scheduler.cancel(self._seq_id)
            self._end("client_closed")

    def shutdown(self) -> None:
        """The server is stopping: record the request as cut short."""
        if self._live:
            self._end("shutdown")
            self._conn.close()

    def _end(self, outcome: str, status: int = 200) -> None:
        self._live = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._server.exchanges.pop(self._seq_id, None)
        record = self.record
        record["done_ns"] = perf_counter_ns()
        record["outcome"] = outcome
        record["status"] = status
        record["output_tokens"] = self._emitted
        self._server.trace.write(record)

    def _fail(self, status: int, message: str, outcome: str) -> None:
        self._end(outcome, status)
        extra = [("retry-after", "1")] if status == 429 else []
        self._conn.send_simple(
            status,
            error_body(status, message),
            keep_alive=self._http.keep_alive,
            extra_headers=extra,
        )

    def _drop(self) -> None:
        self._server.scheduler.cancel(self._seq_id)
        self._end("dropped")
        self._conn.close()

    def _garbage(self) -> None:
        self._server.scheduler.cancel(self._seq_id)
        self._end("garbage")
        junk = b"data: {not json\n\n" + self._server.rng.randbytes(24) + b"\n\n"
        if self._request.stream:
            self._conn.end_stream(frame(junk))
        else:
            self._conn.send_simple(200, junk, keep_alive=False)

    # -- tokens ----------------------------------------------------------------------

    def on_token(self) -> None:
        """The engine emitted this request's next token (the per-token hot path)."""
        n = self._emitted = self._emitted + 1
        if n < self._slow_at:
            self._conn.write(self._token_frame(n))
            self._chunk_ns.append(perf_counter_ns())
            return
        if self._request.stream:
            self._stream_token(n)
        else:
            self._plain_token(n)

    def _stream_token(self, n: int) -> None:
        """Slow path: first token, coalescing, reasoning, faults and the end."""
        plan, dialect = self._plan, self._dialect
        if dialect.tokens_per_chunk == 1:
            self._pending_from = n  # the fast path wrote every earlier token singly
        parts: list[bytes] = []
        if n == 1:
            self.record["first_token_ns"] = perf_counter_ns()
            if dialect.role == "first" and self._request.is_chat:
                parts.append(frame(self._format.role()))
        at_boundary = n in (self._tokens, plan.drop_after, plan.garbage_after)
        pending = n - self._pending_from + 1
        if pending >= dialect.tokens_per_chunk or at_boundary or n == dialect.reasoning_tokens:
            parts.append(frame(self._content_event(self._pending_from, n)))
            self._pending_from = n + 1
            content = True
        else:
            content = False
        if parts:
            self._conn.write(b"".join(parts))
            if content:
                self._chunk_ns.append(perf_counter_ns())
        if n == plan.drop_after:
            self._drop()
        elif n == plan.garbage_after:
            self._garbage()
        elif n >= self._tokens:
            self._finish_stream()
        else:
            self._slow_at = self._next_slow(n)

    def _content_event(self, first: int, last: int) -> bytes:
        reasoning = first <= self._dialect.reasoning_tokens
        if first == last and not reasoning:
            return self._token_event(first)
        return self._format.text(range(first, last + 1), reasoning=reasoning)

    def _next_slow(self, n: int) -> int:
        """The next token index that needs the slow path."""
        dialect = self._dialect
        if dialect.tokens_per_chunk > 1 or n < dialect.reasoning_tokens:
            return n + 1
        marks = [self._plan.drop_after, self._plan.garbage_after]
        return min([self._tokens, *(k for k in marks if k is not None and k > n)])

    def _finish_stream(self) -> None:
        dialect = self._dialect
        usage_obj = usage(self._request.prompt_tokens, self._tokens)
        finish_usage = usage_obj if dialect.usage_in_finish else None
        parts = [frame(self._format.finish(self._finish_reason, finish_usage))]
        if self._request.include_usage and not dialect.usage_in_finish:
            parts.append(frame(self._format.usage(usage_obj)))
        if not dialect.no_done:
            parts.append(frame(DONE_EVENT))
        self._end("ok")
        self._conn.end_stream(b"".join(parts))

    def _plain_token(self, n: int) -> None:
        """Non-streaming: count tokens; answer (or fail) when the plan says so."""
        if n == 1:
            self.record["first_token_ns"] = perf_counter_ns()
        if n == self._plan.drop_after:
            self._drop()
        elif n == self._plan.garbage_after:
            self._garbage()
        elif n >= self._tokens:
            body = full_response(
                self._request,
                response_id=self._response_id,
                created=self._created,
                model=self._server.model,
                tokens=self._tokens,
                reasoning_tokens=self._dialect.reasoning_tokens,
                finish_reason=self._finish_reason,
            )
            self._end("ok")
            keep_alive = self._http.keep_alive and not self._dialect.close_after_stream
            self._conn.send_simple(200, body, keep_alive=keep_alive)


class SimServer:
    """Routes requests, owns the engine driver, the random stream and the trace."""

    def __init__(
        self,
        config: SimConfig,
        loop: asyncio.AbstractEventLoop,
        trace: TraceWriter | NullTrace,
    ) -> None:
        self.config = config
        self.loop = loop
        self.trace = trace
        self.model = config.model
        self.rng = random.Random(config.seed)
        self.clock = SimClock(config.speed)
        self.scheduler = Scheduler(loop, build_engine(config.engine), self.clock, self._deliver)
        self.exchanges: dict[int, Exchange] = {}
        self.connections: set[Connection] = set()
        self._ids = itertools.count(1)
        created = int(time.time())
        self._models_body = orjson.dumps(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": created, "owned_by": "loadgen"}
                ],
            }
        )

    def handle(self, conn: Connection, http: HttpRequest) -> None:
        """Route one request (the `Connection` handler)."""
        routes = {
            "/health": "GET",
            "/v1/models": "GET",
            CHAT_PATH: "POST",
            COMPLETIONS_PATH: "POST",
        }
        method = routes.get(http.path)
        keep_alive = http.keep_alive
        if method is None:
            message = f"unknown path {http.path}"
            conn.send_simple(404, error_body(404, message), keep_alive=keep_alive)
        elif http.method != method:
            message = f"{http.path} accepts {method}, not {http.method}"
            conn.send_simple(405, error_body(405, message), keep_alive=keep_alive)
        elif http.path == "/health":
            conn.send_simple(200, b'{"status":"ok"}', keep_alive=keep_alive)
        elif http.path == "/v1/models":
            conn.send_simple(200, self._models_body, keep_alive=keep_alive)
        else:
            self._completion(conn, http)

    def _completion(self, conn: Connection, http: HttpRequest) -> None:
        received_ns = perf_counter_ns()
        seq_id = next(self._ids)
        try:
            request = parse_completion(http.body, is_chat=http.path == CHAT_PATH)
            tokens, finish_reason = output_length(request, self.config.output_dist, self.rng)
            config = self.config
            plan = plan_faults(http.headers, config.dialect, config.faults, self.rng, tokens)
        except (BadRequest, BadFaultHeader) as exc:
            self.trace.write(_bad_request_record(seq_id, http, received_ns, str(exc)))
            conn.send_simple(400, error_body(400, str(exc)), keep_alive=http.keep_alive)
            return
        exchange = Exchange(
            self,
            conn,
            http,
            request,
            plan,
            seq_id=seq_id,
            tokens=tokens,
            finish_reason=finish_reason,
            received_ns=received_ns,
        )
        exchange.start()

    def _deliver(self, step: StepResult, actual_ns: int) -> None:
        """Write one finished step's tokens, then record the step's timing."""
        exchanges = self.exchanges
        for seq_id in step.emitted:
            exchange = exchanges.get(seq_id)
            if exchange is not None:
                exchange.on_token()
        self.trace.write(
            {
                "type": "step",
                "pool": step.pool,
                "intended_ns": self.clock.real_ns(step.end_ns),
                "actual_ns": actual_ns,
                "written_ns": perf_counter_ns(),
                "batch": step.decode_batch,
                "prefill_tokens": step.prefill_tokens,
                "emitted": len(step.emitted),
            }
        )

    def shutdown(self) -> None:
        """End every open request (recorded as `shutdown`) and close every connection."""
        for exchange in list(self.exchanges.values()):
            exchange.shutdown()
        for conn in list(self.connections):
            conn.close()


def _bad_request_record(
    seq_id: int, http: HttpRequest, received_ns: int, message: str
) -> dict[str, Any]:
    return {
        "type": "request",
        "id": seq_id,
        "x_request_id": http.headers.get("x-request-id"),
        "path": http.path,
        "stream": None,
        "received_ns": received_ns,
        "first_token_ns": None,
        "done_ns": perf_counter_ns(),
        "chunk_ns": [],
        "status": 400,
        "outcome": "bad_request",
        "prompt_tokens": None,
        "output_tokens": 0,
        "fault": None,
        "error": message,
    }


def describe(config: SimConfig) -> str:
    """A one-paragraph summary of the physics, for stderr at startup."""
    engine = config.engine
    chunk = f"{engine.chunk_tokens} tokens/step" if engine.chunk_tokens else "off (whole prompts)"
    pool = (
        f"; disaggregated: {engine.prefill_replicas} prefill replicas, "
        f"KV transfer {engine.kv_transfer_ms:g} ms"
        if engine.prefill_replicas
        else ""
    )
    faults = ", ".join(f"{n}={p:g}" for n, p in config.faults.probabilities) or "none"
    dist = config.output_dist
    return (
        f"loadgen sim {__version__}: prefill {engine.prefill_tokens_per_s:g} tok/s; "
        f"decode step ms by batch {format_decode_table(engine.decode_table)}; "
        f"max batch {engine.max_batch}; chunked prefill {chunk}; "
        f"queue cap {engine.queue_cap or 'none'}{pool}; speed {config.speed:g}x; "
        f"output {dist.kind} mean {dist.mean_tokens:g}; faults {faults}; seed {config.seed}; "
        f"trace {config.trace_file or '-'}"
    )


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(config: SimConfig) -> None:
    """Listen until SIGINT/SIGTERM; print the listening line; flush the trace on exit."""
    loop = asyncio.get_running_loop()
    trace: TraceWriter | NullTrace = NullTrace()
    if config.trace_file is not None:
        trace = TraceWriter(config.trace_file, loop)
    app = SimServer(config, loop, trace)
    trace.write(_start_record(config, app.clock))
    server = await loop.create_server(
        lambda: Connection(app.handle, app.connections),
        config.host,
        config.port,
        backlog=4096,
        reuse_address=True,
    )
    host, port = server.sockets[0].getsockname()[:2]
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(describe(config), file=sys.stderr, flush=True)
    print(f"loadgen sim listening on {_url(host, port)}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        app.shutdown()
        trace.close()


def _start_record(config: SimConfig, clock: SimClock) -> dict[str, Any]:
    engine = config.engine
    return {
        "type": "sim",
        "version": __version__,
        "pid": os.getpid(),
        "t0_ns": clock.t0_ns,
        "speed": config.speed,
        "prefill_tokens_per_s": engine.prefill_tokens_per_s,
        "decode_step_ms": format_decode_table(engine.decode_table),
        "max_batch": engine.max_batch,
        "chunk_tokens": engine.chunk_tokens,
        "queue_cap": engine.queue_cap,
        "prefill_replicas": engine.prefill_replicas,
        "kv_transfer_ms": engine.kv_transfer_ms,
        "seed": config.seed,
    }


def run(config: SimConfig) -> None:
    """Run `serve` on uvloop when importable (it is faster), else on plain asyncio."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(config))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(config))
