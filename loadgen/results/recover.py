"""`loadgen report --recover`: finish a run that was killed outright, one record per plan.

A run killed by SIGKILL, the OOM killer or a lost CI runner leaves its run folder with
`run.json` (`finished: false`), the record parts written so far (about once a second) and
one heartbeat file per engine process (`records.parts/heartbeat*`, touched four times a
second: its modification time is the last moment that process was seen alive). Recovery
rebuilds the run's exact plan from run.json (the resolved spec and the seed: plans are a
pure function of them; a shard takes its share, by the same split rule), joins the parts
(every readable one: a damaged part is skipped, saying why, and kept aside in
`records.damaged/`), and gives every plan without a record one, so planned == recorded:

- `cancelled` when it was sent (or due) before its process's last heartbeat and no record
  survived: it was in flight, or finished within the second before the kill whose part was
  never written. A single request or a flow's first request is due at its intended time;
  a later turn or hop at its previous one's end plus its think or tool time (when that
  one's record survived); a batch document while fewer than `concurrency` were running.
- `not_sent` otherwise: its time had not come by the last heartbeat (or it waited on a
  turn that never finished). A request sent in the last quarter second before the kill,
  after the last heartbeat, is counted here too: the heartbeat's resolution.

`recovered_records` computes that; `results.write.recover` writes it. The run is then
marked `recovered`, `stopped: incomplete`: no verdict on the server
(exit 5), whatever its records say, and the same with any `--workers` count (each worker's
plans are judged by its own heartbeat). A run without heartbeats (written by an older
loadgen) is judged by the latest moment its records show.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from loadgen.errors import LoadgenError
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.runfolder import (
    HEARTBEAT,
    PARTS_DIR,
    RECORDS_FILE,
    RunInfo,
    readable_parts,
)
from loadgen.units import NS_PER_S
from loadgen.workload.identity import spec_from_resolved
from loadgen.workload.plans import Flow, RequestPlan, Work, plan_work
from loadgen.workload.shards import Share, split_work


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """What `recover` did: records kept from the parts, and the plans it recorded."""

    planned: int
    kept: int
    cancelled: int
    not_sent: int
    nothing_to_do: bool = False  # the run already has its records.parquet: left as it is
    # Parts that could not be read, by name, each with why (`runfolder.readable_parts`):
    # their plans are recorded as the others without a record are; the files are kept aside.
    skipped: Mapping[str, str] = field(default_factory=dict)
    stopped: str = "incomplete"  # how it is marked: `interrupted` (the user), `incomplete`


def recovered_records(run_dir: Path, info: RunInfo) -> tuple[pl.DataFrame, Recovery] | None:
    """A killed run's records, one per plan (see the module docstring), and what was done;
    None when the run already has its records.parquet (`results.write.recover` writes the
    records and marks the run)."""
    parts = run_dir / PARTS_DIR
    if not parts.exists():
        if (run_dir / RECORDS_FILE).exists():
            return None
        raise LoadgenError(f"{run_dir} has neither {RECORDS_FILE} nor {PARTS_DIR}")
    work = rebuild_work(info, run_dir)
    frame, skipped = readable_parts(parts)
    alive = last_alive_ns(parts, info, frame)
    cause = "interrupted (a second Ctrl-C)" if info.stopped == "interrupted" else "killed"
    filled = fill_unrecorded(work, frame, alive, processes=_process_count(info), cause=cause)
    joined = pl.concat([frame, to_frame(filled)]).sort("request_id") if filled else frame
    counts = {o: sum(r.outcome is o for r in filled) for o in (Outcome.CANCELLED, Outcome.NOT_SENT)}
    stopped = "interrupted" if info.stopped == "interrupted" else "incomplete"
    done = Recovery(planned=len(work.plans), kept=frame.height, cancelled=counts[Outcome.CANCELLED],
                    not_sent=counts[Outcome.NOT_SENT], skipped=skipped,
                    stopped=stopped)  # fmt: skip
    return joined, done


def rebuild_work(info: RunInfo, run_dir: Path) -> Work:
    """The run's plan from its run.json: spec + seed, and the shard's share of it."""
    try:
        spec = spec_from_resolved(info.workload.spec if info.workload else {})
        work = plan_work(spec, spec.seed if info.seed is None else info.seed)
    except (LoadgenError, OSError) as exc:
        raise LoadgenError(
            f"{run_dir}: cannot rebuild the run's plan from run.json, so the requests it never "
            f"recorded cannot be accounted for: {exc}. If a file the workload reads (a trace) "
            "moved, put it back where run.json says and run --recover again"
        ) from None
    if info.shard:
        work = split_work(work, Share(info.shard.index, info.shard.count))
    planned = info.planned
    if planned is not None and planned != len(work.plans):
        raise LoadgenError(
            f"{run_dir}: the rebuilt plan has {len(work.plans)} requests, run.json says "
            f"{planned}: this loadgen plans the workload differently from the one that ran it "
            f"({info.loadgen_version or '?'}); recover it with that version"
        )
    return work


def _process_count(info: RunInfo) -> int:
    return max(1, info.workers.count if info.workers else 1)


def last_alive_ns(parts: Path, info: RunInfo, frame: pl.DataFrame) -> dict[int, int]:
    """Per engine process (0 for a single-process run), the last moment it was seen alive,
    in ns since t0: its heartbeat's modification time, else the latest time in the records."""
    t0 = info.t0
    t0_unix_ns = (t0.measured_unix_ns or t0.unix_ns or 0) if t0 else 0
    alive: dict[int, int] = {}
    for path in parts.glob(f"{HEARTBEAT}*"):
        suffix = path.name.removeprefix(HEARTBEAT).removeprefix("-w")
        index = int(suffix) if suffix.isdigit() else 0
        alive[index] = path.stat().st_mtime_ns - t0_unix_ns
    if not alive:
        times = frame.select(pl.max_horizontal("intended_ns", "dispatched_ns", "end_ns").max())
        latest = times.item() if frame.height else None
        alive = {i: int(latest) if latest is not None else 0 for i in range(_process_count(info))}
    return alive


