"""The engine's scheduler: sends every plan at its intended time, one record per plan.

Fourth stage (plans → engine → records). Open loop: a scheduler sleeps until each plan's
intended time and starts its request; it never waits for a response, so a slow or hung
server cannot delay the next send. With `max_in_flight`, started requests wait for a slot,
and that wait is charged to them (TTFT is measured from the intended time: no coordinated
omission). Every plan yields exactly one `RequestRecord`, whatever happened: failures are
mapped to an `Outcome` in one place (`Exchange.finish`, in `exchange`), never raised.

Three layers: this scheduler (`Engine`: sends, in-flight cap, live stats, the records);
the flows (`flows`: sessions, batches; `agents`: growing trajectories), which see the
engine only through `flows.Sender`; and one request's `exchange`, the per-chunk path.
Each request's bytes are made ahead of its send by `encoding.RequestEncoder`.

Per-request deadlines (from the intended time): no generated token by `first_token_s`,
a gap between tokens longer than `stall_s`, not done by `total_s`. They are loop timers
(`call_later`), not a task per request, so the per-chunk path stays a callback; and they
are not read timeouts, so no server behaviour (a byte a second, heartbeats) stretches them.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from loadgen.adapters.protocol import Message
from loadgen.adapters.sse import DEFAULT_MAX_EVENT_BYTES
from loadgen.analysis.histograms import LatencyHistogram
from loadgen.engine.agents import Trajectory
from loadgen.engine.encoding import EngineConfig, RequestEncoder
from loadgen.engine.exchange import Exchange
from loadgen.engine.flows import Started, batch, conversation
from loadgen.engine.logs import LOGGER
from loadgen.engine.starts import Starts
from loadgen.engine.transport import Connector, Link, connect_failure
from loadgen.results.records import Outcome, RequestRecord
from loadgen.workload.plans import Flow, RequestPlan, Work, singles_of
from loadgen.workload.prompts import PromptMaker

__all__ = ["Engine", "EngineConfig", "LiveStats"]  # EngineConfig: re-exported (its importers)

# Requests are encoded this far ahead of their due time (at most this many), so a burst of
# sends due together is a run of `send` calls, not of prompt and JSON building.
ENCODE_AHEAD_NS = 50_000_000
ENCODE_AHEAD_MAX = 4096
ENCODE_AHEAD_BYTES = 64 * 1024 * 1024  # and at most this much request text (long prompts)
# The client's own limits, not the server's failures: too many open files (process or
# system), no free local port, no buffer memory. They make the run invalid (exit 3).
CLIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.EADDRNOTAVAIL, errno.ENOBUFS})


@dataclass(slots=True)
class LiveStats:
    """Counters and a TTFT histogram for the progress line (updated as records land)."""

    planned: int = 0
    sent: int = 0
    in_flight: int = 0
    ok: int = 0
    failed: int = 0
    retries: int = 0
    ttft: LatencyHistogram = field(default_factory=LatencyHistogram)
    in_flight_by_class: dict[str, int] = field(default_factory=dict)  # the live exporters' gauge
    last_progress_ns: int = 0  # the last send or completion (the watchdog reads it)


class Ahead:
    """The scheduler's requests made ahead of their due time: singles, and batch flows'
    first waves, up to `ENCODE_AHEAD_NS` ahead, `ENCODE_AHEAD_MAX` starts and
    `ENCODE_AHEAD_BYTES` of request text."""

    def __init__(self, engine: Engine, starts: Sequence[tuple[int, int, int]]) -> None:
        self.engine = engine
        self.starts = starts
        self.next = 0  # starts[:next] are made (or were sent)
        self.held = 0  # bytes of the requests made and not yet sent
        self.singles: dict[int, tuple[Exchange, bytes]] = {}
        self.waves: dict[int, list[tuple[Exchange, bytes]]] = {}

    def fill(self, first: int, due_ns: int) -> None:
        """Make the starts due by `due_ns` + the horizon; stop once `due_ns` has come."""
        engine, starts, t0 = self.engine, self.starts, self.engine.t0_ns
        horizon_ns = due_ns + ENCODE_AHEAD_NS
        while (
            self.next < len(starts)
            and t0 + starts[self.next][0] <= horizon_ns
            and self.next - first < ENCODE_AHEAD_MAX
            and self.held < ENCODE_AHEAD_BYTES
        ):
            _, is_flow, index = starts[self.next]
            if not is_flow:
                self.singles[index] = made = engine.prepare(engine.work.singles[index])
                self.held += len(made[1])
            elif (flow := engine.work.flows[index]).kind == "batch":
                wave = [engine.prepare(p) for p in flow.plans[: flow.concurrency]]
                self.waves[index] = wave
                self.held += sum(len(request) for _, request in wave)
            self.next += 1
            if self.next % 16 == 0 and engine.now_ns() >= due_ns:
                return  # due already: send what is made, make the rest as it goes

    def take_single(self, index: int) -> tuple[Exchange, bytes]:
        made = self.singles.pop(index, None)
        if made is None:
            return self.engine.prepare(self.engine.work.singles[index])
        self.held -= len(made[1])
        return made

    def take_wave(self, index: int) -> list[tuple[Exchange, bytes]]:
        """A batch flow's first wave ([] for other flows, or when it was not made ahead)."""
        wave = self.waves.pop(index, [])
        self.held -= sum(len(request) for _, request in wave)
        return wave

    def passed(self, index: int) -> None:
        """Starts before `index` were sent: never make them again."""
        self.next = max(self.next, index)


