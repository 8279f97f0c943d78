"""One request's exchange on its own: settling once, the retry reset, cancelling in flight, and
its bounds (chunk stamps, kept text, usage problems)."""

from __future__ import annotations

import asyncio

import pytest

from loadgen.adapters import adapter_for
from loadgen.analysis.metrics import derive, itl_gaps_ms, stream_ends
from loadgen.engine.exchange import MIN_CHUNK_STAMPS, QUOTE_CHARS, Exchange, chunk_stamp_cap
from loadgen.results.records import Outcome, RequestRecord, TokenSource, to_frame
from loadgen.testing import PlanFactory, chat_chunk, sse

T0_NS = 1_000_000_000


def exchange() -> Exchange:
    """An exchange of one plan due at t0, on the OpenAI chat adapter."""
    return Exchange(PlanFactory().at(0)[0], adapter_for("openai-chat"), T0_NS)


def test_a_cancelled_exchange_stays_cancelled() -> None:
    """Cancelled in flight, the outcome is settled there: a deadline firing later changes nothing."""

    async def scenario() -> tuple[Outcome | None, Outcome, int | None, bool]:
        ex = exchange()
        ex.then = lambda t_ns: None
        ex.cancel(T0_NS + 5_000)
        ex.timeout(Outcome.TIMEOUT_TOTAL, "not finished in 1 s")  # a timer that was not cancelled
        record = ex.record()
        return ex.outcome, record.outcome, record.end_ns, ex.then is None

    outcome, recorded, end_ns, no_follower = asyncio.run(scenario())
    assert outcome is Outcome.CANCELLED
    assert recorded is Outcome.CANCELLED
    assert end_ns == 5_000
    assert no_follower


def test_the_retry_reset_unsettles_a_request_lost_unanswered_once() -> None:
    """Lost before any response on a kept-alive connection: reset once, then a second loss stands."""

    async def scenario() -> list[tuple[Outcome | None, bool, bool, int]]:
        ex = exchange()
        ex.reused_connection = True
        seen = []
        ex.on_lost("connection reset", False, T0_NS + 1_000)
        seen.append((ex.outcome, ex.will_retry(), ex.done.done(), ex.retries))
        ex.reset_for_retry()
        seen.append((ex.outcome, ex.will_retry(), ex.done.done(), ex.retries))
        ex.on_lost("connection reset", False, T0_NS + 2_000)
        seen.append((ex.outcome, ex.will_retry(), ex.done.done(), ex.retries))
        return seen

    first, reset, second = asyncio.run(scenario())
    assert first == (Outcome.CONNECT_ERROR, True, True, 0)
    assert reset == (None, False, False, 1)
    assert second == (Outcome.CONNECT_ERROR, False, True, 1)


# -- bounded per request: chunk stamps, kept text, usage problems --------------------------
MS = 1_000_000
GAP_NS, PAUSE_NS, PAUSED_AT = 10 * MS, 300 * MS, 181  # chunk 181 comes 300 ms after 180


def stream_times(chunks: int) -> list[int]:
    """Arrival times: the first chunk 100 ms after t0, then 10 ms apart, but 300 ms before
    chunk `PAUSED_AT`."""
    times = [T0_NS + 100 * MS]
    for i in range(1, chunks):
        times.append(times[-1] + (PAUSE_NS if i == PAUSED_AT else GAP_NS))
    return times


def streamed(chunks: int, cap: int, *, usage: int | None = None) -> RequestRecord:
    """The record of `chunks` one-character content chunks at `stream_times`, a stop and
    [DONE] (after a usage event of `usage` tokens, when given), through an exchange that
    keeps `cap` stamps."""

    async def scenario() -> RequestRecord:
        ex = Exchange(PlanFactory().at(0)[0], adapter_for("openai-chat"), T0_NS,
                      max_chunk_stamps=cap)  # fmt: skip
        ex.on_head(200, {"content-type": "text/event-stream"}, T0_NS)
        times = stream_times(chunks)
        for t_ns in times:
            ex.on_body(chat_chunk("x"), t_ns)
        tail = [chat_chunk(finish="stop"), sse("[DONE]")]
        if usage is not None:
            tail.insert(1, chat_chunk(usage={"completion_tokens": usage}, no_choices=True))
        ex.on_body(b"".join(tail), times[-1] + MS)
        return ex.record()

    return asyncio.run(scenario())


