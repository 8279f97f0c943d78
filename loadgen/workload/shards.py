"""Shares of one schedule: how a run is split across worker processes and across hosts.

Sits between the plans and the engine. `plan_work(spec, seed)` gives every request of the
run; `split_work` gives the part one process sends. The rule (the same for `--workers` and
`--shard`): take the run's *starts* — every independent request and every flow (a chat
session, an agent trajectory, a closed-loop batch: requests chained on each other's
answers, so a flow is never split) — in start order (request-id order, which
`plan_work` assigns by start time), and give the k-th start to share k mod N. Every share
then carries about 1/N of the arrival rate at every moment of the schedule, and the shares
together are exactly the plan: request ids, intended times, classes and token counts are
those of a single-process run with the same seed.

Also the two command-line values a shard needs: `i/N` and the agreed start time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from loadgen.errors import OptionError
from loadgen.units import NS_PER_S
from loadgen.workload.model import MAX_SPAN_S
from loadgen.workload.plans import Flow, RequestPlan, Work

START_TOLERANCE_S = 1.0  # a start this far in the past is still accepted (its sends run late)


@dataclass(frozen=True, slots=True)
class Share:
    """Share `index` (from 0) of `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def start_key(start: RequestPlan | Flow) -> int:
    """A start's position in the schedule: its (first) request id."""
    return start.request_id if isinstance(start, RequestPlan) else start.plans[0].request_id


def split_work(work: Work, share: Share) -> Work:
    """The requests and flows of `share` (see the module docstring for the rule)."""
    if share.count == 1:
        return work
    starts: list[RequestPlan | Flow] = [*work.singles, *work.flows]
    order = sorted(range(len(starts)), key=lambda i: start_key(starts[i]))
    mine = {i for rank, i in enumerate(order) if rank % share.count == share.index}
    singles = [p for i, p in enumerate(work.singles) if i in mine]
    offset = len(work.singles)
    flows = [f for i, f in enumerate(work.flows) if i + offset in mine]
    return Work(singles=singles, flows=flows)


def share_ids(work: Work, share: Share) -> list[int]:
    """The request ids of `share`, ascending."""
    return [p.request_id for p in split_work(work, share).plans]


def parse_share(text: str) -> Share:
    """`i/N` (i from 0 to N-1, as Kubernetes' JOB_COMPLETION_INDEX counts) as a Share."""
    index_text, sep, count_text = text.partition("/")
    try:
        index, count = int(index_text), int(count_text)
    except ValueError:
        index, count = -1, 0
    if not sep or count < 1 or not 0 <= index < count:
        raise OptionError(
            "--shard",
            f"{text!r} is not i/N with 0 <= i < N",
            "e.g. --shard 0/4 ... --shard 3/4 (i counts from 0, like JOB_COMPLETION_INDEX)",
        )
    return Share(index, count)


def parse_start_at(text: str) -> int:
    """The agreed start as unix ns: unix seconds (`1764417600.5`) or ISO 8601
    (`2026-11-29T12:00:00Z`; without an offset the time is UTC)."""
    try:
        return round(float(text) * NS_PER_S)
    except (ValueError, OverflowError):  # not a number; inf, nan
        pass
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise OptionError(
            "--start-at",
            f"{text!r} is neither unix seconds nor an ISO 8601 time",
            "e.g. --start-at $(( $(date +%s) + 60 )) or --start-at 2026-11-29T12:00:00Z",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * NS_PER_S)


def check_start_at(start_unix_ns: int, now_unix_ns: int) -> float:
    """Seconds until the agreed start; ConfigError when it passed more than a little ago."""
    wait_s = (start_unix_ns - now_unix_ns) / NS_PER_S
    if wait_s < -START_TOLERANCE_S:
        raise OptionError(
            "--start-at",
            f"the agreed start {utc_text(start_unix_ns)} was {-wait_s:,.1f} s ago",
            "agree on a start far enough ahead for every shard to be launched and ready",
        )
    if wait_s > MAX_WAIT_S:
        raise OptionError(
            "--start-at", f"the agreed start is {wait_s / 86_400:,.1f} days away",
            f"agree on a start within {MAX_WAIT_S // 86_400} days",
        )  # fmt: skip
    return wait_s


MAX_WAIT_S = MAX_SPAN_S  # a start further ahead is a typo (or seconds given as ms)


def utc_text(unix_ns: int) -> str:
    """`2026-11-29T12:00:00.000000+00:00`."""
    return datetime.fromtimestamp(unix_ns / NS_PER_S, UTC).isoformat()
