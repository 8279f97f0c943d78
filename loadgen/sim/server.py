"""The simulator's I/O edge: drives the pure engine on the event loop and speaks HTTP.

`Scheduler` maps the engine's simulated nanoseconds onto `time.perf_counter_ns()`
(real = t0 + simulated / speed) and wakes at each step's *intended* end, an absolute
deadline, so timer error never accumulates: a timer is armed up to `spin_ns` early and
the last stretch is busy-waited (the event loop's timers are millisecond-grained).
`SimServer` routes each request by path to its dialect (`dialects.routes`) and hands it to
an `Exchange` (`exchange.py`), which turns engine tokens into that dialect's bytes and
applies the request's `FaultPlan`. `serve` runs until SIGINT/SIGTERM, then ends every open
request in the trace (outcome `shutdown`) and flushes it.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from loadgen import __version__
from loadgen.errors import ConfigError
from loadgen.sim.config import SimConfig, format_decode_table
from loadgen.sim.dialects import Api, error_body_for, routes
from loadgen.sim.engine import NS_PER_S, SeqRequest, StepModel, StepResult, build_engine
from loadgen.sim.exchange import Exchange
from loadgen.sim.faults import BadFaultHeader, plan_faults
from loadgen.sim.metrics import SimCounters, exposition
from loadgen.sim.prefix import PrefixCache, prompt_words
from loadgen.sim.protocol import Connection, HttpRequest, Inbox
from loadgen.sim.trace import NullTrace, TraceWriter
from loadgen.sim.wire import BadRequest, output_length, reasoning_tokens

if TYPE_CHECKING:
    from loadgen.sim.spans import SpanExporter

perf_counter_ns = time.perf_counter_ns
SPIN_NS = 1_000_000  # the event loop's timer grain; busy-wait at most this long per step
DELIVER_SLICE = 64  # tokens written per loop iteration (~1.5 ms) before reads get a turn
METRICS_PATH = "/metrics"
RESET_PATH = "/reset_prefix_cache"  # empties the prefix cache (vLLM's endpoint)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus text format


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
        self.engine = build_engine(config.engine)
        self.scheduler = Scheduler(loop, self.engine, self.clock, self._deliver)
        self.counters = SimCounters()
        self.prefix_cache = (
            PrefixCache(config.prefix_cache_tokens, config.prefix_block_tokens)
            if config.prefix_cache_tokens > 0
            else None
        )
        self.exchanges: dict[int, Exchange] = {}
        self.spans: SpanExporter | None = None  # `--otlp-traces-endpoint`
        self.connections: set[Connection] = set()
        self._ids = itertools.count(1)
        self.routes = routes(config.api)
        self._gets = _get_bodies(self.model)
        # Finished steps whose tokens are not all written yet: (step, when it was due, how
        # many of its tokens are written); `_writing` while a slice is scheduled.
        self._outbox: collections.deque[tuple[StepResult, int, int]] = collections.deque()
        self._writing = False

    def handle(self, conn: Connection, http: HttpRequest) -> None:
        """Route one request (the `Connection` handler)."""
        api = self.routes.get(http.path)
        keep_alive = http.keep_alive
        if api is not None and http.method == "POST":
            self._generate(conn, http, api)
        elif http.path in self._gets and http.method == "GET":
            conn.send_simple(200, self._gets[http.path], keep_alive=keep_alive)
        elif http.path == METRICS_PATH and http.method == "GET":
            body = self.metrics()
            conn.send_simple(200, body, keep_alive=keep_alive, content_type=METRICS_TYPE)
        elif http.path == RESET_PATH and http.method == "POST":  # vLLM's, as vLLM answers
            dropped = self.prefix_cache.clear() if self.prefix_cache is not None else 0
            conn.send_simple(200, orjson.dumps({"dropped_blocks": dropped}), keep_alive=keep_alive)
        elif api is not None or http.path in self._gets:
            method = "POST" if api is not None else "GET"
            message = f"{http.path} accepts {method}, not {http.method}"
            body = error_body_for(http.path)(405, message)
            conn.send_simple(405, body, keep_alive=keep_alive)
        else:
            served = ", ".join(sorted(p for p in self.routes if p != "/"))
            message = f"unknown path {http.path} (this simulator serves POST {served})"
            conn.send_simple(404, error_body_for(http.path)(404, message), keep_alive=keep_alive)

    def metrics(self) -> bytes:
        """The `/metrics` exposition: the engine's state now and the counters so far."""
        cache = self.prefix_cache
        return exposition(
            self.engine.state(),
            self.counters,
            kv_capacity_tokens=self.config.kv_capacity_tokens,
            cache_queries=cache.queries_tokens if cache is not None else 0,
            cache_hits=cache.hits_tokens if cache is not None else 0,
            model=self.model,
        )

    def prefix_lookup(
        self, body: bytes, prompt_tokens: int
    ) -> tuple[int | None, list[str], list[int]]:
        """(cached tokens, prompt words, block keys) of a request; without a prefix cache
        (None, [], []): the responses then say nothing of cached tokens, as vLLM's do."""
        cache = self.prefix_cache
        if cache is None:
            return None, [], []
        words = prompt_words(body)
        keys = cache.keys(words)
        return cache.lookup(keys, prompt_tokens), words, keys

    def cache_answer(self, words: list[str]) -> None:
        """A stream finished: its prompt and answer are in the KV cache, so a next turn that
        repeats them (chat history) hits them."""
        if self.prefix_cache is not None and words:
            self.prefix_cache.insert(self.prefix_cache.keys(words))

    def on_first_token(self, prompt_tokens: int, keys: list[int], received_ns: int) -> None:
        """A request's prefill finished: count its prompt, cache its blocks, time its TTFT."""
        counters = self.counters
        counters.prompt_tokens += prompt_tokens
        counters.ttft.observe((perf_counter_ns() - received_ns) * self.clock.speed / NS_PER_S)
        if self.prefix_cache is not None:
            self.prefix_cache.insert(keys)

    def _generate(self, conn: Connection, http: HttpRequest, api: Api) -> None:
        handled_ns = perf_counter_ns()
        received_ns = http.received_ns or handled_ns  # read off its socket (see protocol.py)
        seq_id = next(self._ids)
        config = self.config
        try:
            request = api.parse(http.body)
            tokens, finish_reason = output_length(request, config.output_dist, self.rng)
            dialect = config.dialect
            if request.reasoning_fraction > 0:  # asked for in the body; a header still wins
                dialect = replace(dialect, reasoning_tokens=reasoning_tokens(request, tokens))
            plan = plan_faults(http.headers, dialect, config.faults, self.rng, tokens)
            if plan.stop_after is not None and plan.stop_after < tokens:
                tokens, finish_reason = plan.stop_after, "stop"  # stops early, length forced or not
        except (BadRequest, BadFaultHeader) as exc:
            record = _bad_request_record(seq_id, http, received_ns, str(exc))
            self.trace.write({**record, "api": api.name, "handled_ns": handled_ns})
            body = api.error_body(400, str(exc))
            conn.send_simple(400, body, keep_alive=http.keep_alive)
            return
        exchange = Exchange(
            self,
            conn,
            http,
            api,
            request,
            plan,
            seq_id=seq_id,
            tokens=tokens,
            finish_reason=finish_reason,
            received_ns=received_ns,
        )
        exchange.record["handled_ns"] = handled_ns
        exchange.start()

    def _deliver(self, step: StepResult, actual_ns: int) -> None:
        """Write one finished step's tokens, then record the step's timing.

        Written `DELIVER_SLICE` tokens per loop iteration, the first slice at once: between
        slices the loop reads what arrived meanwhile. At 512 streams a step's writes take
        ~13 ms (one `send` each); written in one go, a request arriving during them was read
        only after the last, its receive stamp (and so this server's own TTFT) late by up to
        that, as no real server's API front end is (vLLM's reads and streams requests in
        separate tasks). Every token's write is still stamped as it is written.
        """
        self.counters.generation_tokens += len(step.emitted)
        self._outbox.append((step, actual_ns, 0))
        if not self._writing:
            self._writing = True
            self._write_slice()

    def _write_slice(self) -> None:
        """Write up to `DELIVER_SLICE` queued tokens, steps in order; re-arm while any remain."""
        budget = DELIVER_SLICE
        exchanges, outbox, itl = self.exchanges, self._outbox, self.counters.itl
        while outbox and budget > 0:
            step, actual_ns, start = outbox[0]
            emitted, at_ns = step.emitted, step.end_ns
            if start == 0:
                for seq_id, queued_ns, scheduled_ns in step.first:  # one per request, not token
                    if (exchange := exchanges.get(seq_id)) is not None:
                        exchange.engine_start = (queued_ns, scheduled_ns)
            end = min(len(emitted), start + budget)
            for seq_id in emitted[start:end]:
                exchange = exchanges.get(seq_id)
                if exchange is not None:
                    last = exchange.last_token_sim_ns
                    if last is not None:  # vLLM's inter-token latency: engine time between
                        itl.observe((at_ns - last) / NS_PER_S)  # a request's two iterations
                    exchange.last_token_sim_ns = at_ns
                    exchange.on_token()
            budget -= end - start
            if end < len(emitted):
                outbox[0] = (step, actual_ns, end)
                break
            outbox.popleft()
            self.trace.write(
                {
                    "type": "step",
                    "pool": step.pool,
                    "intended_ns": self.clock.real_ns(step.end_ns),
                    "actual_ns": actual_ns,
                    "written_ns": perf_counter_ns(),
                    "batch": step.decode_batch,
                    "prefill_tokens": step.prefill_tokens,
                    "emitted": len(emitted),
                }
            )
        if outbox:
            self.loop.call_soon(self._write_slice)
        else:
            self._writing = False

    def shutdown(self) -> None:
        """End every open request (recorded as `shutdown`) and close every connection."""
        for exchange in list(self.exchanges.values()):
            exchange.shutdown()
        for conn in list(self.connections):
            conn.close()


