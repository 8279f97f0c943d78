"""The engine against scripted responses: outcomes, clocks, retries, open loop.

Every test that scripts a server runs twice (the `engine_run` fixture): over a loopback
socket in real time, where timing assertions are lower bounds (a server pause guarantees
at least that much) or orderings, never upper bounds on wall-clock time, so they hold on
a loaded machine; and in virtual time, where the same run is exact and the test also
asserts the interval the script set, to the nanosecond.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

from conftest import EngineRun
from hypothesis import given
from hypothesis import strategies as st

from loadgen.engine.exchange import apportion
from loadgen.results.records import Outcome, TokenSource
from loadgen.testing import (
    CLOSE,
    LAST_CHUNK,
    RESET,
    PlanFactory,
    ReceivedRequest,
    ScriptedServer,
    Step,
    chat_chunk,
    chunk,
    head,
    run_engine,
    simple_chat,
    sse,
    stream_steps,
    usage,
)
from loadgen.testing.virtual import run_scripted
from loadgen.workload.spec import Deadlines

MS = 1_000_000
FAST = Deadlines(first_token_s=3, stall_s=0.4, total_s=6)


def by_case(cases: dict[str, list]) -> object:
    """A handler that plays the script named by the request's X-Case header."""
    return lambda request: cases[request.headers["x-case"]]


def run_cases(
    engine_run: EngineRun, cases: dict[str, list], order: list[str], **kwargs: object
) -> tuple[list, object]:
    """One plan per case in `order`, 5 ms apart, each answered by its case's script."""
    plans = PlanFactory(deadlines=FAST).at(*[0.005 * i for i in range(len(order))])
    return engine_run(
        plans, by_case(cases), headers_for=lambda p: {"X-Case": order[p.request_id]}, **kwargs
    )


def test_clean_stream_clocks_and_counts(engine_run: EngineRun) -> None:
    """A normal stream is ok, N comes from usage, and the clocks are ordered."""
    (record,), server = run_cases(engine_run, {"ok": simple_chat(5, gap_s=0.01)}, ["ok"])
    assert record.outcome is Outcome.OK
    assert (record.output_tokens, record.token_source) == (5, TokenSource.USAGE)
    assert list(record.chunk_tokens) == [1] * 5
    assert len(record.chunk_ns) == 5
    assert record.intended_ns <= record.dispatched_ns <= record.sent_ns <= record.headers_ns
    assert record.headers_ns <= record.first_token_ns == record.chunk_ns[0]
    assert record.last_token_ns == record.chunk_ns[-1] <= record.end_ns
    assert record.prompt_tokens == 10
    assert record.prompt_tokens_target == 8
    body = server.requests[0].body
    assert body["stream"] is True
    assert body["max_tokens"] == 4
    if engine_run.exact:  # sent on time; the role chunk with the head, then a token each 10 ms
        assert record.sent_ns == record.headers_ns == record.intended_ns
        assert record.first_token_ns - record.headers_ns == 10 * MS
        assert [b - a for a, b in pairwise(record.chunk_ns)] == [10 * MS] * 4


def test_early_role_chunk_and_heartbeats_do_not_stop_ttft(engine_run: EngineRun) -> None:
    """TTFT waits for the first content, not the early role chunk or `:` heartbeats."""
    events = [chat_chunk(role="assistant")]
    steps = [
        head(),
        chunk(events[0]),
        chunk(b": ping\n\n"),
        0.15,
        chunk(b": ping\n\n"),
        0.15,
        chunk(chat_chunk("a")),
        chunk(chat_chunk("b", finish="stop")),
        chunk(sse("[DONE]")),
        LAST_CHUNK,
    ]
    (record,), _ = run_cases(engine_run, {"early": steps}, ["early"])
    assert record.outcome is Outcome.OK
    assert record.first_token_ns - record.headers_ns >= 300 * MS
    assert (record.output_tokens, record.token_source) == (2, TokenSource.CHUNKS)
    if engine_run.exact:
        assert record.first_token_ns - record.headers_ns == 300 * MS


def test_reasoning_then_content_stamps_both(engine_run: EngineRun) -> None:
    """A reasoning delta is the first generated token; the first visible content is stamped too."""
    events = [chat_chunk(reasoning="think")]
    steps = stream_steps([*events, chat_chunk(" answer", finish="length")], gap_s=0.1)
    (record,), _ = run_cases(engine_run, {"r": steps}, ["r"])
    assert record.outcome is Outcome.OK
    assert record.first_content_ns - record.first_token_ns >= 100 * MS
    if engine_run.exact:
        assert record.first_content_ns - record.first_token_ns == 100 * MS


