"""The runner of one engine process: this one, with its own signals, progress line and
watchdog (`run.drive`), its records spilled into the run folder as it goes.

A run on this host (`run.host`) whose plans one process sends: the default, and every
shard (`--shard i/N`, by hand or placed by `--ray`). A shard told its start by a driver
(`--start-when-told`) waits for it on stdin (`processes.told`) once it is ready.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from loadgen.engine.runner import Engine, LiveStats
from loadgen.results.write import RecordWriter
from loadgen.run.context import RunContext
from loadgen.run.drive import Start, drive, watch_signals
from loadgen.run.failure import client_failures
from loadgen.run.host import HostSetup, finish, on_this_host
from loadgen.run.outputs import Outputs
from loadgen.run.outputs.folder import RunJson
from loadgen.run.outputs.progress import Progress
from loadgen.run.outputs.publish import LiveOutput
from loadgen.run.outputs.records import Records
from loadgen.run.prepare import Prepared
from loadgen.run.processes.told import ToldStart
from loadgen.run.record import Ran, RunResult, RunState, process_info, with_processes


@dataclass(frozen=True, slots=True)
class LocalRunner:
    """Send the run from this process (see the module docstring)."""

    chosen: str  # why one process (run.json's `workers.chosen`)
    count: int = 1  # engine processes

    def run(self, run: RunContext, prepared: Prepared) -> RunResult:
        return on_this_host(run, prepared, self)

    def send(self, run: RunContext, setup: HostSetup) -> RunResult:
        """The engine, here, from t0 to the last record; then the run judged."""
        writer = RecordWriter(run.run_dir)
        stats = LiveStats()
        told = ToldStart() if run.options.start_when_told else None
        run_json = RunJson(run.run_dir, setup.info, run.spec, told=told)
        live = None
        if setup.publish is not None:
            live = LiveOutput(setup.publish, in_flight=lambda: dict(stats.in_flight_by_class))
        outputs = Outputs(Records(writer), run_json, live, Progress(run.terminal, lambda: stats))

        def exit_now() -> None:
            """A second Ctrl-C: write what is pending, and record that the user stopped the
            run (so `report --recover` finishes it as interrupted, 130, never as killed)."""
            writer.flush()
            run_json.interrupted()

        async def control(engine: Engine, state: RunState) -> None:
            await watch_signals(engine, state, run, exit_now)

        start = Start(at_unix_ns=run.options.start_at_unix_ns,
                      told=told.wait if told is not None else None)  # fmt: skip
        with client_failures(run.run_dir, writer, stats, lambda: run_json.current):
            state = drive(run, setup.target, outputs, stats, start=start, control=control)
            if state.client_failure is not None:
                raise state.client_failure
            frame = writer.close()
            t0 = state.t0
            assert t0 is not None  # fixed before the schedule began
            mine = process_info(frame, None, index=0, pid=os.getpid(), t0=t0, parent_t0=t0,
                                lag_bound_ms=run.options.lag_bound_ms,
                                connections=state.connections)  # fmt: skip
            info = with_processes(replace(run_json.info, t0=t0), [mine])
            ran = Ran(frame=frame, info=info, state=state)
            return finish(
                ran, run, outputs, planned=stats.planned, scraper=setup.scraper, spans=setup.spans
            )
