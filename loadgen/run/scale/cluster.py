"""What `run --ray` decides without Ray: placement, clocks, the start, each shard's options,
and the records of a shard whose node was lost.

Beside `raycluster` (the only code that imports Ray, a contract in pyproject.toml), so that
every rule of a distributed run is a pure function tested without a cluster. A Ray run is
N shards of today's `run --shard i/N` (the split rule of `workload.shards`), each in its
own process on its node, told one start once every one is ready (`run.processes.told`),
brought back as run folders and joined by `run.merge.merge_shards`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from loadgen.errors import EXIT_INTERRUPTED, LoadgenError
from loadgen.results.records import empty_frame, to_frame
from loadgen.results.recover import fill_unrecorded, rebuild_work
from loadgen.results.runfolder import T0, RunInfo, ShardInfo
from loadgen.results.write import make_run_folder, write_records, write_run_info
from loadgen.run.options import RunOptions
from loadgen.workload.shards import Share, utc_text

STRICT_SPREAD, SPREAD = "STRICT_SPREAD", "SPREAD"  # Ray's placement strategies
CLOCK_SAMPLES = 8  # round trips per node; the offset is the fastest one's
START_LEAD_S = 1.0  # the agreed start lies this far ahead of the moment all were ready
LOST_AFTER_S = 10.0  # a shard not heard from this long is lost (its node, or its actor)
MAX_CLOCK_SKEW_MS = 10.0  # `--max-clock-skew-ms`: a node's offset above it refuses the run

# How a shard ended (run.json `ray.shards.*.outcome`)
OK, INTERRUPTED, KILLED, LOST, REFUSED = "ok", "interrupted", "killed", "lost", "refused"


@dataclass(frozen=True, slots=True)
class Placement:
    """How many shards, the placement group's strategy, and what to tell the user."""

    shards: int
    strategy: str
    note: str | None = None


def plan_placement(requested: int | None, alive_nodes: int) -> Placement:
    """One shard per node (STRICT_SPREAD) when the cluster has the nodes; else SPREAD, said.
    `requested` None: one shard per alive node."""
    if alive_nodes < 1:
        raise LoadgenError("the Ray cluster has no alive node to place a shard on")
    shards = alive_nodes if requested is None else requested
    if shards <= alive_nodes:
        return Placement(shards, STRICT_SPREAD)
    note = (
        f"{shards} shards on {alive_nodes} alive node{'s' if alive_nodes > 1 else ''}: placed "
        f"with {SPREAD}, so some nodes run more than one shard and their processes share "
        f"that node's cores (add nodes, or --shards {alive_nodes}, for one per node)"
    )
    return Placement(shards, SPREAD, note)


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One round trip: the driver's clock when it asked and when the answer came, and the
    node's clock as it answered (all wall-clock unix ns)."""

    sent_ns: int
    remote_ns: int
    received_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.received_ns - self.sent_ns


def clock_offset(samples: Sequence[ClockSample]) -> tuple[int, int]:
    """(offset, round trip) in ns: the node's clock minus the driver's, from the sample with
    the shortest round trip (its answer is least delayed one way or the other), taking the
    node's reading as made halfway through it. The error is at most half that round trip."""
    if not samples:
        raise LoadgenError("no clock sample from the node")
    best = min(samples, key=lambda s: s.rtt_ns)
    return best.remote_ns - (best.sent_ns + best.received_ns) // 2, best.rtt_ns


def skew_problems(offsets_ns: Mapping[int, int], bound_ms: float) -> list[str]:
    """Each shard whose node's clock is further than `bound_ms` from the driver's."""
    return [
        f"shard {index}: its node's clock is {offset / 1e6:+,.3f} ms from the driver's "
        f"(bound {bound_ms:g} ms)"
        for index, offset in sorted(offsets_ns.items())
        if abs(offset) > bound_ms * 1e6
    ]


def agree_start(now_unix_ns: int, lead_s: float = START_LEAD_S) -> int:
    """The start every shard is told: `lead_s` from now (all are ready, waiting for it)."""
    return now_unix_ns + round(lead_s * 1e9)


def shard_options(options: RunOptions, share: Share, out_dir: Path, url: str) -> RunOptions:
    """A shard's options: the run's, for its share, told its start, one engine process, in
    a folder of its own on its node, against the driver's target."""
    return replace(
        options, shard=share, start_when_told=True, start_at_unix_ns=None, workers=1,
        out_dir=out_dir, run_id=f"shard-{share.index}", url=url, quiet=True,
    )  # fmt: skip


def outcome_of(exit_code: int | None, recovered: bool) -> str:
    """How a shard whose process ended with `exit_code` ended (None: it never did)."""
    if recovered or exit_code is None or exit_code < 0:
        return KILLED
    return INTERRUPTED if exit_code == EXIT_INTERRUPTED else OK


def write_lost_shard(
    shard_dir: Path, template: RunInfo, share: Share, *, start_at_unix_ns: int,
    clock_offset_ns: int, alive_ns: int, reason: str,
) -> int:  # fmt: skip
    """The run folder of a shard whose node was lost with its folder: every plan of its
    share gets the record recovery gives a killed run (`cancelled` if due before the shard
    was last heard from, `alive_ns` after t0; `not_sent` after), and run.json says it was
    recovered (exit 5). `template`: another shard's run.json (same spec and seed). Returns
    the plans recorded."""
    shard = ShardInfo(
        index=share.index, count=share.count, start_at_unix_ns=start_at_unix_ns,
        start_at_utc=utc_text(start_at_unix_ns), clock_offset_ns=clock_offset_ns,
    )  # fmt: skip
    info = replace(template, run_id=shard_dir.name, shard=shard, workers=None, host=None)
    work = rebuild_work(info, shard_dir)
    filled = fill_unrecorded(work, empty_frame(), {0: alive_ns}, processes=1)
    frame = to_frame(filled) if filled else empty_frame()
    local_t0 = start_at_unix_ns + clock_offset_ns
    make_run_folder(shard_dir)
    write_records(shard_dir, frame.sort("request_id") if frame.height else frame)
    write_run_info(shard_dir, replace(
        info, planned=len(work.plans), t0=T0(unix_ns=local_t0, utc=utc_text(local_t0),
                                             measured_unix_ns=local_t0),
        interrupted=True, finished=True, recovered=True, stopped="incomplete",
        client_failure=f"lost: {reason}", connections=None, server_metrics=None,
    ))  # fmt: skip
    return len(work.plans)


def record_counts(frame: pl.DataFrame) -> dict[str, int]:
    """Records per outcome."""
    counts = frame.group_by("outcome").len()
    return {str(o): int(n) for o, n in counts.iter_rows()}


@dataclass(frozen=True, slots=True, kw_only=True)
class RayOptions:
    """`--ray [ADDRESS]`, `--shards N`, `--max-clock-skew-ms`."""

    address: str | None = None  # None: start a local Ray for the run; `auto`; host:port
    shards: int | None = None  # None: one per alive node
    max_clock_skew_ms: float = MAX_CLOCK_SKEW_MS