def test_multi_token_chunks_apportion_usage(engine_run: EngineRun) -> None:
    """Usage above the chunk count is spread over chunks by text length; the total is kept."""
    events = [
        chat_chunk(" a b c d"),
        chat_chunk(" e"),
        chat_chunk(" f", finish="stop", usage=usage(6)),
    ]
    (record,), _ = run_cases(engine_run, {"k": stream_steps(events)}, ["k"])
    assert record.output_tokens == 6
    assert sum(record.chunk_tokens) == 6
    assert record.chunk_tokens[0] > record.chunk_tokens[1]


def test_failures_are_classified_and_none_lost(engine_run: EngineRun) -> None:
    """429, 500, a reset, malformed data and bad framing each get their outcome; partial output is kept."""
    cases = {
        "429": [head(429, chunked=False, length=9), b'{"e":"x"}'],
        "500": [head(500, chunked=False, length=14), b'{"error":"no"}'],
        "reset": [*simple_chat(5, gap_s=0.01)[:5], RESET],
        "garbage": [head(), chunk(chat_chunk("a")), chunk(b"data: {not json\n\n"), LAST_CHUNK],
        "framing": [head(), chunk(chat_chunk("a")), b"zz\r\n", 0.2],
        "error_event": [
            head(),
            chunk(chat_chunk("a")),
            chunk(sse({"error": {"message": "boom"}})),
            LAST_CHUNK,
        ],
        "empty": stream_steps([chat_chunk(role="assistant"), chat_chunk(finish="stop")]),
    }
    order = list(cases)
    records, _ = run_cases(engine_run, cases, order)
    outcome = {case: r.outcome for case, r in zip(order, records, strict=True)}
    assert outcome == {
        "429": Outcome.REJECTED,
        "500": Outcome.HTTP_ERROR,
        "reset": Outcome.STREAM_ERROR,
        "garbage": Outcome.STREAM_ERROR,
        "framing": Outcome.STREAM_ERROR,
        "error_event": Outcome.STREAM_ERROR,
        "empty": Outcome.STREAM_ERROR,
    }
    assert records[1].http_status == 500
    assert "no" in records[1].error
    assert records[2].output_tokens >= 1  # tokens before the reset are kept
    assert "boom" in records[5].error


def test_deadlines_each_have_their_outcome(engine_run: EngineRun) -> None:
    """No first token, a stall and an overlong stream map to the three timeout outcomes."""
    deadlines = Deadlines(first_token_s=0.3, stall_s=0.3, total_s=0.8)
    cases = {
        "slow_first": [head(), chunk(chat_chunk(role="assistant")), 2.0],
        "stall": [head(), chunk(chat_chunk("a")), 2.0],
        "long": [
            head(),
            *[s for i in range(40) for s in (chunk(chat_chunk("x")), 0.05)],
            LAST_CHUNK,
        ],
    }
    order = list(cases)
    plans = PlanFactory(deadlines=deadlines).at(0.0, 0.0, 0.0)
    records, _ = engine_run(
        plans, by_case(cases), headers_for=lambda p: {"X-Case": order[p.request_id]}
    )
    assert [r.outcome for r in records] == [
        Outcome.TIMEOUT_FIRST_TOKEN,
        Outcome.TIMEOUT_STALL,
        Outcome.TIMEOUT_TOTAL,
    ]
    assert records[2].output_tokens >= 2
    if engine_run.exact:  # each deadline fires at its time: 0.3 s, 0.3 s after "a", 0.8 s
        assert [r.end_ns - r.intended_ns for r in records] == [300 * MS, 300 * MS, 800 * MS]
        assert records[2].output_tokens == 16  # a token every 50 ms from 0 to 750 ms


def test_missing_done_and_close_delimited_bodies_are_fine(engine_run: EngineRun) -> None:
    """No [DONE] (usage in the finish chunk) and a close-delimited body are clean ends."""
    nodone = stream_steps(
        [chat_chunk("a"), chat_chunk("b", finish="stop", usage=usage(2))], done=False
    )
    close_delimited = stream_steps(
        [chat_chunk("a"), chat_chunk("b", finish="length")], chunked=False
    )
    records, _ = run_cases(
        engine_run, {"nodone": nodone, "close": close_delimited}, ["nodone", "close"]
    )
    assert [r.outcome for r in records] == [Outcome.OK, Outcome.OK]
    assert records[0].token_source is TokenSource.USAGE


def test_server_closing_after_each_stream_causes_no_failure(engine_run: EngineRun) -> None:
    """A server that closes every connection after a stream (as llama.cpp does) fails nothing."""
    steps = [*simple_chat(3)[:-1], LAST_CHUNK, CLOSE]
    plans = PlanFactory(deadlines=FAST).at(*[0.02 * i for i in range(10)])
    records, server = engine_run(plans, lambda r: steps)
    assert all(r.outcome is Outcome.OK for r in records)
    assert server.connections >= 1


