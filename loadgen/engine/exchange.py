"""One request's exchange: the sink its connection reports to, its timers, its one record.

Part of the engine (plans → engine → records), below the scheduler (`runner.Engine`) and
the flows (`flows`, `agents`), which start exchanges and read what happened. The per-chunk
path lives here (`Exchange.on_body` → `_event`): it stamps, counts and keeps what the record
needs, and does nothing else. Every failure is mapped to an `Outcome` in one place
(`Exchange.finish`, from `_clean_end_outcome` for a stream that ended by itself; `record`
only judges an ok stream's token count): nothing here raises for one request.

Memory per request is capped: one stream event at its class's `max_event_bytes`, an error
body at `MAX_ERROR_BODY` (past either, the request ends and its connection closes); the
arrival stamps of its output chunks at `chunk_stamp_cap` (past it, the stream goes on: its
chunks are counted and their gaps summarised by the largest, so N, TPOT and E2E stay whole);
the answer text kept for the next turn at `MAX_KEPT_TEXT_CHARS`; the usage problems it
quotes at `QUOTE_CHARS`. A normal stream meets none of these; the per-chunk cost of the
stamp cap is one length check.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from loadgen.adapters.protocol import Adapter, MalformedEvent, new_decoder
from loadgen.adapters.sse import DEFAULT_MAX_EVENT_BYTES, EventTooLarge, size_text
from loadgen.engine.clock import SYSTEM_CLOCK, Clock
from loadgen.engine.intermediaries import explain
from loadgen.engine.logs import LOGGER
from loadgen.engine.secrets import Redactor
from loadgen.engine.transport import Link
from loadgen.results.records import (
    TIME_COLUMNS,
    UNSTREAMED_TOKENS,
    Outcome,
    RequestRecord,
    TokenSource,
    reported_timings,
    usage_disagrees,
)
from loadgen.workload.plans import RequestPlan

# An error response's body is read up to this many bytes, then the request ends (with its
# HTTP outcome: the status already said what happened) and the connection is closed.
MAX_ERROR_BODY = 2048
QUOTE_CHARS = 300  # server text shown in a record's error (a body, an error event, a reason)
QUOTE_EVENT_CHARS = 120  # of a malformed event's payload
NO_SECRETS = Redactor()
# Output chunks whose arrival times a request keeps (`chunk_stamp_cap`): at least this many,
# and twice its max_tokens. A stream sends at most one chunk per token, so a normal stream
# keeps every stamp; a server streaming tiny events for ever (2 GiB of stamps in 25 s, before
# this cap) keeps this many, ~48 bytes each.
MIN_CHUNK_STAMPS = 65_536
# A session's (or trajectory's) answer text kept for its next turn, in characters: 8 times
# the text of a 128k-token answer at 4 characters a token; a 1.2 GB answer took 4.9 GiB
# before this cap. The next turn carries the answer's first this many characters.
MAX_KEPT_TEXT_CHARS = 1 << 22


def chunk_stamp_cap(max_tokens: int) -> int:
    """The output chunks whose arrival times a request with this max_tokens keeps."""
    return max(MIN_CHUNK_STAMPS, 2 * max_tokens)


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
        max_chunk_stamps: int | None = None,
        max_text_chars: int | None = None,
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
        # Characters of answer text still to keep; past it `text_cut`, and no more is kept.
        self.max_text_chars = MAX_KEPT_TEXT_CHARS if max_text_chars is None else max_text_chars
        self.text_room = self.max_text_chars
        self.text_cut = False
        self.stall_ns = int(plan.deadlines.stall_s * 1e9)
        self.reused_connection = False
        self.connection: str | None = None  # new, warm or reused (`connection_label`)
        # The closed loop's next send, run in the callback that ends this exchange's use of
        # its connection (`flows.batch`); called once, with that read's stamp.
        self.then: Callable[[int], None] | None = None
        self.timers: list[asyncio.TimerHandle] = []
        self.holds_slot = False  # took a max_in_flight slot without waiting (`Engine.start`)
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
        self.server_timings: dict[str, Any] | None = None  # as the adapter reported it
        self.last_token_ns: int | None = None
        self.end_ns: int | None = None
        self.chunk_ns: list[int] = []
        self.chunk_chars: list[int] = []
        # Chunks past the stamp cap: counted, their gaps summarised by the largest.
        self.max_chunk_stamps = (
            chunk_stamp_cap(plan.output_tokens) if max_chunk_stamps is None else max_chunk_stamps
        )
        self.unstamped_chunks = 0
        self.unstamped_chars = 0
        self.unstamped_max_gap_ns: int | None = None
        self.unplaced_hidden = 0  # token-only events past the cap (counted, not placed)
        # Network reads that carried output: reads are told apart by their arrival stamps
        # (every event of one read carries that read's), counted as the events come.
        self.output_reads = 0
        self._read_ns = -1  # the stamp of the last read that carried output
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
        self.traceparent: str | None = None  # the W3C traceparent it carried (the last attempt's)
        self.finish_reason: str | None = None  # the API's stop reason, as it sent it
        self.hidden_at: list[int] = []  # token-only events: index of the chunk after each
        self.body_bytes = 0  # response body bytes received (bounds a plausible usage count)
        # What bounds the tokens the stream could carry (`carried_tokens`): the output
        # events' payload bytes, those of the events with a tool call, the token-only events.
        self.event_framing = adapter.event_framing
        self.output_bytes = 0
        self.tool_events = 0
        self.tool_bytes = 0
        self.token_only_events = 0
        self.usage_beyond_stream = False  # usage above `carried_tokens`: N from the stream
        self.request_bytes = 0  # the request's bytes (bounds a plausible prompt count)
        self.usage_problem: str | None = None  # usage counts it could not take (as text)
        self.answered_by: tuple[str | None, str | None] = (None, None)  # an error's Server, Via

    # -- ExchangeSink ------------------------------------------------------------------
    def on_head(self, status: int, headers: Mapping[str, str], t_ns: int) -> None:
        self.status = status
        self.headers_ns = t_ns
        self.content_type = headers.get("content-type", "")
        self.response_id = headers.get("x-request-id")  # a body `id` replaces it
        if status >= 400:  # who wrote an error page: the server, or a proxy in front
            self.answered_by = (headers.get("server"), headers.get("via"))

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
            if t_ns != self._read_ns:
                self._read_ns = t_ns
                self.output_reads += 1
            if self.first_token_ns is None:
                self.first_token_ns = t_ns
                self.start_stall_watch()
            if delta.content_chars and self.first_content_ns is None:
                self.first_content_ns = t_ns
            if delta.reasoning_chars and self.first_reasoning_ns is None:
                self.first_reasoning_ns = t_ns
            if self.keep_text and delta.text:
                self._keep_text(delta.text)
            stamps = self.chunk_ns
            if len(stamps) < self.max_chunk_stamps:
                stamps.append(t_ns)
                self.chunk_chars.append(delta.content_chars + delta.reasoning_chars or 1)
            else:
                self._unstamped(t_ns, delta.content_chars + delta.reasoning_chars or 1)
            self.last_token_ns = t_ns
            self.output_bytes += len(payload)
            if delta.has_tool_call:
                self.tool_events += 1
                self.tool_bytes += len(payload)
        elif delta.token_only:
            self.token_only_events += 1
            if self.first_token_ns is not None:
                room = self.max_chunk_stamps
                if len(self.chunk_ns) < room and len(self.hidden_at) < room:
                    self.hidden_at.append(len(self.chunk_ns))
                else:
                    self.unplaced_hidden += 1
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

    def _keep_text(self, text: str) -> None:
        """Keep answer text for the next turn, up to its cap; past it keep nothing more."""
        if len(text) <= self.text_room:
            self.texts.append(text)
            self.text_room -= len(text)
            return
        self.texts.append(text[: self.text_room])
        self.text_room = 0
        self.text_cut, self.keep_text = True, False
        LOGGER.warning("request %d: its answer passed the %s-character cap on the text kept "
                       "for the next turn, which carries only that much of it",
                       self.plan.request_id, f"{self.max_text_chars:,}")  # fmt: skip

    def _unstamped(self, t_ns: int, chars: int) -> None:
        """A chunk past the stamp cap: counted, its gap kept only if it is the largest."""
        gap_ns = t_ns - (self.last_token_ns or t_ns)
        if self.unstamped_max_gap_ns is None or gap_ns > self.unstamped_max_gap_ns:
            self.unstamped_max_gap_ns = gap_ns
        self.unstamped_chunks += 1
        self.unstamped_chars += chars

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

    def reset_for_retry(self) -> None:
        """Unsettle a request lost unanswered (`will_retry`), to be sent once more on a fresh
        connection: what it measured of the lost attempt is overwritten by the retry's."""
        self.retries += 1
        self.lost_before_response = False
        self.done = asyncio.get_running_loop().create_future()
        self.settled = False
        self.outcome = self.error = None

    def cancel(self, t_ns: int) -> None:
        """Settle, as cancelled, a request still in flight when its task was cancelled (an
        interrupted run): its connection is unusable and no closed-loop send follows it."""
        self.then = None
        self.finish(t_ns, Outcome.CANCELLED, "run interrupted while this request was in flight")

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
            page = self.error_body[:MAX_ERROR_BODY].decode("utf-8", "replace")
            if (note := explain(status, *self.answered_by, page)) is not None:
                message += f" ({note})"
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
        """A deadline fired: settle as that timeout (the connection is dropped). After an
        error status the status already said what happened: the request is that HTTP
        outcome, with what arrived of its body (a 500 whose body trickles is no timeout)."""
        if self.status is not None and self.status >= 300:
            outcome, said = self._clean_end_outcome()
            message = f"{said} (the rest of its body not read: {message})"
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
        tokens (when no reasoning or tool output, which is not in the text, came, and the
        text was kept whole); else the count of token-bearing events: every output chunk and
        every token-only event after the first output (each token-only event is counted in
        the output chunk after it). Past the stamp cap the list covers the stamped chunks
        (`_apportioned`); N counts every chunk.
        """
        stamped = len(self.chunk_ns)
        if self.usage_completion is not None and stamped and not self.usage_beyond_stream:
            tokens = self.usage_completion
            return tokens, TokenSource.USAGE, self._apportioned(tokens)
        if not stamped:
            source = TokenSource.USAGE if self.usage_completion else TokenSource.NONE
            return self.usage_completion or 0, source, []
        if (self.count_tokens is not None and self.first_reasoning_ns is None and self.texts
                and not self.text_cut):  # fmt: skip
            tokens = max(1, self.count_tokens("".join(self.texts)))
            return tokens, TokenSource.TEXT, self._apportioned(tokens)
        per_chunk = [1] * stamped
        for index in self.hidden_at:
            per_chunk[min(index, stamped - 1)] += 1
        return self.counted_tokens(), TokenSource.CHUNKS, per_chunk

    def counted_tokens(self) -> int:
        """Token-bearing events that arrived: output chunks and token-only events after
        the first output, those past the stamp cap included."""
        chunks = len(self.chunk_ns) + self.unstamped_chunks
        return chunks + len(self.hidden_at) + self.unplaced_hidden

    def _apportioned(self, tokens: int) -> list[int]:
        """`tokens` over the stamped chunks (`apportion`): all of them when every chunk is
        stamped, else the stamped chunks' share of the text."""
        if self.unstamped_chunks:
            stamped = sum(self.chunk_chars)
            tokens = tokens * stamped // (stamped + self.unstamped_chars)
        return apportion(tokens, self.chunk_chars)

    def _usage_problem(self, problem: str) -> None:
        """Note a usage count the server cannot mean (kept as text, never as a figure); the
        first `QUOTE_CHARS` of them, as a server may send one in every event."""
        text = f"{self.usage_problem}; {problem}" if self.usage_problem else problem
        self.usage_problem = text if len(text) <= QUOTE_CHARS else text[: QUOTE_CHARS - 1] + "…"

    def carried_tokens(self) -> int:
        """The most output tokens the stream that arrived could carry.

        A token takes at least a byte of text, and an output event at least one token. So
        the output events carry at most their payload bytes past their API's framing
        (`Adapter.event_framing`), and at most the UTF-8 bytes of their text, which are at
        most `UTF8_MAX_BYTES` per character (a tool call's arguments are not in the text:
        those events count by their bytes). Add each token-only event and the EOS a
        server counts but does not stream (`UNSTREAMED_TOKENS`).
        """
        framing = self.event_framing
        events = len(self.chunk_ns) + self.unstamped_chunks  # past the stamp cap too
        by_bytes = self.output_bytes - framing * events
        chars = sum(self.chunk_chars) + self.unstamped_chars  # a bare tool call's counts 1
        by_text = UTF8_MAX_BYTES * chars + self.tool_bytes - framing * self.tool_events
        carried = max(min(by_bytes, by_text), events)
        return carried + self.token_only_events + UNSTREAMED_TOKENS

    def check_usage(self) -> None:
        """Drop, as a usage problem, counts above what this exchange could hold: output
        tokens above both the planned cap and the response's bytes (a streamed token takes
        at least a byte; hidden reasoning is within the cap), prompt tokens above the
        request's bytes plus `PROMPT_TEMPLATE_TOKENS` (a chat template's own tokens).

        An output count within those but above what the output events could carry
        (`carried_tokens`: hidden reasoning, or a server's own count) is kept as the
        server's count (`usage_output_tokens`, a disagreement) but not taken as N: N, and
        TPOT with it, come from the stream, so a count can never make TPOT shorter than
        the events show."""
        output_cap = max(self.plan.output_tokens, self.body_bytes)
        if self.usage_completion is not None and self.usage_completion > output_cap:
            self._usage_problem(
                f"output tokens={self.usage_completion} (more than the {self.body_bytes} "
                f"bytes that arrived could hold, and over max_tokens {self.plan.output_tokens})"
            )
            self.usage_completion = None
        if self.usage_completion is not None and self.chunk_ns:
            self.usage_beyond_stream = self.usage_completion > self.carried_tokens()
        prompt_cap = self.request_bytes + PROMPT_TEMPLATE_TOKENS
        if self.usage_prompt is not None and self.request_bytes and self.usage_prompt > prompt_cap:
            self._usage_problem(
                f"prompt tokens={self.usage_prompt} (more than the {self.request_bytes}-byte "
                "request could hold)"
            )
            self.usage_prompt = None

    def record(self) -> RequestRecord:
        """The one record of this request (relative times).

        Every time on the run clock the exchange stamps (`STAMPED`: the record's time
        columns under their own names) goes in relative to t0, by the column table: a new
        time column needs its field and its stamp, nothing here."""
        outcome = self.outcome or Outcome.CANCELLED
        self.check_usage()
        tokens, source, per_chunk = self.output_tokens()
        counted = self.counted_tokens()
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
        times: dict[str, Any] = {}  # RequestRecord's keywords: Any, each an int or None
        for name in STAMPED:
            stamped: int | None = getattr(self, name)
            times[name] = None if stamped is None else stamped - t0
        return RequestRecord(
            **times,
            request_id=self.plan.request_id,
            class_name=self.plan.class_name,
            intended_ns=self.plan.intended_ns,
            outcome=outcome,
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
            server_timings=reported_timings(self.server_timings),
            request_id_sent=self.request_id_sent,
            traceparent=self.traceparent,
            finish_reason=self.finish_reason,
            stopped_early=stopped_early,
            usage_output_tokens=usage,
            counted_output_tokens=counted,
            usage_problem=self.usage_problem,
            unstamped_chunks=self.unstamped_chunks,
            unstamped_max_gap_ns=self.unstamped_max_gap_ns,
            output_events=len(self.chunk_ns) + self.unstamped_chunks,
            output_reads=self.output_reads,
            connection=self.connection,
            model=self.model,
            cached_prompt_tokens=self.cached_tokens,
            server_request_id=self.redactor.quote(self.response_id, 200)
            if self.response_id is not None
            else None,
        )


# The record's times on the run clock the exchange stamps itself, each an attribute of the
# column's name holding an absolute clock value: every scalar time column but the plan's
# intended time (relative already). `chunk_ns`, a list, is made relative in `record`.
STAMPED: tuple[str, ...] = tuple(
    c.attribute for c in TIME_COLUMNS if not c.is_list and c.attribute != "intended_ns"
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


UTF8_MAX_BYTES = 4  # bytes of one character in UTF-8, at most

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


def _at_once(callback: Callable[[], None]) -> None:
    callback()


def _resolve(done: asyncio.Future[None]) -> None:
    """Mark an exchange's future done (unless cancelled meanwhile: an interrupted run)."""
    if not done.done():
        done.set_result(None)
