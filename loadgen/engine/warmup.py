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

Whatever `--warm-connections` asks, no more are opened than the plan's peak concurrency
(`peak_in_flight`: the most requests it can ever have in flight at once, so the most
connections it can ever use), `--max-in-flight` and the stated ceiling `MAX_WARM`; the run
says so when it caps. During the run a connection is opened only when a request finds
none idle, so the connections open at once never pass that peak either: a load tester
never floods a server beyond what its plan says.
"""

from __future__ import annotations

from collections import Counter

from loadgen.workload.plans import Work

AUTO_CAP = 1024  # connections warmed by `auto` at most
MAX_WARM = 16_384  # connections warmed at most, whatever --warm-connections says
FIRST_SECOND_NS = 1_000_000_000
FILES_HEADROOM = 64  # descriptors left for the run folder, the logs, a late connection


def auto_count(work: Work) -> int:
    """The requests that can be in flight in the first second of `work` (module docstring)."""
    count = sum(1 for plan in work.singles if plan.intended_ns < FIRST_SECOND_NS)
    for flow in work.flows:
        if flow.start_ns < FIRST_SECOND_NS:
            count += min(flow.concurrency, len(flow.plans)) if flow.kind == "batch" else 1
    return min(count, AUTO_CAP)


def peak_in_flight(work: Work) -> int:
    """The most requests `work` can have in flight at once (none finishing): every single
    request, each batch's concurrency (at most its documents), and each conversation's or
    agent's widest step (1, or a fan-out's branches)."""
    count = len(work.singles)
    for flow in work.flows:
        if flow.kind == "batch":
            count += min(flow.concurrency, len(flow.plans))
        else:
            count += max(Counter(plan.turn for plan in flow.plans).values(), default=0)
    return count


def warm_limit(
    work: Work, open_files: int | None, max_in_flight: int | None = None
) -> tuple[int, str]:
    """The most connections a run of `work` warms, and what sets that limit."""
    peak = "the plan's peak concurrency: the most requests it can have in flight at once"
    limits = [(peak_in_flight(work), peak), (MAX_WARM, "loadgen's ceiling for warm connections")]
    if max_in_flight is not None:
        limits.append((max_in_flight, "--max-in-flight"))
    if open_files is not None:
        limits.append((max(0, open_files - FILES_HEADROOM), "the open-files limit's headroom"))
    return min(limits, key=lambda limit: limit[0])


def warm_count(
    work: Work, requested: int | None, open_files: int | None, max_in_flight: int | None = None
) -> int:
    """Connections to warm: `requested` (None = auto), within `warm_limit`."""
    count = auto_count(work) if requested is None else requested
    return max(0, min(count, warm_limit(work, open_files, max_in_flight)[0]))


def warm_capped_note(
    work: Work, requested: int | None, open_files: int | None, max_in_flight: int | None = None
) -> str | None:
    """What a run says when it warms fewer connections than `--warm-connections` asked."""
    limit, why = warm_limit(work, open_files, max_in_flight)
    if requested is None or requested <= limit:
        return None
    return (f"--warm-connections {requested:,}: capped at {limit:,} ({why}); more would only "
            "flood the server")  # fmt: skip
