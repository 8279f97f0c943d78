"""`loadgen run --workers N`: one schedule sent by N engine processes on one host.

The runner `run.execute` chooses when a run needs more than one engine process: a run on
this host (`run.host`, the same folder, target and judging as the local runner's). The
parent splits the planned work with `shards.split_work` (whole flows per process, every
N-th start), starts N processes (a `processes.group.ProcessGroup`), waits until each has
imported and built its engine, then picks t0 — 500 ms ahead on the wall clock, or the
agreed `--start-at` — and sends it to all. Each worker converts it to its own monotonic
clock and runs the same `Engine` a single-process run uses (`run.drive`), spilling its
records as `records.parts/part-w<i>-<n>.parquet` into the one run folder, and reports
counters to the parent twice a second over a pipe. The parent draws one progress line for
all, owns the signals (workers ignore SIGINT/SIGTERM: the parent tells them to stop,
cancel or exit) and joins every part into `records.parquet`. Records keep the plan's
intended times on the common t0; each worker's t0 differs from the parent's by the µs it
takes to read two clocks (`t0_skew_us` in run.json).

Failure rules: a worker that dies loses at most its last second of records; its plans
without a record become `client_error` records (the client failed: the run is invalid,
exit 3); the others' records are kept. A worker whose watchdog fires stops the run (exit
4). A parent killed outright takes its workers with it (`processes.lifeline`: SIGKILL the
moment it dies, on Linux), so a killed multi-process run leaves what a killed single
process leaves, the parts written so far, and `loadgen report --recover` finishes both the
same way. Where the kernel cannot do that, a worker sees its pipe close (or its parent
change) and stops: it cancels what is in flight, writes every record and exits.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import polars as pl

from loadgen.analysis.histograms import LatencyHistogram
from loadgen.analysis.live import LiveTally
from loadgen.engine.host import raise_open_files_limit
from loadgen.engine.runner import Engine, LiveStats
from loadgen.errors import describe_os_error
from loadgen.results.records import Outcome, RequestRecord, to_frame
from loadgen.results.runfolder import PARTS_DIR, T0, RunInfo, read_parts
from loadgen.results.write import ShareWriter, join_parts, write_records
from loadgen.run.context import RunContext, Target
from loadgen.run.drive import Start, choose_t0, drive
from loadgen.run.failure import client_failure
from loadgen.run.host import HostSetup, finish, on_this_host
from loadgen.run.options import RunOptions
from loadgen.run.outputs import Outputs
from loadgen.run.outputs.folder import RunJson
from loadgen.run.outputs.progress import Progress
from loadgen.run.outputs.publish import LiveOutput, Publish, Tally
from loadgen.run.outputs.records import Records
from loadgen.run.prepare import Prepared
from loadgen.run.processes.child import Pipe
from loadgen.run.processes.group import (
    CANCEL,
    DONE,
    Child,
    ProcessGroup,
    obey_parent,
    ready_then_wait,
)
from loadgen.run.record import Ran, RunResult, RunState, WorkerEnd, process_info, with_processes
from loadgen.run.setup import client_setup, engine_setup
from loadgen.run.terminal import Terminal
from loadgen.workload.plans import Work
from loadgen.workload.shards import Share, split_work
from loadgen.workload.spec import WorkloadSpec

START_LEAD_NS = 500_000_000  # t0 this far after the last worker is ready


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerTask:
    """What one worker process needs (pickled to it at spawn)."""

    index: int
    spec: WorkloadSpec
    options: RunOptions
    base_url: str
    share: Work
    run_dir: Path
    thresholds_ms: dict[str, dict[str, float]] | None = None  # set: keep a live tally


# -- the worker process --------------------------------------------------------------------


def worker_main(task: WorkerTask, conn: Pipe) -> None:
    """Entry point of a worker process (a `processes.child.Child`: it dies with its parent
    and leaves it the signals): set up, report ready, run from the parent's t0."""
    spec, options = task.spec, task.options
    raise_open_files_limit()
    run = RunContext(spec=spec, options=options, work=task.share, run_dir=task.run_dir,
                     terminal=Terminal(sys.stderr, quiet=True))  # fmt: skip
    adapter, headers, redactor, _ = client_setup(spec, options)
    endpoint, config = engine_setup(spec, options, task.base_url, adapter, headers, redactor)
    writer = ShareWriter(task.run_dir, task.index)
    stats = LiveStats()
    tally = Tally(task.thresholds_ms) if task.thresholds_ms is not None else None

    async def told() -> int:
        start = await anyio.to_thread.run_sync(ready_then_wait, conn)
        if start is None:  # the parent gave up before the start
            sys.exit(0)
        return int(start)

    def report() -> tuple[Any, ...]:  # the heartbeat: counters (and the live tally)
        live = (tally.tally.to_wire(), dict(stats.in_flight_by_class)) if tally else None
        return ("stats", counters(stats), stats.ttft.encode(), live)

    async def control(engine: Engine, state: RunState) -> None:
        await obey_parent(conn, engine, state, options.grace_s, exit_now=writer.flush,
                          report=report)  # fmt: skip

    target = Target(base_url=task.base_url, endpoint=endpoint, config=config)
    state = drive(run, target, Outputs(Records(writer), tally), stats, start=Start(told=told),
                  control=control)  # fmt: skip
    failure = state.client_failure
    try:
        writer.flush()
    except OSError as exc:  # the disk is full (or the like): the parent names it, exit 3
        failure = failure or exc
    done = WorkerEnd(
        interrupted=state.interrupted, watchdog=state.watchdog, t0=state.t0,
        connections=state.connections,
        client_failure=describe_os_error(failure, failure.filename) if failure else None,
    )  # fmt: skip
    with contextlib.suppress(OSError):  # the parent is gone; the records are on disk
        conn.send((DONE, os.getpid(), done))


