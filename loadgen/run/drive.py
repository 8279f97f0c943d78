"""The drive loop of one engine process: t0, the engine, and what runs beside it.

Called by a single-process run (`run.execute`) and by each worker (`run.workers`). Beside
the engine run a control task (the signals, `watch_signals`, or a parent's commands,
`run.spawn.obey_parent`), the record spills and progress line, the watchdog, and the t0
anchor; they all end when the engine does. `interrupt` is the one interrupt policy, of a
single process and of a group of processes (`run.spawn.ProcessGroup`) alike.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio
from polars.exceptions import PanicException

from loadgen.engine.clock import SYSTEM_CLOCK, Clock
from loadgen.engine.harness import run_beside, run_engine
from loadgen.engine.host import open_files_limit
from loadgen.engine.runner import Engine, EngineConfig, LiveStats
from loadgen.engine.transport import Endpoint, Pool
from loadgen.engine.warmup import warm_capped_note, warm_count
from loadgen.errors import EXIT_INTERRUPTED, TRANSIENT_ERRNOS, describe_os_error
from loadgen.results.records import RequestRecord
from loadgen.results.runfolder import T0, ConnectionCounts
from loadgen.results.write import RecordWriter
from loadgen.run.options import RunOptions
from loadgen.run.record import RunState
from loadgen.workload.plans import Work
from loadgen.workload.shards import utc_text


def drive(
    work: Work,
    endpoint: Endpoint,
    config: EngineConfig,
    writer: RecordWriter,
    stats: LiveStats,
    options: RunOptions,
    *,
    start_at_unix_ns: int | None,
    started: Callable[[T0], None],
    control: Callable[[Engine, RunState], Coroutine[Any, Any, None]],
    quiet: bool,
    log: TextIO,
    wait_start: Callable[[], Awaitable[int]] | None = None,
    observe: Callable[[RequestRecord], None] | None = None,
) -> RunState:
    """Run the engine on `work` from t0 (200 ms from now, or the agreed `start_at_unix_ns`),
    with `control` (signals, or a parent's commands), record spills and the watchdog.

    Returns the state: `interrupted`, `watchdog` (what it stopped), `t0`, `connections`,
    `client_failure` (a record write that failed for good). `started(t0)` is
    called once t0 is fixed, before the schedule begins. A worker process passes
    `wait_start`: it reports ready and returns the start its parent chose, once the loop
    and the engine are up (so a worker is not still setting up when t0 comes). `observe`
    sees each record as it lands (the live exporters' tally), after the writer has it.
    """
    state = RunState()

    async def session(engine: Engine) -> None:
        def client_failed(exc: OSError) -> None:
            """A record write failed for good: stop sending, end what is in flight."""
            if state.client_failure is None:
                state.client_failure = exc
                what = describe_os_error(exc, exc.filename)
                print(f"\nclient failure: {what}; stopping the run", file=log)
            engine.stop()
            engine.requests.cancel()

        if start_at_unix_ns is not None:  # warm shortly before an agreed start, not now
            lead_ns = start_at_unix_ns - WARM_LEAD_NS - engine.clock.wall_ns()
            if lead_ns > 0:
                await anyio.sleep(lead_ns / 1e9)
        await warm_up(engine, options, state, quiet, log)
        start = start_at_unix_ns if wait_start is None else await wait_start()
        state.t0 = t0 = choose_t0(start, engine.clock)
        t0_ns = int(t0.perf_counter_ns or 0)
        if start is not None and not quiet:
            wait_s = (t0_ns - engine.clock.now_ns()) / 1e9
            print(f"waiting {max(0.0, wait_s):,.1f} s for the agreed start {t0.utc}", file=log)
        started(t0)
        await run_beside(
            engine, t0_ns,
            partial(control, engine, state),
            partial(_progress, stats, writer, quiet, t0_ns, log, client_failed, engine.clock),
            partial(_watchdog, engine, options.watchdog_s, state, log),
            partial(_measure_anchor, state, t0, engine.clock),
        )  # fmt: skip

    pool = Pool(endpoint)
    add = writer.add

    def observed(record: RequestRecord) -> None:
        add(record)  # first: a record is never lost to the tally
        observe(record)  # type: ignore[misc]  # only used when observe is set

    on_record = add if observe is None else observed
    run_engine(work, pool, config, on_record, session, stats=stats)
    if state.connections is not None:
        opened = pool.opened - pool.warm_opened
        state.connections = replace(state.connections, opened_during_run=opened)
    return state


async def warm_up(
    engine: Engine, options: RunOptions, state: RunState, quiet: bool, log: TextIO
) -> None:
    """Open the run's first connections before t0 (`engine.warmup`); say so when some failed."""
    files, in_flight = open_files_limit(), options.max_in_flight
    count = warm_count(engine.work, options.warm_connections, files, in_flight)
    note = warm_capped_note(engine.work, options.warm_connections, files, in_flight)
    if note is not None and not quiet:
        print(f"warm connections: {note}", file=log)
    report = await engine.connector.warm(count)
    state.connections = ConnectionCounts(
        warm_requested=report.requested,
        warm_opened=report.opened,
        warm_failed=report.failed,
        warm_s=round(report.seconds, 6),
    )
    if report.failed and not quiet:
        print(
            f"warning: {report.failed} of {report.requested} warm connections failed "
            f"({report.error}); those requests open their own connections during the run",
            file=log,
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
    engine: Engine, grace_s: float, exit_now: Callable[[], None], state: RunState, log: TextIO,
    *, folder: Path | None = None,
) -> None:  # fmt: skip
    """The signals of a single-process run, under the one interrupt policy (`interrupt`):
    the grace ended, in-flight requests are cancelled."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            interrupt(state, grace_s, log, stop=engine.stop, exit_now=exit_now, folder=folder)
            with anyio.move_on_after(grace_s):
                async for _ in signals:
                    interrupt(state, grace_s, log, stop=engine.stop, exit_now=exit_now,
                              folder=folder)  # fmt: skip
            engine.requests.cancel()


def interrupt(
    state: RunState, grace_s: float, log: TextIO, *, stop: Callable[[], None],
    exit_now: Callable[[], None], folder: Path | None = None,
) -> None:  # fmt: skip
    """The interrupt policy of every run, one process or many. First Ctrl-C/SIGTERM: stop
    sending (`stop`), in-flight requests get `grace_s`, then the caller cancels them.
    Second: write what is pending and mark the run interrupted (`exit_now`), say where the
    run folder is, what it holds and how to finish it, and exit at once, 130 (the parts
    written so far stay readable)."""
    if state.interrupted:
        exit_now()
        print(f"\n{second_interrupt_text(folder)}", file=log)
        os._exit(EXIT_INTERRUPTED)
    state.interrupted = True
    print(
        f"\ninterrupted: no new requests; waiting up to {grace_s:g} s for "
        "in-flight ones (interrupt again to exit now)",
        file=log,
    )
    stop()


def second_interrupt_text(folder: Path | None) -> str:
    """What a second Ctrl-C leaves, and how to finish it."""
    where = "the run folder" if folder is None else str(folder)
    return (
        f"second interrupt: exited at once (exit 130). {where} keeps the records of the "
        "requests that had ended, in its record parts; those in flight or not yet sent have "
        f"none, and there is no summary yet: `loadgen report --recover {where}` gives every "
        "planned request a record (cancelled or not_sent) and writes its summary; the run "
        "stays interrupted (no verdict, exit 130)"
    )


async def _watchdog(engine: Engine, limit_s: float, state: RunState, log: TextIO) -> None:
    """Abort the run when nothing has progressed for `limit_s` while work is due.

    Progress is a send, a byte received or a request ending. Work is due when requests are
    in flight or the next scheduled send time has passed. Deadlines normally end stuck
    requests; this catches what they cannot (a client bug, deadlines set longer than the
    patience of the job). Everything not finished is recorded as cancelled.
    """
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
            print(f"\nwatchdog: {state.watchdog}; stopping, records kept", file=log)
            engine.stop()
            engine.requests.cancel()
            return


async def _progress(
    stats: LiveStats, writer: RecordWriter, quiet: bool, t0_ns: int, log: TextIO,
    client_failed: Callable[[OSError], None], clock: Clock,
) -> None:  # fmt: skip
    """Spill records about once a second (in a thread) and redraw the progress line.

    A write that fails for want of file descriptors is retried with the next batch (they
    come back as requests end); any other failed write (no space, permission, file size
    limit) stops the run through `client_failed`.
    """
    tty = log.isatty()
    last_line = 0.0
    try:
        while True:
            await anyio.sleep(0.25)
            batch = writer.take_due()
            if batch:
                await spill(writer, batch, client_failed)
            now = time.monotonic()
            if quiet or (not tty and now - last_line < 10):
                continue
            last_line = now
            line = progress_line(stats, (clock.now_ns() - t0_ns) / 1e9)
            print(f"\r{line}\x1b[K" if tty else line, end="" if tty else "\n", file=log, flush=True)
    finally:
        if tty and not quiet:
            print(file=log)


async def spill(
    writer: RecordWriter, batch: list[RequestRecord], client_failed: Callable[[OSError], None]
) -> None:
    """Write one batch as a part in a thread. A batch whose write fails goes back to the
    writer (out of file descriptors: retried later; any other OSError, such as no space
    left, also stops the run through `client_failed`); so does one whose task is cancelled
    (the run is ending) before the thread took it, for the final flush: never lost, never
    written twice."""
    written = False

    def write() -> None:
        nonlocal written
        writer.write_part(batch)
        written = True

    try:
        await anyio.to_thread.run_sync(write)
    except PanicException:  # polars short of file descriptors: retry later
        writer.requeue(batch)
    except OSError as exc:
        writer.requeue(batch)
        if exc.errno not in TRANSIENT_ERRNOS:
            client_failed(exc)
    except BaseException:
        if not written:  # cancelled at the checkpoint before the (shielded) write began
            writer.requeue(batch)
        raise


def progress_line(stats: LiveStats, elapsed_s: float) -> str:
    """`[  12.3s] sent 120/400  in flight 14  ok 100  failed 6  TTFT p50 250 ms  p99 800 ms`."""
    ttft = stats.ttft
    ttft_text = (
        f"TTFT p50 {ttft.percentile_ms(50):,.0f} ms  p99 {ttft.percentile_ms(99):,.0f} ms"
        if ttft.count
        else "TTFT -"
    )
    return (
        f"[{max(0.0, elapsed_s):7.1f}s] sent {stats.sent}/{stats.planned}  "
        f"in flight {stats.in_flight}  ok {stats.ok}  failed {stats.failed}  {ttft_text}"
    )
