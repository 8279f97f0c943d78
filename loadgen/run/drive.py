"""The drive loop of one engine process: t0, the engine, and what runs beside it.

Called by a single-process run (`run.local`) and by each worker (`run.scale.workers`).
Beside the engine run a control task (the signals, `watch_signals`, or a parent's
commands, `run.processes.group.obey_parent`), the record spills and the progress line (the
outputs', `run.outputs`), the watchdog, and the t0 anchor; they all end when the engine
does. Interrupts follow the one policy of every run (`run.interrupt`).
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import anyio

from loadgen.engine.clock import SYSTEM_CLOCK, Clock
from loadgen.engine.harness import run_beside, run_engine
from loadgen.engine.host import open_files_limit
from loadgen.engine.runner import Engine, LiveStats
from loadgen.engine.transport import Pool
from loadgen.engine.warmup import warm_capped_note, warm_count
from loadgen.errors import describe_os_error
from loadgen.results.runfolder import T0, ConnectionCounts
from loadgen.run.context import RunContext, Target
from loadgen.run.interrupt import interrupt
from loadgen.run.outputs import Outputs
from loadgen.run.outputs.progress import Progress
from loadgen.run.outputs.records import Records
from loadgen.run.record import RunState
from loadgen.workload.shards import utc_text

Control = Callable[[Engine, RunState], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class Start:
    """How an engine process learns its start: agreed before the run (`--start-at`: it warms
    shortly before it), told once it is ready (`told`: a parent's t0, a driver's start; it
    returns the start on this host's wall clock), or neither (200 ms from now)."""

    at_unix_ns: int | None = None
    told: Callable[[], Awaitable[int]] | None = None


def drive(
    run: RunContext, target: Target, outputs: Outputs, stats: LiveStats, *, start: Start,
    control: Control,
) -> RunState:  # fmt: skip
    """Run the engine on the run's plans from t0, with `control` (signals, or a parent's
    commands), the outputs (begun at t0, given each record as it lands) and the watchdog.

    Returns the state: `interrupted`, `watchdog` (what it stopped), `t0`, `connections`,
    `client_failure` (a record write that failed for good). A told start is asked for once
    the loop and the engine are up and the connections warm (so a worker is not still
    setting up when t0 comes).
    """
    state = RunState()
    terminal = run.terminal

    async def session(engine: Engine) -> None:
        def client_failed(exc: OSError) -> None:
            """A record write failed for good: stop sending, end what is in flight."""
            if state.client_failure is None:
                state.client_failure = exc
                what = describe_os_error(exc, exc.filename)
                terminal.warn(f"\nclient failure: {what}; stopping the run")
            engine.stop()
            engine.requests.cancel()

        if start.at_unix_ns is not None:  # warm shortly before an agreed start, not now
            lead_ns = start.at_unix_ns - WARM_LEAD_NS - engine.clock.wall_ns()
            if lead_ns > 0:
                await anyio.sleep(lead_ns / 1e9)
        await warm_up(engine, run, state)
        start_ns = start.at_unix_ns if start.told is None else await start.told()
        state.t0 = t0 = choose_t0(start_ns, engine.clock)
        t0_ns = int(t0.perf_counter_ns or 0)
        if start_ns is not None:
            wait_s = (t0_ns - engine.clock.now_ns()) / 1e9
            terminal.say(f"waiting {max(0.0, wait_s):,.1f} s for the agreed start {t0.utc}")
        outputs.begin(t0)
        await run_beside(
            engine, t0_ns,
            partial(control, engine, state),
            partial(_beside_outputs, outputs.first(Records), outputs.first(Progress),
                    client_failed),
            partial(_watchdog, engine, run, state),
            partial(_measure_anchor, state, t0, engine.clock),
        )  # fmt: skip

    pool = Pool(target.endpoint)
    run_engine(run.work, pool, target.config, outputs.on_record(), session, stats=stats)
    if state.connections is not None:
        opened = pool.opened - pool.warm_opened
        state.connections = replace(state.connections, opened_during_run=opened)
    return state


async def warm_up(engine: Engine, run: RunContext, state: RunState) -> None:
    """Open the run's first connections before t0 (`engine.warmup`); say so when some failed."""
    options, terminal = run.options, run.terminal
    files, in_flight = open_files_limit(), options.max_in_flight
    count = warm_count(engine.work, options.warm_connections, files, in_flight)
    note = warm_capped_note(engine.work, options.warm_connections, files, in_flight)
    if note is not None:
        terminal.say(f"warm connections: {note}")
    report = await engine.connector.warm(count)
    state.connections = ConnectionCounts(
        warm_requested=report.requested,
        warm_opened=report.opened,
        warm_failed=report.failed,
        warm_s=round(report.seconds, 6),
    )
    if report.failed:
        terminal.say(
            f"warning: {report.failed} of {report.requested} warm connections failed "
            f"({report.error}); those requests open their own connections during the run"
        )


WARM_LEAD_NS = 2_000_000_000  # with an agreed start: warm this long before it


def choose_t0(start_at_unix_ns: int | None, clock: Clock = SYSTEM_CLOCK) -> T0:
    """t0 on both clocks: 200 ms from now (time for the tasks and first imports to settle),
    or the agreed wall-clock start converted to this process's monotonic clock."""
    perf_now, unix_now = clock.now_ns(), clock.wall_ns()
    if start_at_unix_ns is None:
        t0_ns = perf_now + 200_000_000
        unix_ns = unix_now + 200_000_000
    else:
        t0_ns, unix_ns = perf_now + (start_at_unix_ns - unix_now), start_at_unix_ns
    return T0(perf_counter_ns=t0_ns, unix_ns=unix_ns, utc=utc_text(unix_ns))


async def _measure_anchor(state: RunState, t0: T0, clock: Clock) -> None:
    """At t0, read the wall clock again: `measured_unix_ns` is the wall-clock time of t0 as
    read when the monotonic clock got there (what `loadgen merge` aligns shards by; it
    differs from `unix_ns` by any wall-clock adjustment during the wait), and
    `reached_late_ms` how late this process woke for it."""
    t0_ns = int(t0.perf_counter_ns or 0)
    delay_ns = t0_ns - clock.now_ns()
    if delay_ns > 0:
        await anyio.sleep(delay_ns / 1e9)
    unix_now, perf_now = clock.wall_ns(), clock.now_ns()
    state.t0 = replace(
        t0,
        measured_unix_ns=unix_now - (perf_now - t0_ns),
        reached_late_ms=round(max(0, perf_now - t0_ns) / 1e6, 3),
    )


async def watch_signals(
    engine: Engine, state: RunState, run: RunContext, exit_now: Callable[[], None]
) -> None:
    """The signals of a single-process run, under the one interrupt policy
    (`run.interrupt`): the grace ended, in-flight requests are cancelled. `exit_now`: what a
    second interrupt writes before the process exits."""
    grace_s = run.options.grace_s
    stop = partial(interrupt, state, grace_s, run.terminal, stop=engine.stop,
                   exit_now=exit_now, folder=run.run_dir)  # fmt: skip
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            stop()
            with anyio.move_on_after(grace_s):
                async for _ in signals:
                    stop()
            engine.requests.cancel()


async def _watchdog(engine: Engine, run: RunContext, state: RunState) -> None:
    """Abort the run when nothing has progressed for `--watchdog` seconds while work is due.

    Progress is a send, a byte received or a request ending. Work is due when requests are
    in flight or the next scheduled send time has passed. Deadlines normally end stuck
    requests; this catches what they cannot (a client bug, deadlines set longer than the
    patience of the job). Everything not finished is recorded as cancelled.
    """
    limit_s = run.options.watchdog_s
    stats, connector = engine.stats, engine.connector
    while True:
        await anyio.sleep(min(1.0, limit_s / 4))
        now = engine.clock.now_ns()
        last = max(stats.last_progress_ns, connector.last_read_ns, engine.t0_ns)
        due = engine.next_due_ns is not None and engine.next_due_ns <= now
        if (stats.in_flight or due) and now - last > limit_s * 1e9:
            waiting = (f"{stats.in_flight} requests in flight" if stats.in_flight
                       else "the scheduler's next send")  # fmt: skip
            state.watchdog = (
                f"nothing progressed for {limit_s:g} s (no send, no byte, no completion) while "
                f"waiting for {waiting}; {stats.sent} of {stats.planned} sent"
            )
            run.terminal.warn(f"\nwatchdog: {state.watchdog}; stopping, records kept")
            engine.stop()
            engine.requests.cancel()
            return


async def _beside_outputs(
    records: Records | None, progress: Progress | None, client_failed: Callable[[OSError], None]
) -> None:
    """About four times a second: spill the records due (in a thread), redraw the progress
    line; the line is ended when the engine is done."""
    try:
        while True:
            await anyio.sleep(0.25)
            if records is not None:
                await records.spill_due(client_failed)
            if progress is not None:
                progress.draw()
    finally:
        if progress is not None:
            progress.close()
