"""How many connections to open before t0 (`--warm-connections`), from the planned work.

A user's real clients are many machines, each with warm connections; a load generator
that opens every connection inside its first wave measures its own connection setup
(≈170 µs per request on a 2-core box, 512 requests in ~90 ms) as server TTFT. So the
engine opens, before t0, as many connections as the run needs at its start
(`Connector.warm`), and the first sends take them: no handshake inside any latency.

`auto` is the peak of requests that can be in flight in the first second: every single
and every conversation or agent flow that starts in it (as if none of them finished within
that second: streams of LLM output last seconds), and each closed-loop batch's
concurrency; capped at `AUTO_CAP` (and always at the open-files limit's headroom).
"""

from __future__ import annotations

from loadgen.workload.plans import Work

AUTO_CAP = 1024  # connections warmed by `auto` at most
FIRST_SECOND_NS = 1_000_000_000
FILES_HEADROOM = 64  # descriptors left for the run folder, the logs, a late connection


def auto_count(work: Work) -> int:
    """The requests that can be in flight in the first second of `work` (module docstring)."""
    count = sum(1 for plan in work.singles if plan.intended_ns < FIRST_SECOND_NS)
    for flow in work.flows:
        if flow.start_ns < FIRST_SECOND_NS:
            count += min(flow.concurrency, len(flow.plans)) if flow.kind == "batch" else 1
    return min(count, AUTO_CAP)


def warm_count(work: Work, requested: int | None, open_files: int | None) -> int:
    """Connections to warm: `requested` (None = auto), within the open-files headroom."""
    count = auto_count(work) if requested is None else requested
    if open_files is not None:
        count = min(count, max(0, open_files - FILES_HEADROOM))
    return max(0, count)
