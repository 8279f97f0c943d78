"""Server-sent events: an incremental decoder, bytes in, (event, data) pairs out.

Part of the protocol-adapter stage. Follows the WHATWG event-stream rules that matter for
LLM streams: lines end in LF, CRLF or CR (a CR at the end of one read may pair with an LF at
the start of the next); `:` lines are comments (heartbeats) and are counted; `data:` lines
of one event are joined with LF; a blank line dispatches the event; a final event without
its blank line is dispatched by `close()`. The output does not depend on how the bytes were
split across reads (a property test checks this).

Memory is bounded by `max_event_bytes` (the class's `limits.max_event_bytes`): a line
longer than that, or an event whose data (its lines joined by LF, so an empty `data:` line
counts one byte) adds up to more, raises `EventTooLarge` (checked on the line still
arriving too, so a 100 MB line is refused at the cap, not buffered). An event's lines are
held as pieces until it ends: at most `max_event_bytes` of them, 8 bytes each for empty
ones. A line that arrives over many reads is kept as a list of pieces and joined once, so a
long line costs linear time, not quadratic.
"""

from __future__ import annotations

DEFAULT_MAX_EVENT_BYTES = 1 << 20  # 1 MiB: far above any LLM stream event, far below harm


class EventTooLarge(ValueError):
    """A line or event over the decoder's cap; `events` are those completed before it."""

    def __init__(self, limit: int, events: list[tuple[bytes, bytes]]) -> None:
        super().__init__(f"a stream event over the {size_text(limit)} cap")
        self.limit = limit
        self.events = events


def size_text(n_bytes: int) -> str:
    """`1 MiB`, `64 KiB`, `300 bytes`: a cap as people write it."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= size and n_bytes % size == 0:
            return f"{n_bytes // size} {unit}"
    return f"{n_bytes:,} bytes"


class SseDecoder:
    """Feed bytes as they arrive; get complete events back."""

    __slots__ = (
        "_data",
        "_data_bytes",
        "_event",
        "_fast_max",
        "_held",
        "_parts",
        "_pending_cr",
        "comments",
        "max_event_bytes",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._parts: list[bytes] = []  # the unfinished last line, as it arrived
        self._held = 0  # its length
        self._data: list[bytes] = []
        self._data_bytes = 0  # the current event's data so far
        self._event = b""
        self._pending_cr = False
        self.comments = 0  # `:` lines seen (heartbeats); they never count as output
        self.max_event_bytes = max_event_bytes
        self._fast_max = max_event_bytes + 2  # a one-line event: its line, and its two LFs

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """Decode `chunk`; return the events it completed as (event name, data) pairs.

        Raises EventTooLarge when a line or event passes the cap.
        """
        if not chunk:
            return []
        if (
            # Fast path: one whole `data: ...` event in one read, nothing buffered.
            chunk[:6] == b"data: "
            and chunk[-2:] == b"\n\n"
            and not self._parts
            and not self._data
            and not self._event
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
            and len(chunk) <= self._fast_max
        ):
            self._pending_cr = False
            return [(b"", chunk[6:-2])]
        if self._pending_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]  # the LF of a CRLF split across reads
            if not chunk:
                self._pending_cr = False
                return []
        self._pending_cr = chunk[-1:] == b"\r"
        if b"\n" not in chunk and b"\r" not in chunk:
            self._parts.append(chunk)  # the line goes on: keep the piece, join it later
            self._held += len(chunk)
            if self._held > self.max_event_bytes:
                raise EventTooLarge(self.max_event_bytes, [])
            return []
        buffer = b"".join((*self._parts, chunk)) if self._parts else chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        last = lines.pop()  # the unfinished last line (b"" after a newline)
        self._parts = [last] if last else []
        self._held = len(last)
        events: list[tuple[bytes, bytes]] = []
        for line in lines:
            self._line(line, events)
        if self._held > self.max_event_bytes:
            raise EventTooLarge(self.max_event_bytes, events)
        return events

    def close(self) -> list[tuple[bytes, bytes]]:
        """End of stream: dispatch a last event that had no blank line after it."""
        events: list[tuple[bytes, bytes]] = []
        if self._parts:
            line = b"".join(self._parts)
            self._parts, self._held = [], 0
            self._line(line, events)
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[tuple[bytes, bytes]]) -> None:
        if not line:
            if self._data:
                events.append((self._event, b"\n".join(self._data)))
            self._data = []
            self._data_bytes = 0
            self._event = b""
            return
        if len(line) > self.max_event_bytes:
            raise EventTooLarge(self.max_event_bytes, events)
        if line[:1] == b":":
            self.comments += 1
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            # Each line with the LF that joins it to the next: the data is this, less one
            # LF. An empty `data:` line is a byte of the event, so a server sending only
            # those reaches the cap (it held 822 MiB, growing, when they counted nothing).
            self._data_bytes += len(value) + 1
            if self._data_bytes > self.max_event_bytes + 1:
                raise EventTooLarge(self.max_event_bytes, events)
        elif name == b"event":
            self._event = value
        # `id` and `retry` fields mean nothing for a single LLM stream; ignore them.