@pytest.mark.parametrize("usage", [None, 500])
def test_a_stream_past_its_stamp_cap_keeps_n_tpot_e2e_and_its_largest_gap_exact(
    usage: int | None,
) -> None:
    """250 chunks through a cap of 100 stamps: the first 100 stamps kept exactly, 150
    counted unstamped with their largest gap (300 ms); N, TPOT, E2E and the largest ITL are
    those of the same stream with every stamp kept (249 gaps: 248 of 10 ms and one of 300)."""
    whole, capped = streamed(250, 250, usage=usage), streamed(250, 100, usage=usage)
    assert (whole.unstamped_chunks, whole.unstamped_max_gap_ns) == (0, None)
    assert list(whole.chunk_ns) == [t - T0_NS for t in stream_times(250)]
    assert list(capped.chunk_ns) == list(whole.chunk_ns)[:100]
    assert (capped.unstamped_chunks, capped.unstamped_max_gap_ns) == (150, PAUSE_NS)
    n = 250 if usage is None else usage
    assert (capped.output_tokens, capped.counted_output_tokens) == (n, 250)
    assert capped.token_source is (TokenSource.CHUNKS if usage is None else TokenSource.USAGE)
    assert list(capped.chunk_tokens) == [n // 250] * 100  # the stamped chunks' share of N
    assert capped.last_token_ns == whole.last_token_ns == 100 * MS + 248 * GAP_NS + PAUSE_NS
    derived = derive(to_frame([whole, capped]))
    tpot_ms = (248 * GAP_NS + PAUSE_NS) / (n - 1) / MS
    assert derived["tpot_ms"].to_list() == pytest.approx([tpot_ms, tpot_ms], rel=1e-12)
    assert derived["e2e_ms"].to_list() == [(100 * MS + 248 * GAP_NS + PAUSE_NS) / MS] * 2
    assert derived["max_itl_ms"].to_list() == [PAUSE_NS / MS] * 2
    gaps = itl_gaps_ms(to_frame([capped]), "chat")
    assert gaps.to_list() == [GAP_NS / MS] * 99  # the stamped gaps only
    assert stream_ends(to_frame([capped]))["chat"].itl_summarised == 1
    assert stream_ends(to_frame([whole]))["chat"].itl_summarised == 0


def test_the_stamp_cap_is_65_536_chunks_or_twice_max_tokens() -> None:
    """A stream has at most one chunk per token: a cap of twice max_tokens never summarises
    a normal one; 65,536 at least."""
    assert chunk_stamp_cap(4) == MIN_CHUNK_STAMPS == 65_536
    assert chunk_stamp_cap(100_000) == 200_000

    async def default_cap() -> int:
        return exchange().max_chunk_stamps

    assert asyncio.run(default_cap()) == 65_536


def test_kept_answer_text_stops_at_its_cap_and_n_is_then_counted_from_chunks() -> None:
    """Ten 5-character chunks kept under a 23-character cap: the first 23 characters, no
    more; N by the tokenizer when the text is whole, by the chunks when it was cut."""

    async def scenario(cap: int) -> tuple[str, bool, RequestRecord]:
        ex = Exchange(PlanFactory().at(0)[0], adapter_for("openai-chat"), T0_NS,
                      keep_text=True, count_tokens=len, max_text_chars=cap)  # fmt: skip
        ex.on_head(200, {"content-type": "text/event-stream"}, T0_NS)
        for i in range(10):
            ex.on_body(chat_chunk("abcd" + str(i)), T0_NS + (i + 1) * MS)
        ex.on_body(chat_chunk(finish="stop") + sse("[DONE]"), T0_NS + 20 * MS)
        return "".join(ex.texts), ex.text_cut, ex.record()

    text, cut, record = asyncio.run(scenario(23))
    assert (text, cut) == ("abcd0abcd1abcd2abcd3abc", True)
    assert (record.output_tokens, record.token_source) == (10, TokenSource.CHUNKS)
    text, cut, record = asyncio.run(scenario(50))
    assert (len(text), cut) == (50, False)
    assert (record.output_tokens, record.token_source) == (50, TokenSource.TEXT)


def test_usage_problems_repeated_in_every_event_are_kept_to_the_quote_length() -> None:
    """A negative count in each of 10,000 events: the record's usage_problem stays within
    QUOTE_CHARS instead of growing by each."""

    async def scenario() -> RequestRecord:
        ex = exchange()
        ex.on_head(200, {"content-type": "text/event-stream"}, T0_NS)
        ex.on_body(chat_chunk("x"), T0_NS + MS)
        bad = chat_chunk(usage={"completion_tokens": -8}, no_choices=True)
        for i in range(10_000):
            ex.on_body(bad, T0_NS + 2 * MS + i)
        return ex.record()

    record = asyncio.run(scenario())
    assert record.usage_problem is not None
    assert record.usage_problem.startswith("completion_tokens=-8; completion_tokens=-8")
    assert len(record.usage_problem) == QUOTE_CHARS
