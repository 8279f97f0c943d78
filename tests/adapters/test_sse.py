"""SSE decoding: the spec's line rules, and independence from how bytes are split."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.adapters.ndjson import NdjsonDecoder
from loadgen.adapters.sse import EventTooLarge, SseDecoder, size_text


def decode_all(pieces: list[bytes]) -> tuple[list[tuple[bytes, bytes]], int]:
    decoder = SseDecoder()
    events = []
    for piece in pieces:
        events.extend(decoder.feed(piece))
    events.extend(decoder.close())
    return events, decoder.comments


def decode_capped(
    pieces: list[bytes], limit: int, decoder_type: type = SseDecoder
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """Events until the end or the cap, and whether the cap ended it (at `limit`)."""
    decoder = decoder_type(limit)
    events: list[tuple[bytes, bytes]] = []
    try:
        for piece in pieces:
            events.extend(decoder.feed(piece))
        events.extend(decoder.close())
    except EventTooLarge as exc:
        return events + exc.events, exc.limit == limit
    return events, False


def test_events_comments_crlf_and_multiline() -> None:
    """LF, CRLF and CR endings, comments, `event:` names and multi-line data all decode."""
    stream = (
        b": keep-alive\n\n"
        b'data: {"a":1}\n\n'
        b"event: delta\r\ndata: x\r\n\r\n"
        b"data: line1\ndata: line2\n\n"
        b"data:nospace\r\r"
        b"id: 7\nretry: 10\ndata: [DONE]\n\n"
    )
    events, comments = decode_all([stream])
    assert events == [
        (b"", b'{"a":1}'),
        (b"delta", b"x"),
        (b"", b"line1\nline2"),
        (b"", b"nospace"),
        (b"", b"[DONE]"),
    ]
    assert comments == 1


def test_last_event_without_blank_line_is_kept_by_close() -> None:
    """A stream that ends right after its last data line still yields that event."""
    assert decode_all([b"data: a\n\ndata: b"])[0] == [(b"", b"a"), (b"", b"b")]


SAMPLE = (
    b": ping\r\n\r\n"
    b'data: {"choices":[{"delta":{"role":"assistant","content":null}}]}\r\n\r\n'
    b'data: {"choices":[{"delta":{"content":" hi"}}]}\n\n'
    b"event: x\rdata: y\r\r"
    b"data: [DONE]\n\n"
)


@given(st.lists(st.integers(0, len(SAMPLE)), max_size=12))
def test_splitting_does_not_change_events(cuts: list[int]) -> None:
    """Feeding the stream whole, byte by byte, or split anywhere gives the same events."""
    whole = decode_all([SAMPLE])
    bounds = sorted({0, len(SAMPLE), *cuts})
    pieces = [SAMPLE[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode_all(pieces) == whole
    assert decode_all([SAMPLE[i : i + 1] for i in range(len(SAMPLE))]) == whole


@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=8))
def test_any_bytes_never_crash_and_split_invariant(data: bytes, cuts: list[int]) -> None:
    """Arbitrary bytes decode without error, identically however they are split."""
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode_all(pieces) == decode_all([data])


@pytest.mark.parametrize("decoder_type", [SseDecoder, NdjsonDecoder])
def test_a_line_over_the_cap_is_refused_while_it_arrives(decoder_type: type) -> None:
    """A line that never ends raises once the cap is passed, not when it is whole: the
    decoder never holds more than the cap and one read."""
    decoder = decoder_type(1000)
    assert decoder.feed(b"data: " + b"x" * 900) == []
    with pytest.raises(EventTooLarge, match="over the 1,000 bytes cap"):
        decoder.feed(b"x" * 200)
    with pytest.raises(EventTooLarge) as caught:  # a read that ends one line, starts another
        decoder_type(1000).feed(b"data: 1\n\n" + b"x" * 1001)
    assert caught.value.events == [(b"", b"1" if decoder_type is SseDecoder else b"data: 1")]


def test_events_before_the_one_over_the_cap_are_kept() -> None:
    """The events a read completed before the oversized one come with the error."""
    with pytest.raises(EventTooLarge) as caught:
        SseDecoder(100).feed(b"data: a\n\ndata: b\n\ndata: " + b"x" * 200 + b"\n\n")
    assert caught.value.events == [(b"", b"a"), (b"", b"b")]


def test_data_lines_adding_up_past_the_cap_are_refused() -> None:
    """Many short data lines of one event count together; heartbeats do not count."""
    lines = b"data: " + b"x" * 40 + b"\n"
    assert decode_capped([b": ping\n" * 100 + lines * 2 + b"\n"], 100) == (
        [(b"", b"x" * 40 + b"\n" + b"x" * 40)],
        False,
    )
    assert decode_capped([lines * 3 + b"\n"], 100) == ([], True)


def test_empty_data_lines_count_their_newline_against_the_cap() -> None:
    """An event's data is its lines joined by LF: 100 empty `data:` lines are 99 bytes (kept
    under a 99-byte cap, refused under 98), so a server sending only those reaches the cap
    instead of growing the decoder for ever; the same whatever the reads."""
    event = b"data:\n" * 100 + b"\n"
    assert decode_capped([event], 99) == ([(b"", b"\n" * 99)], False)
    assert decode_capped([event], 98) == ([], True)
    assert decode_capped([event[i : i + 7] for i in range(0, len(event), 7)], 98) == ([], True)
    decoder = SseDecoder(1 << 20)

    def feed_1_6_million_lines() -> None:
        for _ in range(200):
            decoder.feed(b"data:\n" * 8192)

    with pytest.raises(EventTooLarge):  # ~1M lines at most: 8 MiB of pieces, then refused
        feed_1_6_million_lines()


def test_a_one_read_event_over_a_small_cap_is_refused_too() -> None:
    """The fast path (one whole event in one read) honours the cap exactly: it is on the
    line, `data: ` included (106 bytes here), as on every other path."""
    event = b"data: " + b"x" * 100 + b"\n\n"
    assert decode_capped([event], 106) == ([(b"", b"x" * 100)], False)
    assert decode_capped([event], 105) == ([], True)
    assert decode_capped([event[:50], event[50:]], 105) == ([], True)


CAPPED = b"data: a\n\n: ping\n" + b"data: " + b"y" * 50 + b"\ndata: zz\n\n" + b"data: " + b"w" * 70


@pytest.mark.parametrize("decoder_type", [SseDecoder, NdjsonDecoder])
@given(st.integers(40, 120), st.lists(st.integers(0, len(CAPPED)), max_size=10))
def test_the_cap_does_not_depend_on_how_bytes_are_split(
    decoder_type: type, limit: int, cuts: list[int]
) -> None:
    """Whether the cap fires, and the events before it, are the same however the bytes
    were split into reads."""
    bounds = sorted({0, len(CAPPED), *cuts})
    pieces = [CAPPED[a:b] for a, b in itertools.pairwise(bounds)]
    whole = decode_capped([CAPPED], limit, decoder_type)
    assert decode_capped(pieces, limit, decoder_type) == whole
    singles = [CAPPED[i : i + 1] for i in range(len(CAPPED))]
    assert decode_capped(singles, limit, decoder_type) == whole


def test_a_long_line_in_many_reads_is_joined_once() -> None:
    """10,000 one-byte reads of one line decode to that line (pieces are kept, not
    re-joined on every read)."""
    decoder = SseDecoder()
    line = b"data: " + b"q" * 10_000
    for i in range(len(line)):
        assert decoder.feed(line[i : i + 1]) == []
    assert decoder.feed(b"\n\n") == [(b"", b"q" * 10_000)]


def test_caps_are_named_as_people_write_them() -> None:
    """1 MiB, 64 KiB, and plain bytes otherwise."""
    assert [size_text(n) for n in (1 << 20, 64 << 10, 1000)] == ["1 MiB", "64 KiB", "1,000 bytes"]
