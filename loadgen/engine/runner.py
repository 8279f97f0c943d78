"""The engine: sends every plan at its intended time and turns each into one record.

Fourth stage (plans → engine → records). Open loop: a scheduler sleeps until each plan's
intended time and starts its request; it never waits for a response, so a slow or hung
server cannot delay the next send. With `max_in_flight`, started requests wait for a slot,
and that wait is charged to them (TTFT is measured from the intended time: no coordinated
omission). Every plan yields exactly one `RequestRecord`, whatever happened: failures are
mapped to an `Outcome` in one place (`Exchange.outcome`), never raised.

Per-request deadlines (from the intended time): no generated token by `first_token_s`,
a gap between tokens longer than `stall_s`, not done by `total_s`. They are loop timers
(`call_later`), not a task per request, so the per-chunk path stays a callback; and they
are not read timeouts, so no server behaviour (a byte a second, heartbeats) stretches them.
Memory per request is capped too: one stream event at its class's `max_event_bytes`, an
error body at `MAX_ERROR_BODY`; past a cap the request ends and its connection closes.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import anyio
import orjson

from loadgen.adapters.protocol import (
    Adapter,
    BodyOptions,
    MalformedEvent,
    Message,
    ServerTimings,
    new_decoder,
)
from loadgen.adapters.sse import DEFAULT_MAX_EVENT_BYTES, EventTooLarge, size_text
from loadgen.analysis.histograms import LatencyHistogram
from loadgen.engine.agents import Trajectory
from loadgen.engine.clock import SYSTEM_CLOCK, Clock
from loadgen.engine.logs import LOGGER
from loadgen.engine.request_ids import (
    DEFAULT_HEADER,
    RequestIds,
    merged,
    new_nonce,
    put_in_body,
)
from loadgen.engine.secrets import Redactor
from loadgen.engine.starts import Starts
from loadgen.engine.transport import Connector, Link, encode_request
from loadgen.results.records import Outcome, RequestRecord, TokenSource, usage_disagrees
from loadgen.workload.plans import Flow, RequestPlan, Work, singles_of
from loadgen.workload.prompts import PromptMaker
from loadgen.workload.spec import Deadlines

# An error response's body is read up to this many bytes, then the request ends (with its
# HTTP outcome: the status already said what happened) and the connection is closed.
MAX_ERROR_BODY = 2048
QUOTE_CHARS = 300  # server text shown in a record's error (a body, an error event, a reason)
QUOTE_EVENT_CHARS = 120  # of a malformed event's payload
NO_SECRETS = Redactor()
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


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """How the engine sends: the adapter, body options, extra headers, in-flight cap."""

    adapter: Adapter
    body_options: BodyOptions
    seed: int
    max_in_flight: int | None = None
    request_headers: Mapping[str, str] = field(default_factory=dict)
    headers_for: Callable[[RequestPlan], Mapping[str, str]] | None = None  # tests, faults
    priority_header: str | None = None  # send plan.priority as this header, not in the body
    prompts: PromptMaker | None = None  # default: words, seeded by `seed`
    redactor: Redactor = NO_SECRETS  # quotes server text into errors, secrets hidden
    # The cap on one stream event or line, by class name (`limits.max_event_bytes`).
    max_event_bytes: Mapping[str, int] = field(default_factory=dict)
    # Each request's id header (`loadgen.engine.request_ids`): name (None: none sent),
    # format, and the run's random UUID prefix.
    request_id_header: str | None = DEFAULT_HEADER
    request_id_format: str = "uuid"
    request_id_nonce: int = field(default_factory=new_nonce)
    # Where the id also goes in the body (`request_ids.put_in_body`): auto, on or off.
    request_id_body: str = "auto"
    # A forced length that ends short on a stop reason is ok (flagged), not truncated.
    allow_early_stops: bool = False


class Exchange:
    """One request's measurement: the sink its connection reports to, and its timers.

    Clock values are absolute (the connector's clock); `record()` makes them relative to t0.
    Every piece of server text that reaches `error` is quoted through `redactor` as it
    comes in (redacted, then cut); nothing the server sent is cut before that.
    """

    def __init__(
        self,
        plan: RequestPlan,
        adapter: Adapter,
        t0_ns: int,
        *,
        keep_text: bool = False,
        redactor: Redactor = NO_SECRETS,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        clock: Clock = SYSTEM_CLOCK,
        forced: bool = False,
        allow_early_stops: bool = False,
        count_tokens: Callable[[str], int] | None = None,
    ) -> None:
        self.plan = plan
        self.model: str | None = plan.model  # the engine fills in the target's when None
        # N without usage: the text's tokens by target.tokenizer (the text is then kept).
        self.count_tokens = count_tokens
        self.forced = forced and adapter.forces_length  # the body asked for exactly max_tokens
        # A forced length that ends short on a stop reason is `ok` (flagged) only when the
        # workload allows it (target.allow_early_stops); else it is `truncated`.
        self.allow_early_stops = allow_early_stops
        self._now = clock.now_ns
        self.keep_text = keep_text or count_tokens is not None  # flows build on the answer
        self.texts: list[str] = []
        self.stall_ns = int(plan.deadlines.stall_s * 1e9)
        self.reused_connection = False
        self.connection: str | None = None  # new, warm or reused (`connection_label`)
        # The closed loop's next send, run in the callback that ends this exchange's use of
        # its connection (`Engine._batch`); called once, with that read's stamp.
        self.then: Callable[[int], None] | None = None
        self.timers: list[asyncio.TimerHandle] = []
        self.holds_slot = False  # took a max_in_flight slot without waiting (`_launch`)
        self.adapter = adapter
        self.t0_ns = t0_ns
        self.redactor = redactor
        self.decoder = new_decoder(adapter, max_event_bytes)  # SSE or NDJSON, by framing
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # How `done` is resolved: at once, or (the engine's) once the connector has parsed
        # the reads queued with this one's end (`Connector.after_reads`).
        self.later: Callable[[Callable[[], None]], None] = _at_once
        # done.done() as a plain attribute: the per-chunk path asks after every event, and a
        # method call on the future costs more than the attribute (finish() sets both).
        self.settled = False
        self.outcome: Outcome | None = None
        self.error: str | None = None
        self.status: int | None = None
        self.content_type = ""
        self.sent_ns: int | None = None
        self.dispatched_ns: int | None = None
        self.headers_ns: int | None = None
        self.first_token_ns: int | None = None
        self.first_content_ns: int | None = None
        self.first_reasoning_ns: int | None = None
        self.server_timings: ServerTimings | None = None
        self.last_token_ns: int | None = None
        self.end_ns: int | None = None
        self.chunk_ns: list[int] = []
        self.chunk_chars: list[int] = []
        self.usage_completion: int | None = None
        self.usage_prompt: int | None = None
        self.cached_tokens: int | None = None
        self.response_id: str | None = None  # the body's id, else the x-request-id header
        self.saw_done = False
        self.error_body = b""
        self.retries = 0
        self.conn: Link | None = None
        self.lost_before_response = False
        self._stall_timer: asyncio.TimerHandle | None = None
        self.request_id_sent: str | None = None
        self.finish_reason: str | None = None  # the API's stop reason, as it sent it
        self.hidden_at: list[int] = []  # token-only events: index of the chunk after each
        self.body_bytes = 0  # response body bytes received (bounds a plausible usage count)
        self.request_bytes = 0  # the request's bytes (bounds a plausible prompt count)
        self.usage_problem: str | None = None  # usage counts it could not take (as text)

    # -- ExchangeSink ------------------------------------------------------------------
    def on_head(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        self.status = status
        self.headers_ns = t_ns
        self.content_type = headers.get("content-type", "")
        self.response_id = headers.get("x-request-id")  # a body `id` replaces it

    def on_body(self, data: bytes, t_ns: int) -> None:
        if self.settled:
            return
        self.body_bytes += len(data)
        if self.status is None or self.status >= 300:
            self._error_body(data, t_ns)
            return
        try:
            events = self.decoder.feed(data)
        except EventTooLarge as exc:
            self._too_large(exc, t_ns)
            return
        for event, payload in events:
            self._event(event, payload, t_ns)
            if self.settled:
                return

    def _error_body(self, data: bytes, t_ns: int) -> None:
        """Keep an error response's body up to the cap; past it, end the request."""
        room = MAX_ERROR_BODY - len(self.error_body)
        self.error_body += data[:room]
        if len(data) > room:
            outcome, message = self._clean_end_outcome()
            cap = size_text(MAX_ERROR_BODY)
            self.finish(t_ns, outcome, f"{message} (error body over the {cap} cap: not read on)")

    def _too_large(self, exc: EventTooLarge, t_ns: int) -> None:
        """The events before the one over the cap count; then the stream is abandoned."""
        for event, payload in exc.events:
            self._event(event, payload, t_ns)
            if self.settled:
                return
        where = f"limits.max_event_bytes of class {self.plan.class_name}"
        self.finish(t_ns, Outcome.STREAM_ERROR, f"{exc} ({where}): connection closed")

    def on_end(self, t_ns: int) -> None:
        if self.settled:
            self.conn = None  # settled by its last event: now its connection is free too
            self._turn(t_ns)
            return
        if self.status is not None and self.status < 300:
            try:
                events = self.decoder.close()
            except EventTooLarge as exc:
                self._too_large(exc, t_ns)
                events = []
            for event, payload in events:
                self._event(event, payload, t_ns)
                if self.settled:
                    break
        self.conn = None
        self.finish(t_ns, None)

    def on_lost(self, reason: str, got_response_bytes: bool, t_ns: int) -> None:
        if self.settled:
            self.conn = None
            self._turn(t_ns)
            return
        self.conn = None
        if not got_response_bytes:
            self.lost_before_response = True
        outcome = Outcome.STREAM_ERROR if got_response_bytes else Outcome.CONNECT_ERROR
        self.finish(t_ns, outcome, self.redactor.quote(reason, QUOTE_CHARS))

    # -- per event (hot path) ------------------------------------------------------------
    def _event(self, event: bytes, payload: bytes, t_ns: int) -> None:
        try:
            delta = self.adapter.parse(event, payload)
        except MalformedEvent as exc:
            shown = self.redactor.quote(exc.data, QUOTE_EVENT_CHARS)
            self.finish(t_ns, Outcome.STREAM_ERROR, f"malformed event: {exc}: {shown}")
            return
        if delta.error is not None:
            shown = self.redactor.quote(delta.error, QUOTE_CHARS)
            self.finish(t_ns, Outcome.STREAM_ERROR, f"server error event: {shown}")
            return
        if delta.content_chars or delta.reasoning_chars or delta.has_tool_call:
            if self.first_token_ns is None:
                self.first_token_ns = t_ns
                self.start_stall_watch()
            if delta.content_chars and self.first_content_ns is None:
                self.first_content_ns = t_ns
            if delta.reasoning_chars and self.first_reasoning_ns is None:
                self.first_reasoning_ns = t_ns
            self.last_token_ns = t_ns
            if self.keep_text and delta.text:
                self.texts.append(delta.text)
            self.chunk_ns.append(t_ns)
            self.chunk_chars.append(delta.content_chars + delta.reasoning_chars or 1)
        elif delta.token_only and self.first_token_ns is not None:
            self.hidden_at.append(len(self.chunk_ns))
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
        if delta.usage_problem is not None:
            self._usage_problem(delta.usage_problem)
        if delta.completion_tokens is not None:
            self.usage_completion = delta.completion_tokens
        if delta.prompt_tokens is not None:
            self.usage_prompt = delta.prompt_tokens
        if delta.server_timings is not None:
            self.server_timings = delta.server_timings
        if delta.cached_tokens is not None:
            self.cached_tokens = delta.cached_tokens
        if delta.response_id is not None:
            self.response_id = delta.response_id
        if delta.done:
            self.saw_done = True
            self.finish(t_ns, None)

    # -- end ---------------------------------------------------------------------------
    def finish(self, t_ns: int, outcome: Outcome | None, error: str | None = None) -> None:
        """Settle the outcome once; later calls are ignored."""
        if self.settled:
            return
        self.settled = True
        self.end_ns = t_ns
        if outcome is None:
            outcome, error = self._clean_end_outcome()
        self.outcome, self.error = outcome, error
        if self._stall_timer is not None:
            self._stall_timer.cancel()
        if self.conn is not None and outcome is not Outcome.OK:
            self.conn.detach()
            self.conn = None
        self.later(partial(_resolve, self.done))
        if self.then is not None and self.conn is None and not self.will_retry():
            self._turn(t_ns)  # else when the connection ends (on_end), or the worker does it

    def will_retry(self) -> bool:
        """Lost unanswered on a kept-alive (or warm) connection: it is sent once more."""
        return self.lost_before_response and self.reused_connection and self.retries == 0

    def _turn(self, t_ns: int) -> None:
        then, self.then = self.then, None
        if then is None:
            return
        try:
            then(t_ns)
        except Exception as exc:  # a bug: report it; the worker sends the next one itself
            loop = asyncio.get_running_loop()
            loop.call_exception_handler({"message": "loadgen: closed-loop send", "exception": exc})

    def _clean_end_outcome(self) -> tuple[Outcome, str | None]:
        status = self.status
        if status is not None and status >= 300:
            body = self.redactor.quote(self.error_body.strip(), QUOTE_CHARS).strip()
            message = f"HTTP {status}" + (f": {body}" if body else "")
            return (Outcome.REJECTED if status == 429 else Outcome.HTTP_ERROR), message
        if self.first_token_ns is None:
            if self.saw_done and self.finish_reason is None and self.adapter.finish_signal:
                # An explicit end with no stop reason, before any output: the same cut as
                # after some (llama-cpp-python interrupting a stream still in prefill).
                return Outcome.TRUNCATED, (
                    "stream ended before any generated output, without a finish reason: cut short"
                )
            message = "stream ended without any generated output"
            kind = self.content_type.split(";", 1)[0].strip()
            if kind and kind not in ("text/event-stream", "application/x-ndjson"):
                message += f" (content-type {self.redactor.quote(kind, 80)!r})"
            return Outcome.STREAM_ERROR, message
        return stream_end(self.finish_reason, self.adapter.finish_signal)

    def timeout(self, outcome: Outcome, message: str) -> None:
        """A deadline fired: settle as that timeout (the connection is dropped)."""
        self.finish(self._now(), outcome, message)

    def start_stall_watch(self) -> None:
        """Check, at the last token + stall, that a newer token arrived; else time out.

        One timer per stall period, not one per chunk: it re-arms itself from the last token.
        """
        loop = asyncio.get_running_loop()
        stall_ns = self.stall_ns
        now = self._now

        def check() -> None:
            if self.settled:
                return
            overdue_ns = (self.last_token_ns or 0) + stall_ns - now()
            if overdue_ns <= 0:
                self.timeout(Outcome.TIMEOUT_STALL, f"no token for {stall_ns / 1e9:g} s")
            else:
                self._stall_timer = loop.call_later(overdue_ns / 1e9, check)

        self._stall_timer = loop.call_later(stall_ns / 1e9, check)

    def output_tokens(self) -> tuple[int, TokenSource, list[int]]:
        """N, where it came from, and the tokens each output chunk carried.

        The server's usage when it sent one; else, with a tokenizer, the streamed text's
        tokens (when no reasoning or tool output, which is not in the text, came); else the
        count of token-bearing events: every output chunk and every token-only event after
        the first output (each token-only event is counted in the output chunk after it).
        """
        n_chunks = len(self.chunk_ns)
        if self.usage_completion is not None and n_chunks:
            tokens = self.usage_completion
            return tokens, TokenSource.USAGE, apportion(tokens, self.chunk_chars)
        if not n_chunks:
            source = TokenSource.USAGE if self.usage_completion else TokenSource.NONE
            return self.usage_completion or 0, source, []
        if self.count_tokens is not None and self.first_reasoning_ns is None and self.texts:
            tokens = max(1, self.count_tokens("".join(self.texts)))
            return tokens, TokenSource.TEXT, apportion(tokens, self.chunk_chars)
        per_chunk = [1] * n_chunks
        for index in self.hidden_at:
            per_chunk[min(index, n_chunks - 1)] += 1
        return n_chunks + len(self.hidden_at), TokenSource.CHUNKS, per_chunk

    def _usage_problem(self, problem: str) -> None:
        """Note a usage count the server cannot mean (kept as text, never as a figure)."""
        self.usage_problem = f"{self.usage_problem}; {problem}" if self.usage_problem else problem

    def check_usage(self) -> None:
        """Drop, as a usage problem, counts above what this exchange could hold: output
        tokens above both the planned cap and the response's bytes (a streamed token takes
        at least a byte; hidden reasoning is within the cap), prompt tokens above the
        request's bytes plus `PROMPT_TEMPLATE_TOKENS` (a chat template's own tokens)."""
        output_cap = max(self.plan.output_tokens, self.body_bytes)
        if self.usage_completion is not None and self.usage_completion > output_cap:
            self._usage_problem(
                f"output tokens={self.usage_completion} (more than the {self.body_bytes} "
                f"bytes that arrived could hold, and over max_tokens {self.plan.output_tokens})"
            )
            self.usage_completion = None
        prompt_cap = self.request_bytes + PROMPT_TEMPLATE_TOKENS
        if self.usage_prompt is not None and self.request_bytes and self.usage_prompt > prompt_cap:
            self._usage_problem(
                f"prompt tokens={self.usage_prompt} (more than the {self.request_bytes}-byte "
                "request could hold)"
            )
            self.usage_prompt = None

    def record(self, dispatched_ns: int | None) -> RequestRecord:
        """The one record of this request (relative times)."""
        outcome = self.outcome or Outcome.CANCELLED
        self.check_usage()
        tokens, source, per_chunk = self.output_tokens()
        counted = len(self.chunk_ns) + len(self.hidden_at)
        usage = self.usage_completion if self.chunk_ns else None
        error, stopped_early = self.error, False
        if outcome is Outcome.OK and self.usage_problem is not None:
            outcome = Outcome.STREAM_ERROR
            error = self.redactor.quote(
                f"usage the server cannot mean: {self.usage_problem} (not taken; N counted "
                "from the stream)",
                QUOTE_CHARS,
            )
        if outcome is Outcome.OK and self.forced:
            outcome, error, stopped_early = short_stream(
                self.finish_reason, source, tokens, self.plan.output_tokens,
                counted=counted if usage_disagrees(usage, counted) else None,
                allow_early=self.allow_early_stops,
            )  # fmt: skip
        t0 = self.t0_ns

        def rel(t: int | None) -> int | None:
            return None if t is None else t - t0

        return RequestRecord(
            request_id=self.plan.request_id,
            class_name=self.plan.class_name,
            intended_ns=self.plan.intended_ns,
            dispatched_ns=rel(dispatched_ns),
            outcome=outcome,
            sent_ns=rel(self.sent_ns),
            headers_ns=rel(self.headers_ns),
            first_token_ns=rel(self.first_token_ns),
            first_content_ns=rel(self.first_content_ns),
            first_reasoning_ns=rel(self.first_reasoning_ns),
            last_token_ns=rel(self.last_token_ns),
            end_ns=rel(self.end_ns),
            chunk_ns=[t - t0 for t in self.chunk_ns],
            chunk_tokens=per_chunk,
            output_tokens=tokens,
            token_source=source,
            prompt_tokens=self.usage_prompt,
            prompt_tokens_target=self.plan.prompt_tokens,
            max_tokens=self.plan.output_tokens,
            http_status=self.status,
            error=error,
            retries=self.retries,
            session_id=self.plan.session_id,
            turn=self.plan.turn,
            server_timings=self.server_timings,
            request_id_sent=self.request_id_sent,
            finish_reason=self.finish_reason,
            stopped_early=stopped_early,
            usage_output_tokens=usage,
            counted_output_tokens=counted,
            usage_problem=self.usage_problem,
            connection=self.connection,
            model=self.model,
            cached_prompt_tokens=self.cached_tokens,
            server_request_id=self.redactor.quote(self.response_id, 200)
            if self.response_id is not None
            else None,
        )


# Stop reasons that say the server gave up on the request, not that the output was done:
# vLLM's "abort" and "error" (vllm/v1/engine/__init__.py, FINISH_REASON_STRINGS: stop,
# length, abort, error, repetition), SGLang's "abort" (sglang/srt/managers/schedule_batch.py,
# FINISH_ABORT); "cancelled" is what other servers use for the same.
ABORT_REASONS = frozenset({"abort", "aborted", "cancelled", "canceled", "error"})
# Stop reasons that mean "the length limit was reached", in each API's words.
LENGTH_REASONS = frozenset({"length", "max_tokens", "max_output_tokens", "max_new_tokens"})


def stream_end(finish_reason: str | None, finish_signal: bool) -> tuple[Outcome, str | None]:
    """How a stream that ended cleanly after some output ended: ok, or truncated."""
    if finish_reason is None:
        if finish_signal:
            return Outcome.TRUNCATED, (
                "stream ended without a finish reason (this API always sends one): cut short"
            )
        return Outcome.OK, None
    if finish_reason.lower() in ABORT_REASONS:
        return Outcome.TRUNCATED, f"stream ended with finish reason {finish_reason!r}"
    return Outcome.OK, None


# Prompt tokens a chat template may add beyond the request's bytes (role markers, a default
# system prompt): a prompt count above request bytes + this is no count of this request.
PROMPT_TEMPLATE_TOKENS = 8192


def short_stream(
    finish_reason: str | None,
    source: TokenSource,
    tokens: int,
    forced: int,
    *,
    counted: int | None = None,
    allow_early: bool = False,
) -> tuple[Outcome, str | None, bool]:
    """An ok stream of a forced length, judged by its token count: (outcome, error, early).

    The evidence is N, or the events that arrived (`counted`, given when the usage
    disagrees with them) when those are fewer and the end is not a length stop: a gateway
    that ends a cut stream with `stop` and a count of its own is judged by what arrived.
    At the forced length or over it: ok. Short, no stop reason (an API without a finish
    signal) and a trusted count (usage or text): truncated. Short on a `length` stop with N
    counted from chunks: ok (chunks may carry several tokens). Short on any other stop
    reason (`stop`, EOS, a stop sequence; `length` by usage or text: the server capped it):
    truncated, a breach whatever the reason says, unless the workload allows early stops
    (`target.allow_early_stops`): then ok and flagged `stopped_early`.
    """
    reason = finish_reason.lower() if finish_reason is not None else None
    length_stop = reason in LENGTH_REASONS
    got = tokens if counted is None or length_stop else min(tokens, counted)
    if got >= forced:
        return Outcome.OK, None, False
    trusted = source in (TokenSource.USAGE, TokenSource.TEXT)
    if reason is None:
        if trusted:
            return (
                Outcome.TRUNCATED,
                f"stream ended after {got} of {forced} forced tokens "
                "with no stop reason: cut short",
                False,
            )
        return Outcome.OK, None, False
    if length_stop and not trusted:
        return Outcome.OK, None, False
    if allow_early:
        return Outcome.OK, None, True
    said = f"{counted} arrived, usage said {tokens}" if got != tokens else f"{got} tokens"
    return (
        Outcome.TRUNCATED,
        f"stream ended on finish reason {finish_reason!r} after {got} of {forced} forced "
        f"tokens ({said}): a forced length that came back short (a stream cut behind a "
        "gateway, or a server that ignores ignore_eos/min_tokens; target.allow_early_stops: "
        "true accepts it)",
        False,
    )


def apportion(tokens: int, weights: Sequence[int]) -> list[int]:
    """Split `tokens` over chunks: one each first, the rest by text length (largest remainder).

    Servers do not say how many tokens a chunk carried; when usage reports more tokens than
    chunks (coalesced deltas, speculative decoding), longer chunks carried more of them.
    """
    n = len(weights)
    if n == 0:
        return []
    if tokens == n:
        return [1] * n  # the usual case: one token per chunk
    base = [1] * n if tokens >= n else [0] * n
    rest = tokens - sum(base)
    total = sum(w or 1 for w in weights)
    shares = [rest * (w or 1) / total for w in weights]
    floors = [math.floor(s) for s in shares]
    leftover = rest - sum(floors)
    order = sorted(range(n), key=lambda i: floors[i] - shares[i])[:leftover]
    for i in order:
        floors[i] += 1
    return [b + f for b, f in zip(base, floors, strict=True)]


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
                self.singles[index] = made = engine._prepare(engine.work.singles[index])
                self.held += len(made[1])
            elif (flow := engine.work.flows[index]).kind == "batch":
                wave = [engine._prepare(p) for p in flow.plans[: flow.concurrency]]
                self.waves[index] = wave
                self.held += sum(len(request) for _, request in wave)
            self.next += 1
            if self.next % 16 == 0 and engine._now() >= due_ns:
                return  # due already: send what is made, make the rest as it goes

    def take_single(self, index: int) -> tuple[Exchange, bytes]:
        made = self.singles.pop(index, None)
        if made is None:
            return self.engine._prepare(self.engine.work.singles[index])
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
        user_headers = {**connector.endpoint.headers, **config.request_headers}
        self.ids = RequestIds(config.request_id_header, config.request_id_format,
                              config.request_id_nonce, user_headers)  # fmt: skip
        self._by_model: dict[str, BodyOptions] = {}

    def stop(self) -> None:
        """Stop sending (interrupt): no new request, turn or hop starts; in-flight ones go on."""
        self._stopping.set()
        self.sending.cancel()

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
            self._emit(exchange.record(exchange.dispatched_ns))
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
            launched: list[tuple[Exchange, bytes, bool]] = []
            started_flows: list[tuple[Flow, list[tuple[Exchange, bytes, bool]]]] = []
            for _, is_flow, index in starts[i:end]:  # the writes: no await, no task start
                if is_flow:
                    wave = [(e, r, self._go(e, r, now)) for e, r in ahead.take_wave(index)]
                    started_flows.append((flows[index], wave))
                else:
                    exchange, request = ahead.take_single(index)
                    launched.append((exchange, request, self._go(exchange, request, now)))
            for exchange, request, sent in launched:  # then the tasks that wait for them
                if sent:  # written: its task only arms deadlines and waits, a slice at a time
                    tasks.start(self._follow, exchange, request, sent)
                else:  # it connects first: at once, or a cold burst's last is sent later
                    tg.start_soon(self._follow, exchange, request, sent)
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

    async def _wait_unless_stopped(self, due_ns: int) -> bool:
        """Sleep until `due_ns` (a think or tool time); False when the run is stopping."""
        delay_ns = due_ns - self._now()
        if delay_ns > 0:
            with anyio.move_on_after(delay_ns / 1e9):
                await self._stopping.wait()
            await self._sleep_until(due_ns)
        return not self._stopping.is_set()

    async def _request(
        self,
        plan: RequestPlan,
        dispatched_ns: int,
        messages: Sequence[Message] | None,
        keep_text: bool,
    ) -> Exchange:
        """Send one request, wait for it, record it; the exchange tells a flow what happened."""
        exchange, request = self._prepare(plan, messages, keep_text)
        sent = self._go(exchange, request, dispatched_ns)
        return await self._follow(exchange, request, sent)

    def _prepare(
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
        request = self._encode(exchange, messages)
        exchange.request_bytes = len(request)
        return exchange, request

    def _go(self, exchange: Exchange, request: bytes, dispatched_ns: int) -> bool:
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

    async def _follow(self, exchange: Exchange, request: bytes, sent: bool) -> Exchange:
        """Wait for a started exchange (sending it first when `_launch` could not), record it."""
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
            self._emit(exchange.record(exchange.dispatched_ns))
            if LOGGER.isEnabledFor(logging.DEBUG):
                LOGGER.debug("request %d: %s, HTTP %s, %d chunks%s", exchange.plan.request_id,
                             exchange.outcome, exchange.status, len(exchange.chunk_ns),
                             f": {exchange.error}" if exchange.error else "")  # fmt: skip
        return exchange

    def _messages(self, plan: RequestPlan) -> Sequence[Message]:
        """A single request's prompt: its dataset messages, a shared prefix and a fresh
        suffix, or generated words (each starting with a cold run's nonce)."""
        prompts = self.prompts
        if plan.messages:
            return prompts.lead_messages(plan.messages)
        if plan.shared_prefix is not None:
            group, prefix = plan.shared_prefix
            return [("user", prompts.shared(plan.request_id, group, prefix, plan.prompt_tokens))]
        return [("user", prompts.text(plan.request_id, plan.prompt_tokens, plan.prefix_groups,
                                      first=True))]  # fmt: skip

    def _options(self, model: str | None) -> BodyOptions:
        """The body options for a request to `model` (None: the target's)."""
        if model is None:
            return self.config.body_options
        options = self._by_model.get(model)
        if options is None:
            options = self._by_model[model] = replace(self.config.body_options, model=model)
        return options

    def _settle_cancelled(self, exchange: Exchange) -> None:
        """Take the exchange off the live list; still unsettled: it was cancelled in flight."""
        if self._live.pop(exchange.plan.request_id, None) is None:
            return
        self.stats.in_flight -= 1
        self.stats.in_flight_by_class[exchange.plan.class_name] -= 1
        for timer in exchange.timers:
            timer.cancel()
        if not exchange.settled:  # cancelled mid-request: the connection is unusable
            exchange.then = None
            if exchange.conn is not None:
                exchange.conn.detach()
            exchange.outcome = Outcome.CANCELLED
            exchange.error = "run interrupted while this request was in flight"
            exchange.end_ns = self._now()

    def _encode(self, exchange: Exchange, messages: Sequence[Message] | None) -> bytes:
        """The request's bytes: the prompt, the body, the headers (its id recorded)."""
        plan = exchange.plan
        if messages is None:
            messages = self._messages(plan)
        headers = self._headers(exchange)  # first: it records the id the body carries too
        body = self._body(plan, messages, exchange.request_id_sent)
        if LOGGER.isEnabledFor(logging.DEBUG):
            point = self.connector.endpoint
            sent = {**point.headers, **headers}
            LOGGER.debug("request %d: POST %s%s headers %s", plan.request_id, point.origin,
                         point.target, sent)  # fmt: skip
        return encode_request(self.connector.endpoint, body, headers)

    def _body(
        self, plan: RequestPlan, messages: Sequence[Message], request_id: str | None
    ) -> bytes:
        config = self.config
        body = config.adapter.build_body(messages, plan.output_tokens, self._options(plan.model))
        if plan.priority is not None and config.priority_header is None:
            body["priority"] = plan.priority
        put_in_body(body, config.adapter.name, config.request_id_body, request_id)
        return orjson.dumps(body)

    # -- flows --------------------------------------------------------------------------
    async def _flow(self, flow: Flow, wave: list[tuple[Exchange, bytes, bool]]) -> None:
        if flow.kind == "batch":
            await self._batch(flow, wave)
        else:
            await self._conversation(flow)

    async def _conversation(self, flow: Flow) -> None:
        """A chat session or agent trajectory: turns in strict sequence, each after the last.

        A turn's intended time is the previous turn's end plus its think (or tool) time. A
        failed turn, or a trajectory budget spent, ends the flow: the rest are `skipped`.
        """
        if flow.kind == "trajectory" and flow.grow:
            await Trajectory(self, flow).run()
            return
        t0 = self.t0_ns
        history: list[Message] = []
        if flow.system_prompt_tokens:
            history.append(("system", self._system_prompt(flow)))
        budget_end = t0 + flow.start_ns + int(flow.budget_s * 1e9) if flow.budget_s else None
        context, previous_output, due = "", "", t0 + flow.start_ns
        for index, plan in enumerate(flow.plans):
            if index:
                due += int(plan.delay_s * 1e9)
                if not await self._wait_unless_stopped(due):
                    return  # the rest are recorded as not_sent by run()
            if budget_end is not None and self._now() >= budget_end:
                self._skip(flow.plans[index:], f"trajectory budget of {flow.budget_s:g} s spent")
                return
            if flow.kind == "trajectory":  # the fixed context (grow: false), set by hop 0
                context = context or self.prompts.text(plan.request_id, plan.prompt_tokens,
                                                       first=True)  # fmt: skip
                turn_text = f"{context}\n\n{previous_output}" if previous_output else context
                messages: list[Message] = [("user", turn_text)]
            else:
                history.extend(self._turn(plan, first=not history))
                messages = list(history)
            exchange = await self._request(self._sent(plan, messages, due, budget_end),
                                           self._now(), messages, True)  # fmt: skip
            if exchange.outcome is not Outcome.OK:
                step = "hop" if flow.kind == "trajectory" else "turn"
                reason = f"{step} {index} ended {exchange.outcome}"
                self._skip(flow.plans[index + 1 :], reason)
                return
            previous_output = "".join(exchange.texts)
            recorded = plan.recorded_answer if flow.history == "recorded" else None
            history.append(("assistant", previous_output if recorded is None else recorded))
            due = exchange.end_ns or self._now()

    def _turn(self, plan: RequestPlan, *, first: bool) -> Sequence[Message]:
        """A session turn's new messages (the session's first message has the nonce)."""
        prompts = self.prompts
        if plan.messages:
            return prompts.lead_messages(plan.messages) if first else plan.messages
        return [("user", prompts.text(plan.request_id, plan.prompt_tokens, first=first))]

    def _system_prompt(self, flow: Flow) -> str:
        """One system prompt per class, the same for all its flows (prefix caching); it is
        their first message, so it starts with a cold run's nonce."""
        class_key = -1 - zlib.crc32(flow.class_name.encode())
        return self.prompts.text(class_key, flow.system_prompt_tokens, first=True)

    def _sent(self, plan: RequestPlan, messages: Sequence[Message], due_ns: int,
              budget_end_ns: int | None) -> RequestPlan:  # fmt: skip
        """The plan as sent: its real intended time, the context it carries (tokens), and
        its deadlines cut to what is left of the trajectory's budget."""
        return replace(
            plan,
            intended_ns=due_ns - self.t0_ns,
            prompt_tokens=sum(self.prompts.count(text) for _, text in messages),
            deadlines=_within_budget(plan.deadlines, budget_end_ns, due_ns),
        )

    async def _batch(self, flow: Flow, wave: list[tuple[Exchange, bytes, bool]]) -> None:
        """Documents sent closed-loop: `concurrency` at a time, the next when one ends.

        The first wave was started by the scheduler at the flow's start (its intended time).
        Each later document is encoded while its predecessor streams and sent in the very
        callback that ends the predecessor's use of its connection (`Exchange.then`), on
        that connection; its intended time is that end's stamp, so sent − intended is the
        client's turnaround. When the callback cannot (the stream settled but its
        connection is still open), the worker sends it once the predecessor is recorded.
        """
        plans = list(flow.plans)
        if not wave:  # encoded late: the scheduler had no time to do it ahead
            now = self._now()
            made = [self._prepare(p) for p in plans[: flow.concurrency]]
            wave = [(e, r, self._go(e, r, now)) for e, r in made]
        pending = iter(plans[len(wave) :])

        async def worker(exchange: Exchange, request: bytes, sent: bool) -> None:
            while True:
                plan = None if self._stopping.is_set() else next(pending, None)
                box: list[tuple[Exchange, bytes, bool]] = []
                if plan is not None:  # made while this one streams
                    following = self._prepare(plan)
                    exchange.then = partial(self._turnaround, following, box)
                await self._follow(exchange, request, sent)
                if plan is None:
                    return
                exchange.then = None
                if not box:
                    if self._stopping.is_set():
                        return  # not sent: run() records it as not_sent
                    self._turnaround(following, box, exchange.end_ns or self._now())
                exchange, request, sent = box[0]

        async with anyio.create_task_group() as tg:
            workers = Starts(tg)
            for exchange, request, sent in wave:
                workers.start(worker, exchange, request, sent)
            await workers.wait()

    def _turnaround(
        self,
        following: tuple[Exchange, bytes],
        box: list[tuple[Exchange, bytes, bool]],
        t_ns: int,
    ) -> None:
        """The closed loop's next send, due at `t_ns` (its predecessor's end): in the
        callback where that stream ended, or from the worker when the callback could not."""
        if self._stopping.is_set():
            return
        exchange, request = following
        sent = self._go(exchange, request, self._now())  # nothing before the write reads the
        exchange.plan = replace(exchange.plan, intended_ns=t_ns - self.t0_ns)  # intended time
        box.append((exchange, request, sent))

    def _skip(self, plans: Sequence[RequestPlan], reason: str) -> None:
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
        loop = asyncio.get_running_loop()
        self._arm(exchange)  # written already (`_launch`) or not: from the intended time
        try:
            for attempt in range(2):
                if not (sent and attempt == 0) and not await self._send(exchange, request):
                    return
                await asyncio.shield(exchange.done)
                if not (attempt == 0 and exchange.will_retry()):
                    return
                # A kept-alive connection the server had closed: retry once on a fresh one.
                exchange.retries += 1
                self.stats.retries += 1
                exchange.lost_before_response = False
                exchange.done = loop.create_future()
                exchange.settled = False
                exchange.outcome = exchange.error = None
        finally:
            for timer in exchange.timers:
                timer.cancel()

    def _headers(self, exchange: Exchange) -> dict[str, str]:
        """The request's own headers: its id and priority (unless the user set the same
        names: theirs replace loadgen's), then the configured ones. The id is recorded."""
        plan, config = exchange.plan, self.config
        headers, exchange.request_id_sent = self.ids.headers(plan.request_id)
        if plan.priority is not None and config.priority_header is not None:
            headers[config.priority_header] = str(plan.priority)
        user = {k.lower() for k in self.connector.endpoint.headers}
        headers = {k: v for k, v in headers.items() if k.lower() not in user}
        headers = merged(headers, config.request_headers)
        if config.headers_for is not None:
            headers = merged(headers, config.headers_for(plan))
        return headers

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
        message = connect_message(exc) if isinstance(exc, OSError) else f"connect failed: {exc!r}"
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


def _at_once(callback: Callable[[], None]) -> None:
    callback()


def _resolve(done: asyncio.Future[None]) -> None:
    """Mark an exchange's future done (unless cancelled meanwhile: an interrupted run)."""
    if not done.done():
        done.set_result(None)


def connection_label(conn: Link) -> str:
    """Which connection a request used: `new` (opened for it, its setup inside its latency),
    `warm` (opened before t0, first use) or `reused` (kept alive from an earlier exchange)."""
    if not conn.reused:
        return "new"
    return "warm" if conn.warm and conn.exchanges == 0 else "reused"


def connect_message(exc: OSError) -> str:
    """A short, secret-free description of a connection failure."""
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"connect failed: {text}"


def _within_budget(deadlines: Deadlines, budget_end_ns: int | None, due_ns: int) -> Deadlines:
    """A hop's total deadline, cut to what is left of its trajectory's budget."""
    if budget_end_ns is None:
        return deadlines
    left_s = max(0.001, (budget_end_ns - due_ns) / 1e9)
    return replace(deadlines, total_s=min(deadlines.total_s, left_s))