def counters(stats: LiveStats) -> dict[str, int]:
    """The progress counters of one worker."""
    return {
        "planned": stats.planned,
        "sent": stats.sent,
        "in_flight": stats.in_flight,
        "ok": stats.ok,
        "failed": stats.failed,
        "retries": stats.retries,
    }


# -- the parent ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Worker:
    """The parent's view of one worker: its process and what it last said."""

    child: Child
    share: Work
    done: WorkerEnd | None = None
    counters: dict[str, int] | None = None
    ttft: str | None = None
    heard: float = 0.0  # time.monotonic() of its last message
    live: tuple[dict[str, Any], dict[str, int]] | None = None  # its tally and in-flight


@dataclass(frozen=True, slots=True)
class WorkersRunner:
    """Send the run from `count` worker processes on this host (see the module docstring);
    the parent audits their joined records as a single process's."""

    count: int  # engine processes
    chosen: str  # why that many (run.json's `workers.chosen`)

    def run(self, run: RunContext, prepared: Prepared) -> RunResult:
        return on_this_host(run, prepared, self)

    def send(self, run: RunContext, setup: HostSetup) -> RunResult:
        """Start the workers, give them one t0, supervise them to the end, join their
        records; then the run judged. The live exporter gets their tallies merged, as
        they come."""
        options, terminal, count = run.options, run.terminal, self.count
        per_worker = _per_worker_options(options, count)
        publish = setup.publish
        thresholds = publish.thresholds_ms if publish is not None else None
        shares = [split_work(run.work, Share(index, count)) for index in range(count)]
        tasks = [
            (WorkerTask(index=index, spec=run.spec, options=per_worker, share=share,
                        base_url=setup.target.base_url, run_dir=run.run_dir,
                        thresholds_ms=thresholds),)
            for index, share in enumerate(shares)
        ]  # fmt: skip
        run_json = RunJson(run.run_dir, setup.info, run.spec)
        with ProcessGroup(worker_main, tasks, "loadgen-worker", "worker") as group:
            workers = [_Worker(child=c, share=s) for c, s in zip(group.children, shares,
                                                                 strict=True)]  # fmt: skip
            outputs = _parent_outputs(run, workers, run_json, publish)
            progress = outputs.first(Progress)
            assert progress is not None
            listen = _listener(workers)
            group.wait_ready(listen)
            t0 = choose_t0(options.start_at_unix_ns or time.time_ns() + START_LEAD_NS)
            t0_ns = int(t0.perf_counter_ns or 0)
            group.start(t0.unix_ns)
            outputs.begin(t0)
            if options.start_at_unix_ns is not None:
                wait_s = (t0_ns - time.perf_counter_ns()) / 1e9
                terminal.say(f"waiting {max(0.0, wait_s):,.1f} s for the agreed start {t0.utc}")
            state = group.supervise(
                listen, grace_s=options.grace_s, terminal=terminal, folder=run.run_dir,
                tick=_supervisor(workers, group, run, progress), before_exit=run_json.interrupted,
            )  # fmt: skip
            progress.close()
        frame, info = _joined(run, workers, run_json.current, t0)
        ran = Ran(frame=frame, info=info, state=state)
        return finish(
            ran, run, outputs, planned=len(run.work.plans), scraper=setup.scraper, spans=setup.spans
        )


