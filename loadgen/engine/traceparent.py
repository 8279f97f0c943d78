"""W3C trace context: the `traceparent` every request carries, so the server's span of it
(vLLM's and SGLang's `llm_request`, a gateway's) lands in a trace of its own whose id is in
the request's record.

`00-<trace id>-<span id>-01` (https://www.w3.org/TR/trace-context/): version 00, a random
128-bit trace id and 64-bit span id per request (never all zeros, which the spec makes
invalid), the sampled flag set (a server that honours the flag makes no span for `-00`).
Random, not derived from the seed: a trace id must not repeat across runs, which share
their seed. The trace id (the 32 hex digits after `00-`) is the join key to the server's
span; the request id is the fallback (`loadgen.engine.request_ids`).

The preflight gets its own, as it gets its own request id. A retry (a reused connection
lost before any response byte) is a second attempt of the same request: it keeps the trace
id and gets a new span id, as an HTTP client's retry is a new span of the same trace, so
the record (which keeps the last attempt's) joins whichever attempt the server saw.

`target.tracestate` goes out beside every traceparent loadgen sends, unchanged. A
`traceparent` header the user set (`--header`, `target.headers`) is the user's choice: it
replaces loadgen's on every request (one trace for the whole run) and is what the record
keeps, as a user's request id header is. `target.traceparent: false` (`--no-traceparent`)
sends none of loadgen's.

Built when a request is encoded (ahead of its send), never on the per-chunk path.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

HEADER = "traceparent"
STATE_HEADER = "tracestate"
_TRACE_BITS, _SPAN_BITS = 128, 64


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id a traceparent carries (its 32 hex digits after the version), else None."""
    if traceparent is None:
        return None
    parts = traceparent.split("-")
    if len(parts) < 4 or len(parts[1]) != 32:
        return None
    return parts[1].lower()


def shared_trace_warning(given: Mapping[str, str]) -> str | None:
    """What to tell the user when a header they set is every request's traceparent."""
    value = next((v for k, v in given.items() if k.lower() == HEADER), None)
    if value is None:
        return None
    return (f"warning: every request carries your traceparent ({value[:60]}): they share one "
            "trace, so the server's spans join to the records by request id, not trace id "
            "(drop the header to give each request its own)")  # fmt: skip


class TraceContext:
    """Each request's trace headers: (headers to add, the traceparent the request carries).

    `given` are the headers the user set for every request: a traceparent among them (any
    case) is the one every request carries, and nothing of loadgen's is added. `rng` draws
    the ids (default: seeded from the OS, once per run).
    """

    def __init__(
        self, enabled: bool, tracestate: str | None, given: Mapping[str, str],
        rng: random.Random | None = None,
    ) -> None:  # fmt: skip
        self.enabled = enabled
        self.tracestate = tracestate
        self.user_value = next((v for k, v in given.items() if k.lower() == HEADER), None)
        self.user_state = any(k.lower() == STATE_HEADER for k in given)
        self._bits = (rng or random.Random()).getrandbits

    @property
    def owns(self) -> bool:
        """True when loadgen makes each request's traceparent (on, none given by the user)."""
        return self.enabled and self.user_value is None

    def _nonzero(self, bits: int) -> int:
        value = self._bits(bits)
        while value == 0:  # all zeros is an invalid id (W3C trace-context, 3.2.2.3-4)
            value = self._bits(bits)
        return value

    def new(self) -> str:
        """A fresh traceparent: a new trace id and span id, sampled."""
        return f"00-{self._nonzero(_TRACE_BITS):032x}-{self._nonzero(_SPAN_BITS):016x}-01"

    def respan(self, traceparent: str) -> str:
        """The same trace, a new span id: a retry's."""
        return f"{traceparent[:36]}{self._nonzero(_SPAN_BITS):016x}{traceparent[52:]}"

    def headers(self) -> tuple[dict[str, str], str | None]:
        """Headers to add to one request, and the traceparent it carries (None: none)."""
        if self.user_value is not None:
            return {}, self.user_value
        if not self.enabled:
            return {}, None
        value = self.new()
        if self.tracestate is not None and not self.user_state:
            return {HEADER: value, STATE_HEADER: self.tracestate}, value
        return {HEADER: value}, value