class Engine:
    """Runs planned work through one connector and emits exactly one record per plan.

    Every time it takes is on the connector's clock, the one its connections stamp reads on.
    """

    def __init__(
        self,
        work: Work | Sequence[RequestPlan],
        connector: Connector,
        config: EngineConfig,
        on_record: Callable[[RequestRecord], None],
        stats: LiveStats | None = None,
    ) -> None:
        self.work = work if isinstance(work, Work) else singles_of(work)
        self.plans = self.work.plans
        self.connector = connector
        self.clock = connector.clock
        self._now = connector.clock.now_ns
        self.config = config
        self.on_record = on_record
        self.stats = stats or LiveStats()
        self.stats.planned = len(self.plans)
        self.t0_ns = 0
        self._recorded = bytearray(max((p.request_id for p in self.plans), default=-1) + 1)
        self._limiter = anyio.Semaphore(config.max_in_flight) if config.max_in_flight else None
        self._stopping = anyio.Event()
        self.prompts = config.prompts or PromptMaker(config.seed)
        # N without usage, counted in the text when there is a tokenizer (target.tokenizer).
        self._count_tokens = self.prompts.count if self.prompts.tokenizer is not None else None
        self.sending = anyio.CancelScope()
        self.requests = anyio.CancelScope()
        self.next_due_ns: int | None = None  # the scheduler's next send; None when all are out
        self._live: dict[int, Exchange] = {}  # started, not yet recorded, by request id
        self.encoder = RequestEncoder(config, self.prompts, connector.endpoint)

    def stop(self) -> None:
        """Stop sending (interrupt): no new request, turn or hop starts; in-flight ones go on."""
        self._stopping.set()
        self.sending.cancel()

    # -- flows.Sender: what a flow may ask of the engine ---------------------------------
    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def now_ns(self) -> int:
        return self._now()

    async def run(self, t0_ns: int) -> None:
        """Send every plan at t0 + its intended time; return when each has a record.

        After `stop()`, or when `requests` is cancelled, every plan that has no record yet
        was never sent and is recorded as not_sent: planned == recorded, always (one that
        was written but whose task never ran is recorded from its exchange, as cancelled).
        """
        self.t0_ns = t0_ns
        with self.requests:
            async with anyio.create_task_group() as tg:
                with self.sending:
                    await self._schedule(tg)
        for exchange in list(self._live.values()):
            self._settle_cancelled(exchange)
            self._emit(exchange.record())
        for plan in self.plans:
            if not self._recorded[plan.request_id]:
                self._emit(
                    self._unsent(plan, Outcome.NOT_SENT, "run stopped before this request was sent")
                )

    async def _schedule(self, tg: anyio.abc.TaskGroup) -> None:
        """Start singles and flows at their times, in one merged time order.

        Requests are made ahead of their due time (`Ahead`, while the scheduler would sleep
        anyway), and every start due by the time it wakes is sent in one pass: each single
        written on an idle (warm or kept-alive) connection straight away, stamped as it is
        written, before any task starts. A burst of sends costs a `send` call each, not a
        task start and a loop round each.
        """
        starts = sorted(
            [(p.intended_ns, 0, i) for i, p in enumerate(self.work.singles)]
            + [(f.start_ns, 1, i) for i, f in enumerate(self.work.flows)]
        )
        tasks = Starts(tg)  # each request's task, a slice per loop iteration
        try:
            await self._send_at_times(starts, tg, tasks)
        finally:
            await tasks.wait()  # shielded: every request written gets its task
        self.next_due_ns = None

    async def _send_at_times(
        self, starts: Sequence[tuple[int, int, int]], tg: anyio.abc.TaskGroup, tasks: Starts
    ) -> None:
        """The scheduler's loop: sleep to the next start, write every one due, hand their
        tasks to `tasks` (those that must connect first straight to `tg`)."""
        t0, flows = self.t0_ns, self.work.flows
        ahead = Ahead(self, starts)
        i, n = 0, len(starts)
        while i < n:
            self.next_due_ns = t0 + starts[i][0]
            ahead.fill(i, self.next_due_ns)
            await self._sleep_until(self.next_due_ns)
            now = self._now()
            end = i + 1
            while end < n and t0 + starts[end][0] <= now:
                end += 1
            launched: list[Started] = []
            started_flows: list[tuple[Flow, list[Started]]] = []
            for _, is_flow, index in starts[i:end]:  # the writes: no await, no task start
                if is_flow:
                    wave = [(e, r, self.start(e, r, now)) for e, r in ahead.take_wave(index)]
                    started_flows.append((flows[index], wave))
                else:
                    exchange, request = ahead.take_single(index)
                    launched.append((exchange, request, self.start(exchange, request, now)))
            for exchange, request, sent in launched:  # then the tasks that wait for them
                if sent:  # written: its task only arms deadlines and waits, a slice at a time
                    tasks.start(self.follow, exchange, request, sent)
                else:  # it connects first: at once, or a cold burst's last is sent later
                    tg.start_soon(self.follow, exchange, request, sent)
            for flow, started in started_flows:
                tasks.start(self._flow, flow, started)
            i = end
            ahead.passed(i)

    async def _sleep_until(self, due_ns: int) -> None:
        now = self._now
        delay_ns = due_ns - now()
        if delay_ns > 0:
            await anyio.sleep(delay_ns / 1e9)
            while now() < due_ns:  # loop timers may fire up to ~1 ms early
                await anyio.sleep(0)

    async def wait_until(self, due_ns: int) -> bool:
        """Sleep until `due_ns` (a think or tool time); False when the run is stopping."""
        delay_ns = due_ns - self._now()
        if delay_ns > 0:
            with anyio.move_on_after(delay_ns / 1e9):
                await self._stopping.wait()
            await self._sleep_until(due_ns)
        return not self._stopping.is_set()

    def prepare(
        self, plan: RequestPlan, messages: Sequence[Message] | None = None, keep_text: bool = False
    ) -> tuple[Exchange, bytes]:
        """The exchange of `plan` and its request's bytes, made ahead of its send."""
        config = self.config
        if messages is None and plan.messages and self.prompts.lead:  # the nonce in front
            plan = replace(plan, prompt_tokens=plan.prompt_tokens + self.prompts.lead_tokens)
        exchange = Exchange(
            plan, config.adapter, self.t0_ns, keep_text=keep_text, redactor=config.redactor,
            max_event_bytes=config.max_event_bytes.get(plan.class_name, DEFAULT_MAX_EVENT_BYTES),
            clock=self.clock, forced=config.body_options.force_output_tokens,
            allow_early_stops=config.allow_early_stops, count_tokens=self._count_tokens,
        )  # fmt: skip
        exchange.model = plan.model or config.body_options.model
        exchange.later = self.connector.after_reads
        request, exchange.request_id_sent, exchange.traceparent = self.encoder.encode(
            plan, messages
        )
        exchange.request_bytes = len(request)
        return exchange, request

    def start(self, exchange: Exchange, request: bytes, dispatched_ns: int) -> bool:
        """Start the exchange: written now when an idle connection (and slot) is free, else
        its task connects (or waits for a slot). Its deadlines are armed by that task."""
        exchange.dispatched_ns = dispatched_ns
        self._live[exchange.plan.request_id] = exchange
        stats = self.stats
        stats.in_flight += 1
        by_class, name = stats.in_flight_by_class, exchange.plan.class_name
        by_class[name] = by_class.get(name, 0) + 1
        return self._launch(exchange, request)

    def _launch(self, exchange: Exchange, request: bytes) -> bool:
        """Write the request on an idle connection, without an await; False when there is
        no idle connection or no free `max_in_flight` slot (the exchange's task then waits)."""
        limiter = self._limiter
        if limiter is not None:
            try:
                limiter.acquire_nowait()
            except anyio.WouldBlock:
                return False
        conn = self.connector.take_idle()
        if conn is None:
            if limiter is not None:
                limiter.release()
            return False
        exchange.holds_slot = limiter is not None
        self._write(exchange, conn, request)
        return True

    async def follow(self, exchange: Exchange, request: bytes, sent: bool) -> Exchange:
        """Wait for a started exchange (sending it first when `start` could not), record it."""
        config = self.config
        try:
            if sent:
                await self._exchange(exchange, request, True)
            elif self._limiter is not None:
                async with self._limiter:
                    await self._exchange(exchange, request, False)
            else:
                await self._exchange(exchange, request, False)
        finally:
            if exchange.holds_slot and self._limiter is not None:
                exchange.holds_slot = False
                self._limiter.release()
            self._settle_cancelled(exchange)
            if exchange.error:  # quoted on the way in; this pass guards the composed message
                exchange.error = config.redactor.redact(exchange.error)
            self._emit(exchange.record())
            if LOGGER.isEnabledFor(logging.DEBUG):
                LOGGER.debug("request %d: %s, HTTP %s, %d chunks%s", exchange.plan.request_id,
                             exchange.outcome, exchange.status, len(exchange.chunk_ns),
                             f": {exchange.error}" if exchange.error else "")  # fmt: skip
        return exchange

    def _settle_cancelled(self, exchange: Exchange) -> None:
        """Take the exchange off the live list; still unsettled: it was cancelled in flight."""
        if self._live.pop(exchange.plan.request_id, None) is None:
            return
        self.stats.in_flight -= 1
        self.stats.in_flight_by_class[exchange.plan.class_name] -= 1
        for timer in exchange.timers:
            timer.cancel()
        if not exchange.settled:  # cancelled mid-request: the connection is unusable
            exchange.cancel(self._now())

    async def _flow(self, flow: Flow, wave: list[Started]) -> None:
        """Run a flow that the scheduler started (a batch's first wave already sent)."""
        if flow.kind == "batch":
            await batch(self, flow, wave)
        elif flow.kind == "trajectory" and flow.grow:
            await Trajectory(self, flow).run()
        else:
            await conversation(self, flow)

    def skip(self, plans: Sequence[RequestPlan], reason: str) -> None:
        for plan in plans:
            self._emit(self._unsent(plan, Outcome.SKIPPED, f"skipped: {reason}"))

    def _unsent(self, plan: RequestPlan, outcome: Outcome, error: str) -> RequestRecord:
        """The record of a plan that was never sent (skipped, or not sent: the run stopped)."""
        intended = plan.intended_ns
        if plan.turn:  # a later turn has no intended time of its own: say when it was given up
            intended = max(intended, self._now() - self.t0_ns)
        return RequestRecord(
            request_id=plan.request_id, class_name=plan.class_name, intended_ns=intended,
            outcome=outcome, prompt_tokens_target=plan.prompt_tokens, max_tokens=plan.output_tokens,
            error=error, session_id=plan.session_id, turn=plan.turn,
            model=plan.model or self.config.body_options.model,
        )  # fmt: skip

    def _arm(self, exchange: Exchange) -> None:
        """The first-token and total deadlines, from the intended time, as loop timers."""
        loop = asyncio.get_running_loop()
        deadlines = exchange.plan.deadlines
        start = self.t0_ns + exchange.plan.intended_ns
        first_ns = start + int(deadlines.first_token_s * 1e9)
        total_ns = start + int(deadlines.total_s * 1e9)
        now = self._now()
        exchange.timers = [
            loop.call_later(max(0, first_ns - now) / 1e9, self._first_token_deadline, exchange),
            loop.call_later(
                max(0, total_ns - now) / 1e9,
                exchange.timeout,
                Outcome.TIMEOUT_TOTAL,
                f"not finished in {deadlines.total_s:g} s",
            ),
        ]

    async def _exchange(self, exchange: Exchange, request: bytes, sent: bool) -> None:
        """Send unless `sent` (retrying once on a reused connection that died unanswered), wait."""
        self._arm(exchange)  # written already (`start`) or not: from the intended time
        try:
            for attempt in range(2):
                if not (sent and attempt == 0) and not await self._send(exchange, request):
                    return
                await asyncio.shield(exchange.done)
                if not (attempt == 0 and exchange.will_retry()):
                    return
                # A kept-alive connection the server had closed: retry once on a fresh one,
                # the same trace with a span of its own.
                exchange.reset_for_retry()
                request, exchange.traceparent = self.encoder.respan(request, exchange.traceparent)
                self.stats.retries += 1
        finally:
            for timer in exchange.timers:
                timer.cancel()

    async def _send(self, exchange: Exchange, request: bytes) -> bool:
        """Get a connection and write the request; False when the exchange already ended."""
        conn = self.connector.take_idle() if exchange.retries == 0 else None
        if conn is None:
            conn = await self._connect(exchange)
            if conn is None:
                return False
        self._write(exchange, conn, request)
        return True

    def _write(self, exchange: Exchange, conn: Link, request: bytes) -> None:
        """Hand the request to the kernel on `conn`; `sent_ns` is stamped just before."""
        exchange.reused_connection = conn.reused
        exchange.connection = connection_label(conn)
        exchange.conn = conn
        exchange.sent_ns = self.stats.last_progress_ns = self._now()
        if exchange.retries == 0:
            self.stats.sent += 1
        conn.send(exchange, request)

    async def _connect(self, exchange: Exchange) -> Link | None:
        """A new connection, unless a deadline ends the exchange first."""
        opening = asyncio.ensure_future(self.connector.connect())
        try:
            waiting: set[asyncio.Future[Any]] = {opening, exchange.done}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not opening.done():
                opening.cancel()
        if exchange.settled:
            if opening.done() and not opening.cancelled() and opening.exception() is None:
                opening.result().detach()
            return None
        exc = opening.exception()
        if exc is None:
            return opening.result()
        if isinstance(exc, OSError) and exc.errno in CLIENT_ERRNOS:
            message = (
                f"client out of resources: {exc.strerror} (raise ulimit -n, or spread the load)"
            )
            exchange.finish(self._now(), Outcome.CLIENT_ERROR, message)
            return None
        message = (
            f"connect failed: {connect_failure(exc, self.connector.endpoint)}"
            if isinstance(exc, OSError)
            else f"connect failed: {exc!r}"
        )
        exchange.finish(self._now(), Outcome.CONNECT_ERROR, message)
        return None

    def _first_token_deadline(self, exchange: Exchange) -> None:
        if exchange.first_token_ns is None:
            exchange.timeout(
                Outcome.TIMEOUT_FIRST_TOKEN,
                f"no generated token in {exchange.plan.deadlines.first_token_s:g} s",
            )

    def _emit(self, record: RequestRecord) -> None:
        self._recorded[record.request_id] = 1
        stats = self.stats
        stats.last_progress_ns = self._now()
        if record.outcome is Outcome.OK:
            stats.ok += 1
            if record.first_token_ns is not None:
                stats.ttft.record_ns(record.first_token_ns - record.intended_ns)
        else:
            stats.failed += 1
        self.on_record(record)


def connection_label(conn: Link) -> str:
    """Which connection a request used: `new` (opened for it, its setup inside its latency),
    `warm` (opened before t0, first use) or `reused` (kept alive from an earlier exchange)."""
    if not conn.reused:
        return "new"
    return "warm" if conn.warm and conn.exchanges == 0 else "reused"