def fill_unrecorded(
    work: Work, frame: pl.DataFrame, alive_ns: Mapping[int, int], *, processes: int,
    cause: str = "killed",
) -> list[RequestRecord]:  # fmt: skip
    """A `cancelled` or `not_sent` record for every plan of `work` that `frame` lacks, its
    error naming how the run ended (`cause`: killed, or interrupted by a second Ctrl-C)."""
    ends = {
        int(r["request_id"]): (str(r["outcome"]), r["end_ns"])
        for r in frame.select("request_id", "outcome", "end_ns").iter_rows(named=True)
    }
    filled: list[RequestRecord] = []
    for index in range(processes):
        share = split_work(work, Share(index, processes)) if processes > 1 else work
        alive = alive_ns.get(index, max(alive_ns.values(), default=0))
        for single in share.singles:
            if single.request_id not in ends:
                filled.append(_unrecorded(single, single.intended_ns, alive, cause))
        for flow in share.flows:
            filled.extend(_flow_unrecorded(flow, ends, alive, cause))
    return filled


def _flow_unrecorded(
    flow: Flow, ends: Mapping[int, tuple[str, int | None]], alive: int, cause: str
) -> list[RequestRecord]:
    """The unrecorded requests of one flow, each with the moment it became due (or None)."""
    out: list[RequestRecord] = []
    due: int | None = flow.start_ns
    if flow.kind == "batch":  # documents in order, `concurrency` at a time
        unrecorded = [p for p in flow.plans if p.request_id not in ends]
        for running, plan in enumerate(unrecorded):
            out.append(_unrecorded(plan, due if running < flow.concurrency else None, alive,
                                   cause))  # fmt: skip
        return out
    for plan in flow.plans:
        if plan.turn and due is not None:
            due += round(plan.delay_s * NS_PER_S)
        if plan.request_id not in ends:
            out.append(_unrecorded(plan, due, alive, cause))
            due = None  # the next turn waited on this one's answer, which never came
            continue
        outcome, end_ns = ends[plan.request_id]
        due = end_ns if outcome == Outcome.OK.value and end_ns is not None else None
    return out


def _unrecorded(
    plan: RequestPlan, due_ns: int | None, alive_ns: int, cause: str = "killed"
) -> RequestRecord:
    """`cancelled` if it was due by the last heartbeat, else `not_sent`."""
    seen = f"{alive_ns / NS_PER_S:.2f} s"
    if due_ns is not None and due_ns <= alive_ns:
        outcome, intended = Outcome.CANCELLED, due_ns
        error = (f"run {cause}: due at {due_ns / NS_PER_S:.2f} s, before the last heartbeat "
                 f"({seen}), and no record survived (in flight, or finished in the second "
                 "before the run ended)")  # fmt: skip
    else:
        outcome, intended = Outcome.NOT_SENT, max(plan.intended_ns, due_ns or 0)
        error = f"run {cause}: not due by the last heartbeat ({seen}), never sent"
    return RequestRecord(
        request_id=plan.request_id, class_name=plan.class_name, intended_ns=intended,
        outcome=outcome, error=error, prompt_tokens_target=plan.prompt_tokens,
        max_tokens=plan.output_tokens, session_id=plan.session_id, turn=plan.turn,
    )  # fmt: skip
