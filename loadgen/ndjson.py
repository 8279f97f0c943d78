"""Newline-delimited JSON: an incremental decoder, bytes in, one event per line out.

Part of the protocol-adapter stage, the NDJSON twin of `loadgen.sse` (Ollama streams one
JSON object per line, no SSE framing). Same interface as `SseDecoder`: `feed()` returns
the events a read completed, as (b"", line) pairs, `close()` a last line that had no
newline. Lines end in LF (a CR before it is dropped); blank and whitespace-only lines are
skipped; the decoder never looks inside a line, so the adapter decides what is valid
JSON. The output does not depend on how the bytes were split across reads (a property
test checks this).
"""

from __future__ import annotations

WHITESPACE = b" \t\r\n\f\v"


class NdjsonDecoder:
    """Feed bytes as they arrive; get complete lines back."""

    __slots__ = ("_buffer", "comments")

    def __init__(self) -> None:
        self._buffer = b""
        self.comments = 0  # NDJSON has no comments; kept for the SseDecoder interface

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes]]:
        """Decode `chunk`; return the lines it completed as (b"", line) pairs."""
        if not chunk:
            return []
        if b"\n" not in chunk:
            self._buffer += chunk
            return []
        lines = (self._buffer + chunk).split(b"\n")
        self._buffer = lines.pop()  # the unfinished last line (b"" after a newline)
        return [(b"", stripped) for line in lines if (stripped := line.strip(WHITESPACE))]

    def close(self) -> list[tuple[bytes, bytes]]:
        """End of stream: the last line, when it had no newline after it."""
        last = self._buffer.strip(WHITESPACE)
        self._buffer = b""
        return [(b"", last)] if last else []