def _get_bodies(model: str) -> dict[str, bytes]:
    """GET path → body: health, and each dialect's model listing or server info."""
    created = int(time.time())
    openai_model = {"id": model, "object": "model", "created": created, "owned_by": "loadgen"}
    ollama_model = {"name": model, "model": model, "size": 0, "digest": "sim", "details": {}}
    tgi_info = {"model_id": model, "version": __version__, "max_input_tokens": 1_000_000}
    return {
        "/health": b'{"status":"ok"}',
        "/v1/models": orjson.dumps({"object": "list", "data": [openai_model]}),
        "/api/tags": orjson.dumps({"models": [ollama_model]}),
        "/api/version": orjson.dumps({"version": __version__}),
        "/info": orjson.dumps(tgi_info),
    }


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
        f"api {config.api}; "
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
    if config.otlp_traces_endpoint is not None:
        app.spans = _span_exporter(config)
    trace.write(_start_record(config, app.clock))
    inbox = Inbox()
    server = await loop.create_server(
        lambda: Connection(app.handle, app.connections, inbox),
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
        if app.spans is not None:
            app.spans.close()


def _span_exporter(config: SimConfig) -> SpanExporter:
    """The exporter of `--otlp-traces-endpoint` (a ConfigError without its package)."""
    try:
        from loadgen.sim.spans import SpanExporter  # defers opentelemetry-proto (an extra)
    except ImportError:
        raise ConfigError("command line", "--otlp-traces-endpoint",
                          "needs the opentelemetry-proto package",
                          "pip install 'loadgen[spans]'") from None  # fmt: skip
    assert config.otlp_traces_endpoint is not None
    try:
        return SpanExporter(config.otlp_traces_endpoint, service=config.model, speed=config.speed)
    except ValueError as exc:
        raise ConfigError("command line", "--otlp-traces-endpoint", str(exc),
                          "give http://HOST:PORT/v1/traces") from None  # fmt: skip


def _start_record(config: SimConfig, clock: SimClock) -> dict[str, Any]:
    engine = config.engine
    return {
        "type": "sim",
        "version": __version__,
        "pid": os.getpid(),
        "t0_ns": clock.t0_ns,
        "speed": config.speed,
        "prefill_tokens_per_s": engine.prefill_tokens_per_s,
        "decode_table": format_decode_table(engine.decode_table),
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
