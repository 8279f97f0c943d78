"""One generation request from accept to its last byte, in any dialect, faults applied.

The `Exchange` decides *when* bytes go out (engine tokens, faults, heartbeats, the end);
the dialect's `StreamFormat` decides *what* they are. Every write that carries generated
tokens is stamped into the trace record's `chunk_ns` right after the write.

Fault mapping, the same in every dialect: drop = close with the body unterminated;
garbage = bytes the dialect's decoder cannot accept, then the end of the body; error =
the dialect's own mid-stream error event, then a clean end of the body; cut = the
dialect's bare terminator with no stop reason, then a clean end of the body; gateway cut =
the dialect's normal end with a made-up usage (as LiteLLM's proxy ends a stream whose
upstream dropped), then a clean end of the body; status = that
HTTP status with the dialect's error body; stall and header delay act on the engine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from loadgen.sim.engine import NS_PER_MS, NS_PER_S, SeqRequest
from loadgen.sim.faults import FaultPlan
from loadgen.sim.protocol import Connection, ExchangeLike, HttpRequest
from loadgen.sim.wire import FormatArgs, SimRequest, StreamEnd, frame, trace_id, word

if TYPE_CHECKING:
    from loadgen.sim.dialects import Api
    from loadgen.sim.server import SimServer

perf_counter_ns = time.perf_counter_ns


class Exchange(ExchangeLike):
    """One request's response, driven by engine tokens."""

    def __init__(
        self,
        server: SimServer,
        conn: Connection,
        http: HttpRequest,
        api: Api,
        request: SimRequest,
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
        self._api = api
        self._request = request
        self._plan = plan
        self._dialect = plan.dialect
        self._seq_id = seq_id
        self._tokens = tokens
        self._reasoning = min(plan.dialect.reasoning_tokens, tokens)
        self._finish_reason = finish_reason
        self._emitted = 0
        self._pending_from = 1  # first token not yet written (coalescing)
        self._slow_at = 1 if request.stream else 0  # tokens >= this take the slow path
        self._live = True
        self._sent_early = False
        self._timer: asyncio.TimerHandle | None = None
        self._chunk_ns: list[int] = []
        self.last_token_sim_ns: int | None = None  # the engine's time of its last token
        self.first_token_sim_ns: int | None = None  # ... of its first
        # (queued, scheduled) in the engine's time, told with the first token (`StepResult`)
        self.engine_start: tuple[int, int] | None = None
        self._received_ns = received_ns
        self._entered_ns = received_ns
        self._cached, self._prompt_words, self._block_keys = server.prefix_lookup(
            http.body, request.prompt_tokens
        )
        self._response_id = f"{api.id_prefix}sim{seq_id}"
        self._entered = False  # in the engine's queue (a span tells of it)
        self._format = api.format(
            FormatArgs(
                request=request,
                response_id=self._response_id,
                created=int(time.time()),
                model=server.model,
                dialect=plan.dialect,
                tokens=tokens,
                reasoning_tokens=self._reasoning,
                finish_reason=finish_reason,
                cached_tokens=self._cached,
            )
        )
        self._token_frame = self._format.token_frame
        self.record: dict[str, Any] = {
            "type": "request",
            "id": seq_id,
            "x_request_id": http.headers.get("x-request-id"),
            "traceparent": http.headers.get("traceparent"),
            "trace_id": trace_id(http.headers.get("traceparent")),
            "path": http.path,
            "api": api.name,
            "stream": request.stream,
            "received_ns": received_ns,
            "first_token_ns": None,
            "done_ns": None,
            "chunk_ns": self._chunk_ns,
            "status": 200,
            "outcome": "ok",
            "prompt_tokens": request.prompt_tokens,
            "cached_tokens": self._cached,
            "output_tokens": 0,
            "reasoning_tokens": self._reasoning,
            "opening_ns": None,
            "heartbeats": 0,
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
        self._entered_ns = perf_counter_ns()
        plan = self._plan
        seq = SeqRequest(
            seq_id=self._seq_id,
            prompt_tokens=self._request.prompt_tokens,
            output_tokens=self._tokens,
            priority=self._request.priority,
            stall_after_tokens=plan.stall_after,
            stall_ns=round(plan.stall_s * NS_PER_S),
            cached_tokens=self._cached or 0,
        )
        if not self._server.scheduler.submit(seq):
            self._fail(429, "the simulator's admission queue is full", "rejected")
            return
        self._entered = True
        if not self._request.stream:
            self._fault_at(0)
        else:
            self._open_stream()

    def _open_stream(self) -> None:
        dialect, fmt = self._dialect, self._format
        keep_alive = self._http.keep_alive and not dialect.close_after_stream
        self._conn.start_stream(keep_alive=keep_alive, content_type=fmt.content_type)
        early = fmt.at_accept(dialect.role) if dialect.role == "early" else b""
        if early:
            self._conn.write(frame(early))
            self.record["opening_ns"] = perf_counter_ns()
            self._sent_early = True
        if dialect.heartbeat_s > 0 and fmt.heartbeat():
            self._beat()
        self._fault_at(0)

    def _fault_at(self, n: int) -> bool:
        """Apply a drop, garbage or error fault planned at token `n`; True if one was."""
        plan = self._plan
        if n == plan.drop_after:
            self._drop()
        elif n == plan.garbage_after:
            self._garbage()
        elif n == plan.error_after:
            self._error()
        elif n == plan.cut_after:
            self._cut()
        elif n == plan.gateway_cut:
            self._gateway_cut()
        else:
            return False
        return True

    def _beat(self, *, send: bool = False) -> None:
        if not self._live:
            return
        if send:
            self._conn.write(frame(self._format.heartbeat()))
            self.record["heartbeats"] += 1
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
        if outcome == "ok":
            success = self._server.counters.success
            success[self._finish_reason] = success.get(self._finish_reason, 0) + 1
            if self._prompt_words:
                answer = [word(i).strip() for i in range(self._reasoning + 1, self._tokens + 1)]
                self._server.cache_answer(self._prompt_words + answer)
        spans = self._server.spans if self._entered else None
        if spans is not None:
            self._engine_record()  # the span's figures, in the trace too
        self._server.trace.write(record)
        if spans is not None:
            sent_id = self._http.headers.get("x-request-id")
            request_id = f"{self._api.id_prefix}{sent_id}" if sent_id else self._response_id
            spans.add(record, request_id, self._http.headers.get("traceparent"))

    def _fail(self, status: int, message: str, outcome: str) -> None:
        self._end(outcome, status)
        extra = [("retry-after", "1")] if status == 429 else []
        self._conn.send_simple(
            status,
            self._api.error_body(status, message),
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
        junk = self._format.garbage(self._server.rng.randbytes(24))
        if self._request.stream:
            self._conn.end_stream(frame(junk))
        else:
            self._conn.send_simple(200, junk, keep_alive=False)

    def _cut(self) -> None:
        self._server.scheduler.cancel(self._seq_id)
        self._end("cut")
        if not self._request.stream:
            self._conn.close()
            return
        bare = self._format.cut()
        self._conn.end_stream(frame(bare) if bare else b"")

    def _gateway_cut(self) -> None:
        """The upstream is gone after `n` tokens; a gateway ends the stream as if it were
        done, with a usage it made up (see `loadgen.sim.faults`)."""
        self._server.scheduler.cancel(self._seq_id)
        if not self._request.stream:
            self._conn.close()
            self._end("gateway_cut")
            return
        real = self._stream_end()
        claimed = replace(
            real,
            finish_reason="stop",
            output_tokens=self._emitted * 9 // 7,
            prompt_tokens=self._request.prompt_tokens * 9 // 14,
            reasoning_tokens=min(real.reasoning_tokens, self._emitted),
        )
        closing = self._format.finish(claimed)
        self._end("gateway_cut")
        self._conn.end_stream(frame(closing) if closing else b"")

    def _error(self) -> None:
        self._server.scheduler.cancel(self._seq_id)
        message = "simulated failure mid-stream (fault injection)"
        if not self._request.stream:
            self._fail(500, message, "error_event")
            return
        self._end("error_event")
        self._conn.end_stream(frame(self._format.error_event(message)))

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
        prefix = b""
        if n == 1:
            self.record["first_token_ns"] = perf_counter_ns()
            self._prefilled()
            prefix = self._format.at_first(dialect.role, sent_early=self._sent_early)
        marks = (self._tokens, plan.drop_after, plan.garbage_after, plan.error_after,
                 plan.cut_after, plan.gateway_cut)  # fmt: skip
        pending = n - self._pending_from + 1
        empty = self._format.empty_token() if self._is_empty(n) else b""
        if empty:
            self._pending_from = n + 1
            self._conn.write(frame(prefix + empty))
        elif pending >= dialect.tokens_per_chunk or n in marks or n == self._reasoning:
            first, self._pending_from = self._pending_from, n + 1
            reasoning = first <= self._reasoning
            self._conn.write(frame(prefix + self._format.tokens(first, n, reasoning=reasoning)))
            self._chunk_ns.append(perf_counter_ns())
        elif prefix:
            self._conn.write(frame(prefix))
        if self._fault_at(n):
            return
        if n >= self._tokens:
            self._finish_stream()
        else:
            self._slow_at = self._next_slow(n)

    def _prefilled(self) -> None:
        """The first token: the prompt is in the KV cache (counters, prefix cache)."""
        self.first_token_sim_ns = self.last_token_sim_ns
        self._server.on_first_token(
            self._request.prompt_tokens, self._block_keys, self._received_ns
        )

    def _is_empty(self, n: int) -> bool:
        """Token `n` goes out as an empty-text token event (`empty_every`; never the first)."""
        every = self._dialect.empty_every
        return every > 0 and n > 1 and n % every == 0 and n > self._reasoning

    def _next_slow(self, n: int) -> int:
        """The next token index that needs the slow path (phase changes, marks, the end)."""
        dialect = self._dialect
        if dialect.tokens_per_chunk > 1 or n <= self._reasoning or dialect.empty_every:
            return n + 1
        plan = self._plan
        marks = (plan.drop_after, plan.garbage_after, plan.error_after, plan.cut_after,
                 plan.gateway_cut)  # fmt: skip
        return min([self._tokens, *(k for k in marks if k is not None and k > n)])

    def _stream_end(self) -> StreamEnd:
        now = perf_counter_ns()
        first = self.record["first_token_ns"]
        return StreamEnd(
            metrics=self._metrics(),
            finish_reason=self._finish_reason,
            prompt_tokens=self._request.prompt_tokens,
            cached_tokens=self._cached,
            output_tokens=self._tokens,
            reasoning_tokens=self._reasoning,
            received_ns=self._received_ns,
            entered_ns=self._entered_ns,
            first_token_ns=now if first is None else first,
            last_token_ns=now,
        )

    def _metrics(self) -> dict[str, float] | None:
        """vLLM's per-request metrics (vllm/entrypoints/generate/base/serving.py) from the
        engine's own times, when asked for: queue = scheduled − queued, time to first token
        = first token − scheduled (vLLM's starts at scheduling), generation = last token −
        first token, the mean gap over it, tokens per second from scheduling. On the
        client's clock (simulated time / speed), so they subtract from its measurements;
        the engine's times go to the trace record (`engine`)."""
        if not self._dialect.per_request_metrics or (engine := self._engine_record()) is None:
            return None
        queued, scheduled = engine["queued_sim_ns"], engine["scheduled_sim_ns"]
        first, last = engine["first_token_sim_ns"], engine["last_token_sim_ns"]
        per_ms = NS_PER_MS * self._server.clock.speed  # simulated ns per real ms
        metrics = {
            "time_to_first_token_ms": (first - scheduled) / per_ms,
            "generation_time_ms": (last - first) / per_ms,
            "queue_time_ms": (scheduled - queued) / per_ms,
        }
        if self._emitted > 1:
            metrics["mean_itl_ms"] = metrics["generation_time_ms"] / (self._emitted - 1)
        if last > scheduled:
            metrics["tokens_per_second"] = self._emitted * 1000 / ((last - scheduled) / per_ms)
        return metrics

    def _engine_record(self) -> dict[str, int] | None:
        """The engine's own times of this request (simulated ns: queued, scheduled, first
        and last token), kept in its trace record as `engine`; None before its first token."""
        start, first, last = self.engine_start, self.first_token_sim_ns, self.last_token_sim_ns
        if start is None or first is None:
            return None
        engine = {
            "queued_sim_ns": start[0],
            "scheduled_sim_ns": start[1],
            "first_token_sim_ns": first,
            "last_token_sim_ns": first if last is None else last,
        }
        self.record["engine"] = engine
        return engine

    def _finish_stream(self) -> None:
        closing = self._format.finish(self._stream_end())
        last = frame(closing) if closing else b""  # frame(b"") would end the body early
        self._end("ok")
        self._conn.end_stream(last)

    def _plain_token(self, n: int) -> None:
        """Non-streaming: count tokens; answer (or fail) when the plan says so."""
        if n == 1:
            self.record["first_token_ns"] = perf_counter_ns()
            self._prefilled()
        if self._fault_at(n):
            return
        if n >= self._tokens:
            body = self._format.full_response(self._stream_end())
            self._end("ok")
            keep_alive = self._http.keep_alive and not self._dialect.close_after_stream
            self._conn.send_simple(
                200, body, keep_alive=keep_alive, content_type=self._api.plain_content_type
            )
