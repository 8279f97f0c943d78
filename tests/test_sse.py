"""SSE decoding: the spec's line rules, and independence from how bytes are split."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from loadgen.sse import SseDecoder


def decode_all(pieces: list[bytes]) -> tuple[list[tuple[bytes, bytes]], int]:
    decoder = SseDecoder()
    events = []
    for piece in pieces:
        events.extend(decoder.feed(piece))
    events.extend(decoder.close())
    return events, decoder.comments


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
