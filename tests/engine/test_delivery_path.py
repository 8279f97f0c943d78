"""The engine's view of the path between: reads counted as they arrive, streams held back by
a buffering proxy or a stalled reader, and compressed streams inflated as they arrive, all
in virtual time, where every stamp is the one the script set."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.engine.transport import accepted_codings
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.summary import Summary
from loadgen.testing import (
    LAST_CHUNK,
    PlanFactory,
    ReceivedRequest,
    Step,
    chat_chunk,
    chunk,
    compressed_chat,
    simple_chat,
)
from loadgen.testing.bufferproxy import ResponseEnds, held, stalled
from loadgen.testing.virtual import run_scripted
from loadgen.workload.spec import Deadlines, SloTargets

GAP_S = 0.0216  # the simulator's decode step at its seed parameters
TOKENS = 32
MS = 1_000_000
GZIP = {"Accept-Encoding": "gzip, deflate"}


def one(handler_steps: Sequence[Step], **options: object) -> RequestRecord:
    """The record of one request answered with `handler_steps`."""
    plans = PlanFactory(output_tokens=TOKENS, deadlines=Deadlines(stall_s=5)).at(0.0)
    records, _ = run_scripted(plans, lambda _request: list(handler_steps), **options)
    return records[0]


def direct() -> list[Step]:
    """A chat stream written event by event, 21.6 ms apart (36 events: 35 gaps)."""
    return simple_chat(TOKENS, gap_s=GAP_S)


def test_a_direct_stream_arrives_one_event_per_read() -> None:
    """Each event written alone is read alone: 32 output reads for 32 output events, the
    first token 21.6 ms after the role chunk."""
    record = one(direct())
    assert (record.outcome, record.output_events, record.output_reads) == (Outcome.OK, 32, 32)
    assert record.first_token_ns is not None
    assert record.first_token_ns - record.intended_ns == round(GAP_S * 1e9)


def test_a_whole_response_buffer_arrives_in_one_read_at_its_end() -> None:
    """Behind a proxy that holds the whole response, every event arrives in one read at the
    time of the last byte (35 gaps: 756 ms): TTFT 756 ms, TPOT 0, the stream coalesced."""
    record = one(held(direct()))
    assert (record.output_events, record.output_reads) == (32, 1)
    assert record.first_token_ns == record.last_token_ns
    assert record.first_token_ns is not None
    assert record.first_token_ns - record.intended_ns == round(35 * GAP_S * 1e9)
    assert judged([record]).classes["chat"].delivery.coalesced == 1


def test_blocks_of_a_kilobyte_arrive_several_events_a_read() -> None:
    """1 KiB blocks of the script's ~180-byte token events: 32 × size / 1024 reads (one
    more at most for the block a token's bytes straddle, and the tail): the stream
    coalesced."""
    size = len(chunk(chat_chunk(" w10")))
    record = one(held(direct(), block=1024))
    assert record.output_events == 32
    assert 32 * size // 1024 <= record.output_reads <= 32 * size // 1024 + 2
    assert judged([record]).classes["chat"].delivery.coalesced == 1


def test_a_reader_stalled_once_is_not_called_coalesced() -> None:
    """A direct reader away for 300 ms in the middle reads the 14 events written meanwhile at
    once: one big read among single ones, the stream paced."""
    record = one(stalled(direct(), [(0.2, 0.3)]))
    assert record.output_events == 32
    assert record.output_reads == 32 - 13
    assert judged([record]).classes["chat"].delivery.coalesced == 0


def judged(records: list[RequestRecord]) -> Summary:
    objectives = {"chat": Objective(name="chat", slo=SloTargets(tpot_ms=50))}
    return audit(to_frame(records), run_id="t", objectives=objectives, planned=len(records))


# -- compressed streams -------------------------------------------------------------------
def compressed(
    encoding: str = "gzip", *, wbits: int = 31, sync: bool = True, tokens: int = TOKENS
) -> list[Step]:
    """The chat stream compressed (`loadgen.testing.compressed_chat`), 21.6 ms apart."""
    return compressed_chat(tokens, encoding=encoding, wbits=wbits, sync=sync, gap_s=GAP_S)


def test_a_flushed_gzip_stream_is_timed_as_the_plain_one() -> None:
    """Asked for with Accept-Encoding, a gzip stream flushed event by event is inflated as it
    arrives: the same 32 reads and the same stamps as the stream sent plain."""
    plain = one(direct())
    inflated = one(compressed(), headers=GZIP)
    assert (inflated.outcome, inflated.output_reads) == (Outcome.OK, 32)
    assert inflated.chunk_ns == plain.chunk_ns
    assert inflated.output_tokens == 32


def test_a_gzip_stream_the_compressor_holds_arrives_at_its_end() -> None:
    """A compressor that writes only full blocks holds a short stream to its end: loadgen,
    accepting gzip as the SDK does, reads its first token when the SDK would (756 ms), in
    one read, and calls the stream coalesced."""
    record = one(compressed(sync=False), headers=GZIP)
    assert (record.outcome, record.output_reads) == (Outcome.OK, 1)
    assert record.first_token_ns is not None
    assert record.first_token_ns - record.intended_ns == round(35 * GAP_S * 1e9)


@pytest.mark.parametrize("wbits", [15, -15])
def test_deflate_is_read_zlib_wrapped_or_raw(wbits: int) -> None:
    """`deflate` as RFC 9110 says (zlib-wrapped) and as some servers send it (raw)."""
    record = one(compressed("deflate", wbits=wbits), headers=GZIP)
    assert (record.outcome, record.output_reads, record.output_tokens) == (Outcome.OK, 32, 32)


def test_a_body_that_does_not_inflate_is_a_stream_error() -> None:
    """Garbage under Content-Encoding: gzip ends the request as a stream_error saying so."""
    steps = compressed()
    steps[1] = chunk(b"\x1f\x8b\x08\x00not gzip at all")
    record = one(steps, headers=GZIP)
    assert record.outcome is Outcome.STREAM_ERROR
    assert "gzip body that does not inflate" in (record.error or "")


def test_a_coding_not_asked_for_is_refused_saying_what_to_ask() -> None:
    """Asked for gzip, answered with br: refused, naming the codings loadgen inflates."""
    record = one(compressed("br"), headers=GZIP)
    assert record.outcome is Outcome.STREAM_ERROR
    assert "Content-Encoding: br" in (record.error or "")
    assert "--accept-encoding gzip,deflate" in (record.error or "")


def test_gzip_unasked_is_refused_as_before_and_says_how_to_read_it() -> None:
    """A server that compresses without being asked is refused (exit 1 at the preflight,
    stream_error in a run), the message naming --accept-encoding."""
    record = one(compressed())
    assert record.outcome is Outcome.STREAM_ERROR
    assert "although the request asked for none" in (record.error or "")
    assert "--accept-encoding" in (record.error or "")


def test_a_body_that_inflates_without_end_stops_at_the_event_cap() -> None:
    """40 KiB of gzip that inflates to 40 MiB of one SSE line ends at the class's event cap
    (1 MiB by default): a stream_error, never 40 MiB held."""
    bomb = zlib.compressobj(wbits=31)
    body = bomb.compress(b"data: " + b"x" * (40 << 20)) + bomb.flush()
    steps: list[Step] = [compressed()[0], chunk(body), LAST_CHUNK]
    record = one(steps, headers=GZIP)
    assert record.outcome is Outcome.STREAM_ERROR
    assert "max_event_bytes" in (record.error or "")


def test_the_request_carries_the_accept_encoding_it_was_given() -> None:
    """The header reaches the server as given (the engine's and the preflight's bytes)."""
    seen: list[ReceivedRequest] = []

    def reply(request: ReceivedRequest) -> list[Step]:
        seen.append(request)
        return compressed()

    plans = PlanFactory(output_tokens=TOKENS).at(0.0)
    run_scripted(plans, reply, headers=GZIP)
    assert seen[0].headers["accept-encoding"] == "gzip, deflate"


# -- the buffering proxy's framing ---------------------------------------------------------
RESPONSES = [
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
]


@given(st.lists(st.integers(min_value=1, max_value=len(b"".join(RESPONSES))), max_size=30))
def test_the_proxy_finds_each_response_end_however_bytes_are_split(cuts: list[int]) -> None:
    """Keep-alive responses (a 1xx first, chunked with extensions and trailers, sized,
    empty) end where their framing says, whatever reads the bytes come in."""
    stream = b"".join(RESPONSES)
    ends, offset, finder = [], 0, ResponseEnds()
    for start, stop in itertools.pairwise([0, *sorted(set(cuts)), len(stream)]):
        ends += [offset + end for end in finder.feed(stream[start:stop])]
        offset += stop - start
    assert ends == list(itertools.accumulate(len(r) for r in RESPONSES))


@pytest.mark.parametrize("wbits", [31, 15, -15])
def test_a_compressed_body_split_byte_by_byte_inflates_the_same(wbits: int) -> None:
    """Every compressed byte in a read of its own (the first one alone, before the second
    says which deflate it is): the same 32 tokens, ok."""
    encoding = "gzip" if wbits == 31 else "deflate"
    steps = compressed(encoding, wbits=wbits)
    raw = _unchunk(b"".join(s for s in steps[1:-1] if isinstance(s, bytes)))
    split: list[Step] = [steps[0], *(chunk(raw[i : i + 1]) for i in range(len(raw))), LAST_CHUNK]
    record = one(split, headers=GZIP)
    assert (record.outcome, record.output_tokens) == (Outcome.OK, 32)


def _unchunk(body: bytes) -> bytes:
    """The data of a chunked body's chunks, joined."""
    out, pos = b"", 0
    while pos < len(body):
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end], 16)
        out += body[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2
    return out


@pytest.mark.parametrize(
    ("header", "codings"),
    [
        ("gzip, deflate", {"gzip", "x-gzip", "deflate"}),
        ("GZIP;q=0.5, br", {"gzip", "x-gzip"}),
        ("gzip;q=0, deflate;q=0.000", set()),
        ("identity", set()),
        ("", set()),
    ],
)
def test_the_codings_asked_for_are_read_from_the_header(header: str, codings: set[str]) -> None:
    """Accept-Encoding's codings, case-insensitive, weights read (q=0 refuses), those
    loadgen inflates kept."""
    assert accepted_codings({"Accept-Encoding": header}) == codings
