"""Server-sent events: an incremental decoder, bytes in, (event, data) pairs out.

Part of the protocol-adapter stage. Follows the WHATWG event-stream rules that matter for
LLM streams: lines end in LF, CRLF or CR (a CR at the end of one read may pair with an LF at
the start of the next); `:` lines are comments (heartbeats) and are counted; `data:` lines
of one event are joined with LF; a blank line dispatches the event; a final event without
its blank line is dispatched by `close()`. The output does not depend on how the bytes were
split across reads (a property test checks this).
"""

from __future__ import annotations


class SseDecoder:
    """Feed bytes as they arrive; get complete events back."""

    __slots__ = ("_buffer", "_data", "_event", "_pending_cr", "comments")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._event = b""
        self._pending_cr = False
        self.comments = 0  # `:` lines seen (heartbeats); they never count as output

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """Decode `chunk`; return the events it completed as (event name, data) pairs."""
        if not chunk:
            return []
        if (
            # Fast path: one whole `data: ...` event in one read, nothing buffered.
            chunk[:6] == b"data: "
            and chunk[-2:] == b"\n\n"
            and not self._buffer
            and not self._data
            and not self._event
            and chunk.count(b"\n") == 2
            and b"\r" not in chunk
        ):
            self._pending_cr = False
            return [(b"", chunk[6:-2])]
        if self._pending_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]  # the LF of a CRLF split across reads
        self._pending_cr = chunk[-1:] == b"\r"
        buffer = self._buffer + chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._buffer = lines.pop()  # the unfinished last line (b"" after a newline)
        events: list[tuple[bytes, bytes]] = []
        for line in lines:
            self._line(line, events)
        return events

    def close(self) -> list[tuple[bytes, bytes]]:
        """End of stream: dispatch a last event that had no blank line after it."""
        events: list[tuple[bytes, bytes]] = []
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = b""
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[tuple[bytes, bytes]]) -> None:
        if not line:
            if self._data:
                events.append((self._event, b"\n".join(self._data)))
            self._data = []
            self._event = b""
            return
        if line[:1] == b":":
            self.comments += 1
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value
        # `id` and `retry` fields mean nothing for a single LLM stream; ignore them.