def test_reused_connection_closed_unanswered_is_retried_once(engine_run: EngineRun) -> None:
    """When a kept-alive connection dies before any response byte, the request is retried once."""
    seen: dict[int, int] = {}

    def handler(request: ReceivedRequest) -> list:
        seen[request.connection] = seen.get(request.connection, 0) + 1
        if request.connection == 0 and seen[0] == 2:
            return [CLOSE]  # the second request on the first connection is dropped unanswered
        return simple_chat(2)

    plans = PlanFactory(deadlines=FAST).at(0.0, 0.3)
    records, server = engine_run(plans, handler)
    assert [r.outcome for r in records] == [Outcome.OK, Outcome.OK]
    assert [r.retries for r in records] == [0, 1]
    assert server.connections == 2


def test_unreachable_target_records_every_plan() -> None:
    """Connection refused: every plan is recorded as connect_error, none lost."""
    with ScriptedServer(lambda r: []) as server:
        url = server.url  # a port that is closed once the server stops
    records = run_engine(PlanFactory().at(0, 0.01, 0.02), url)
    assert [r.outcome for r in records] == [Outcome.CONNECT_ERROR] * 3
    assert all("connect failed" in (r.error or "") for r in records)


def test_refused_connections_in_virtual_time_record_every_plan_on_time() -> None:
    """Nothing listening, in virtual time: every plan is a connect_error, each ended the
    moment it was sent."""
    records, pool = run_scripted(PlanFactory().at(0, 0.01, 0.02), lambda r: [], refuse=True)
    assert [r.outcome for r in records] == [Outcome.CONNECT_ERROR] * 3
    assert all(r.error == "connect failed: Connection refused" for r in records)
    assert [r.end_ns for r in records] == [r.intended_ns for r in records] == [0, 10 * MS, 20 * MS]
    assert pool.requests == []


def test_open_loop_a_hung_request_does_not_delay_the_next_send(engine_run: EngineRun) -> None:
    """Request 1 is sent on schedule while request 0 is still waiting for its first token."""
    cases = {"hang": [head(), 1.0, *simple_chat(1)[1:]], "ok": simple_chat(1)}
    plans = PlanFactory(deadlines=FAST).at(0.0, 0.1)
    order = ["hang", "ok"]
    records, _ = engine_run(
        plans, by_case(cases), headers_for=lambda p: {"X-Case": order[p.request_id]}
    )
    assert records[1].sent_ns < records[0].first_token_ns
    assert records[1].end_ns < records[0].first_token_ns
    if engine_run.exact:  # request 1 went out at 100 ms; request 0's token came at 1 s
        assert (records[1].sent_ns, records[0].first_token_ns) == (100 * MS, 1000 * MS)


def test_coordinated_omission_wait_behind_in_flight_cap_counts(engine_run: EngineRun) -> None:
    """Known answer: behind --max-in-flight 1, a 1 s stall shows up in the delayed request's TTFT."""
    cases = {"slow": [head(), 1.0, *simple_chat(1)[1:]], "ok": simple_chat(1)}
    plans = PlanFactory(deadlines=FAST).at(0.0, 0.1)
    order = ["slow", "ok"]
    records, _ = engine_run(
        plans,
        by_case(cases),
        max_in_flight=1,
        headers_for=lambda p: {"X-Case": order[p.request_id]},
    )
    delayed = records[1]
    ttft_from_intended = delayed.first_token_ns - delayed.intended_ns
    ttft_from_send = delayed.first_token_ns - delayed.sent_ns
    assert delayed.outcome is Outcome.OK
    assert delayed.sent_ns >= records[0].end_ns  # it waited for the slot
    assert ttft_from_intended - ttft_from_send >= 850 * MS  # the ~0.9 s wait is charged to it
    if engine_run.exact:  # the slot freed at 1 s: exactly 0.9 s of waiting charged to it
        assert delayed.sent_ns == records[0].end_ns == 1000 * MS
        assert ttft_from_intended - ttft_from_send == 900 * MS


def test_no_request_is_sent_before_its_intended_time(engine_run: EngineRun) -> None:
    """Loop timers may wake early; the scheduler still never dispatches before the intended time."""
    plans = PlanFactory(deadlines=FAST).at(*[0.003 * i for i in range(60)])
    records, _ = engine_run(plans, lambda r: simple_chat(1))
    assert all(r.outcome is Outcome.OK for r in records)
    assert all(r.intended_ns <= r.dispatched_ns <= r.sent_ns <= r.first_token_ns for r in records)
    if engine_run.exact:  # in virtual time at its time exactly, and answered at once
        assert all(r.dispatched_ns == r.intended_ns == r.first_token_ns for r in records)
    else:  # over loopback the answer takes time
        assert all(r.sent_ns < r.first_token_ns for r in records)