def _parent_outputs(
    run: RunContext, workers: list[_Worker], run_json: RunJson, publish: Publish | None
) -> Outputs:
    """The parent's outputs: run.json, the live figures (the workers' tallies merged) and
    one progress line for all; the records are the workers'."""
    live = None
    if publish is not None:
        live = LiveOutput(publish, in_flight=lambda: merged_in_flight(workers),
                          merged=lambda: merged_tally(workers))  # fmt: skip

    def running() -> str:
        return f"  workers {sum(w.child.running for w in workers)}/{len(workers)}"

    return Outputs(run_json, live, Progress(run.terminal, lambda: merged_stats(workers), running))


def _joined(
    run: RunContext, workers: list[_Worker], info: RunInfo, t0: T0
) -> tuple[pl.DataFrame, RunInfo]:
    """Every worker's parts joined into records.parquet (a record for each plan of a worker
    that died first), and the run record with each worker's share of the run."""
    run_dir = run.run_dir
    # A worker whose writes failed (disk full, ...) or a failed join: exit 3, parts kept.
    failed = [w.done.client_failure for w in workers if w.done and w.done.client_failure]
    joined: pl.DataFrame | None = None
    try:
        joined = join_parts(run_dir)
    except OSError as exc:
        failed.append(describe_os_error(exc, exc.filename or run_dir))
    if failed or joined is None:
        written = joined.height if joined is not None else read_parts(run_dir / PARTS_DIR).height
        raise client_failure(failed[0], run_dir, info, written=written,
                             planned=len(run.work.plans))  # fmt: skip
    frame = _fill_missing(joined, workers, run)
    done_t0 = [(w.done.t0 if w.done else None) or t0 for w in workers]
    processes = [
        process_info(frame, [p.request_id for p in w.share.plans], index=w.child.index,
                     pid=w.child.pid or 0, t0=wt0, parent_t0=t0,
                     lag_bound_ms=run.options.lag_bound_ms, exit_code=w.child.exit_code,
                     connections=w.done.connections if w.done else None)
        for w, wt0 in zip(workers, done_t0, strict=True)
    ]  # fmt: skip
    measured = replace(t0, measured_unix_ns=done_t0[0].measured_unix_ns)
    return frame, with_processes(replace(info, t0=measured), processes)


