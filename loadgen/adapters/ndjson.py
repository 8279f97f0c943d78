"""Newline-delimited JSON: an incremental decoder, bytes in, one event per line out.

Part of the protocol-adapter stage, the NDJSON twin of `loadgen.adapters.sse` (Ollama streams one
JSON object per line, no SSE framing). Same interface as `SseDecoder`: `feed()` returns
the events a read completed, as (b"", line) pairs, `close()` a last line that had no
newline. Lines end in LF (a CR before it is dropped); blank and whitespace-only lines are
skipped; the decoder never looks inside a line, so the adapter decides what is valid
JSON. The output does not depend on how the bytes were split across reads (a property
test checks this). A line longer than `max_event_bytes` raises `EventTooLarge`, as in
`loadgen.adapters.sse` (the line still arriving is checked too, and kept as pieces joined once).
"""

from __future__ import annotations

from loadgen.adapters.sse import DEFAULT_MAX_EVENT_BYTES, EventTooLarge

WHITESPACE = b" \t\r\n\f\v"


class NdjsonDecoder:
    """Feed bytes as they arrive; get complete lines back."""

    __slots__ = ("_held", "_parts", "comments", "max_event_bytes")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._parts: list[bytes] = []  # the unfinished last line, as it arrived
        self._held = 0  # its length
        self.comments = 0  # NDJSON has no comments; kept for the SseDecoder interface
        self.max_event_bytes = max_event_bytes  # the longest line (before its LF) accepted

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """Decode `chunk`; return the lines it completed as (b"", line) pairs.

        Raises EventTooLarge when a line passes the cap.
        """
        if not chunk:
            return []
        limit = self.max_event_bytes
        if b"\n" not in chunk:
            self._parts.append(chunk)  # the line goes on: keep the piece, join it later
            self._held += len(chunk)
            if self._held > limit:
                raise EventTooLarge(limit, [])
            return []
        lines = (b"".join((*self._parts, chunk)) if self._parts else chunk).split(b"\n")
        last = lines.pop()  # the unfinished last line (b"" after a newline)
        self._parts = [last] if last else []
        self._held = len(last)
        events: list[tuple[bytes, bytes]] = []
        for line in lines:
            if len(line) > limit:
                raise EventTooLarge(limit, events)
            if stripped := line.strip(WHITESPACE):
                events.append((b"", stripped))
        if self._held > limit:
            raise EventTooLarge(limit, events)
        return events

    def close(self) -> list[tuple[bytes, bytes]]:
        """End of stream: the last line, when it had no newline after it."""
        last = b"".join(self._parts).strip(WHITESPACE)
        self._parts, self._held = [], 0
        return [(b"", last)] if last else []