@given(st.integers(0, 500), st.lists(st.integers(0, 50), max_size=60))
def test_apportion_keeps_the_total_and_gives_each_chunk_a_token(
    tokens: int, weights: list[int]
) -> None:
    """Apportioned chunk tokens sum to N, and every chunk gets one when N ≥ chunks."""
    parts = apportion(tokens, weights)
    assert len(parts) == len(weights)
    if weights:
        assert sum(parts) == tokens
        assert min(parts) >= (1 if tokens >= len(weights) else 0)


def test_a_bug_parsing_one_connection_does_not_stall_the_others() -> None:
    """If one connection's parsing raises, the pool still parses every other connection."""
    import asyncio

    from loadgen.engine.transport import Connection, Pool, make_endpoint

    class Transport:
        def write(self, data: bytes) -> None: ...
        def abort(self) -> None: ...
        def close(self) -> None: ...
        def is_closing(self) -> bool:
            return False

    class Sink:
        def __init__(self, explode: bool) -> None:
            self.explode, self.statuses = explode, []

        def on_head(self, status, headers, t_ns) -> None:
            if self.explode:
                raise RuntimeError("a bug")
            self.statuses.append(status)

        def on_body(self, data, t_ns) -> None: ...
        def on_end(self, t_ns) -> None: ...
        def on_lost(self, reason, got, t_ns) -> None: ...

    async def main() -> list:
        loop = asyncio.get_running_loop()
        errors: list = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        pool = Pool(make_endpoint("http://127.0.0.1:1", "/v1/chat/completions", {}))
        good = Sink(explode=False)
        for sink in (Sink(explode=True), good):
            conn = Connection(pool)
            conn.connection_made(Transport())  # type: ignore[arg-type]
            conn.sink = sink
            conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        for _ in range(5):
            await asyncio.sleep(0)
        return [good.statuses, errors]

    statuses, errors = asyncio.run(main())
    assert statuses == [200]
    assert len(errors) == 1  # the bug is reported, not swallowed


def test_an_error_body_past_its_cap_ends_the_request_at_the_cap(engine_run: EngineRun) -> None:
    """A 429 or 500 whose body never ends keeps its HTTP outcome and says the body was cut
    at the cap: the client stops reading there (read on, it would end at the 6 s total
    deadline as timeout_total)."""

    def endless_error(status: int) -> Iterator[Step]:
        yield head(status, chunked=False, length=1 << 40)
        while True:
            yield b"<p>" + b"x" * 65_533
            yield 0.05

    records, _ = run_cases(
        engine_run, {"429": endless_error(429), "500": endless_error(500)}, ["429", "500"]
    )
    assert [r.outcome for r in records] == [Outcome.REJECTED, Outcome.HTTP_ERROR]
    for record in records:
        assert record.error.startswith(f"HTTP {record.http_status}: <p>xxx"), record.error
        assert record.error.endswith("(error body over the 2 KiB cap: not read on)")


def test_a_200_that_is_not_a_stream_says_its_content_type(engine_run: EngineRun) -> None:
    """A web page answered with 200 fails as a stream that carried no output, naming
    what it was."""
    page = b"<html><body>hello</body></html>"
    html = [b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%b"
            % (len(page), page)]  # fmt: skip
    records, _ = run_cases(engine_run, {"html": html}, ["html"])
    assert records[0].outcome is Outcome.STREAM_ERROR
    assert (
        records[0].error == "stream ended without any generated output (content-type 'text/html')"
    )


def test_an_event_over_the_cap_ends_the_request_and_keeps_the_tokens_before_it(
    engine_run: EngineRun,
) -> None:
    """Tokens, then a 2 MiB event: the tokens count, and the request is a stream_error
    naming the cap and the class's key (not the stall timeout it would reach waiting)."""
    big = b"data: " + b"x" * (2 << 20) + b"\n\n"
    steps = [head(), chunk(chat_chunk(role="assistant")), chunk(chat_chunk(" a")),
             chunk(chat_chunk(" b")), chunk(big), 0.5, *simple_chat(1)[1:]]  # fmt: skip
    records, _ = run_cases(engine_run, {"big": steps}, ["big"])
    record = records[0]
    assert record.outcome is Outcome.STREAM_ERROR
    assert record.error == (
        "a stream event over the 1 MiB cap (limits.max_event_bytes of class chat): "
        "connection closed"
    )
    assert len(record.chunk_ns) == 2  # " a" and " b"
