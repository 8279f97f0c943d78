"""The simulator's own record of what it did, as JSON Lines (the check on the client).

Times are `time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux, comparable across
processes on one host). Line types:

* `{"type": "sim", ...}` once at start: version, pid, speed, physics.
* `{"type": "step", "pool", "intended_ns", "actual_ns", "written_ns", "batch",
  "prefill_tokens", "emitted"}` per engine step: when it should have ended, when the
  driver woke to deliver it, and when its last chunk was written.
* `{"type": "request", "id", "x_request_id", "path", "stream", "received_ns",
  "first_token_ns", "done_ns", "chunk_ns": [...], "status", "outcome", "prompt_tokens",
  "output_tokens", "fault", "api", "reasoning_tokens", "opening_ns", "heartbeats"}` per
  generation request (any dialect) when it ends; `chunk_ns` holds the write time of every
  chunk that carries generated tokens, `output_tokens` the tokens generated, `opening_ns`
  the write time of an opening event sent before queueing (role "early"), `heartbeats`
  how many heartbeat events were written. `received_ns` is when the read that brought
  the request's last byte returned (the server's door: its TTFT counts from there),
  `handled_ns` when the server began to handle it (parse, plan, queue); between them, the
  requests read in the same burst and handled before it.

Lines are buffered in memory and flushed every `flush_interval_s` and at close.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, BinaryIO

import orjson


class TraceWriter:
    """Buffered JSON Lines writer with a periodic flush on the event loop."""

    def __init__(
        self, path: Path, loop: asyncio.AbstractEventLoop, flush_interval_s: float = 0.5
    ) -> None:
        self._file: BinaryIO = path.open("wb", buffering=1 << 20)
        self._loop = loop
        self._interval_s = flush_interval_s
        self._timer = loop.call_later(flush_interval_s, self._tick)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (a dict of JSON-able values)."""
        self._file.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))

    def _tick(self) -> None:
        self._file.flush()
        self._timer = self._loop.call_later(self._interval_s, self._tick)

    def close(self) -> None:
        """Flush and close; later writes are an error."""
        self._timer.cancel()
        self._file.close()


class NullTrace:
    """Trace sink used when no `--trace-file` is given."""

    def write(self, record: dict[str, Any]) -> None:
        """Discard the record."""

    def close(self) -> None:
        """Nothing to flush."""