def _per_worker_options(options: RunOptions, count: int) -> RunOptions:
    """Each worker's options: `--max-in-flight` is split (rounded up) across the workers."""
    cap = options.max_in_flight
    return replace(options, max_in_flight=None if cap is None else -(-cap // count))


def _listener(workers: list[_Worker]) -> Callable[[Child, tuple[Any, ...]], None]:
    """What the parent does with each worker's message: note when, and keep what it said."""
    by_child = {id(w.child): w for w in workers}

    def heard(child: Child, message: tuple[Any, ...]) -> None:
        worker = by_child[id(child)]
        worker.heard = time.monotonic()
        if message[0] == "stats":
            worker.counters, worker.ttft = message[1], message[2]
            worker.live = message[3]
        elif message[0] == DONE:
            worker.done = message[2]

    return heard


def _supervisor(
    workers: list[_Worker], group: ProcessGroup, run: RunContext, progress: Progress
) -> Callable[[RunState], None]:
    """What the parent does besides the group's own supervision, a few times a second: stop
    the rest when one worker's watchdog fires or one falls silent, draw the progress line."""

    def tick(state: RunState) -> None:
        watchdog = next((w.done.watchdog for w in workers if w.done and w.done.watchdog), None)
        if watchdog and state.watchdog is None:
            state.watchdog = watchdog
            group.tell((CANCEL,))
        _stop_silent(workers, group, state, run)
        progress.draw()

    return tick


def _stop_silent(
    workers: list[_Worker], group: ProcessGroup, state: RunState, run: RunContext
) -> None:
    """A worker silent for `--watchdog` seconds (its loop is stuck: it reports twice a
    second) is killed and the run stopped as by the watchdog; what it wrote is kept."""
    limit_s = run.options.watchdog_s
    now = time.monotonic()
    for worker in workers:
        if worker.child.running and now - worker.heard > limit_s:
            index = worker.child.index
            message = f"worker {index} sent nothing for {limit_s:g} s (its loop is stuck)"
            run.terminal.warn(f"\nwatchdog: {message}; stopping, records kept")
            if state.watchdog is None:
                state.watchdog = message
            worker.child.kill()
            group.tell((CANCEL,))


def merged_stats(workers: list[_Worker]) -> LiveStats:
    """The workers' latest counters summed, and their TTFT histograms merged."""
    total = LiveStats()
    for worker in workers:
        counts = worker.counters or {"planned": len(worker.share.plans)}
        for name, value in counts.items():
            setattr(total, name, getattr(total, name) + value)
        if worker.ttft:
            total.ttft.merge(LatencyHistogram.decode(worker.ttft))
    return total


def merged_tally(workers: list[_Worker]) -> LiveTally:
    """The workers' latest live tallies, merged (each is at most half a second old)."""
    total = LiveTally()
    for worker in workers:
        if worker.live is not None:
            total.merge(LiveTally.from_wire(worker.live[0]))
    return total


def merged_in_flight(workers: list[_Worker]) -> dict[str, int]:
    """The workers' latest in-flight counts per class, summed."""
    total: dict[str, int] = {}
    for worker in workers:
        if worker.live is not None and worker.child.running:
            for cls, n in worker.live[1].items():
                total[cls] = total.get(cls, 0) + n
    return total


def _fill_missing(frame: pl.DataFrame, workers: list[_Worker], run: RunContext) -> pl.DataFrame:
    """A record for every plan of a worker that died before recording it (`client_error`):
    planned == recorded, and the run says the client failed."""
    have = set(frame.get_column("request_id").to_list())
    missing: list[RequestRecord] = []
    for worker in workers:
        child = worker.child
        why = (
            f"worker {child.index} (pid {child.pid}) exited with code "
            f"{child.exit_code} before recording this request"
        )
        lost = [p for p in worker.share.plans if p.request_id not in have]
        if lost:
            run.terminal.warn(f"{why.replace('this request', f'{len(lost)} of its requests')}: "
                              "recorded as client_error")  # fmt: skip
        missing.extend(
            RequestRecord(
                request_id=plan.request_id, class_name=plan.class_name,
                intended_ns=plan.intended_ns, outcome=Outcome.CLIENT_ERROR, error=why,
                prompt_tokens_target=plan.prompt_tokens, max_tokens=plan.output_tokens,
                session_id=plan.session_id, turn=plan.turn,
            )
            for plan in lost
        )  # fmt: skip
    if not missing:
        return frame

    joined = pl.concat([frame, to_frame(missing)]).sort("request_id")
    write_records(run.run_dir, joined)
    return joined
