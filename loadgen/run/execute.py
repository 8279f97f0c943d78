"""One run, end to end: plans → target → engine → records → summary, in a run folder.

The top of a run and its one entry (`loadgen run`, each `capacity` step, a Ray shard's
process): it checks and builds what the run needs before anything is sent (`run.prepare`),
chooses once how the plans are sent (a `context.Runner`: this process, `run.local`; N
worker processes, `run.scale.workers`; shards on a Ray cluster, `run.scale.raycluster`),
fixes the run context every part of the run shares (`context.RunContext`), and runs it.
Every runner hands back the one `RunResult`.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TextIO

from loadgen.results.runfolder import new_run_id
from loadgen.run.context import RunContext, Runner
from loadgen.run.host import choose_workers
from loadgen.run.live import LiveExporter
from loadgen.run.local import LocalRunner
from loadgen.run.options import RunOptions
from loadgen.run.prepare import prepare
from loadgen.run.record import RunResult
from loadgen.run.scale.cluster import RayOptions
from loadgen.run.scale.raycluster.driver import RayRunner
from loadgen.run.scale.workers import WorkersRunner
from loadgen.run.terminal import Terminal
from loadgen.workload.plans import Work
from loadgen.workload.spec import WorkloadSpec

__all__ = ["RunOptions", "RunResult", "choose_runner", "execute"]


def execute(
    spec: WorkloadSpec, options: RunOptions, *, ray: RayOptions | None = None,
    live: LiveExporter | None = None, log: TextIO | None = None, warn_size: bool = True,
) -> RunResult:  # fmt: skip
    """Run the workload and write its folder; see `RunResult.exit_code` for the verdict.

    `ray`: send it from shards on a Ray cluster (`--ray`). `live` publishes the run's figures
    as they come (`--prometheus-port`, `--otlp-endpoint`; not with `ray`); the caller closes
    it (a capacity search keeps one for all its steps). `log` takes the run's lines; none:
    whatever `sys.stderr` is at the call, not at import (click's test runner, pytest's
    capture and an embedding program swap it). `warn_size`: say (even with -q) when a
    class's plan is too small for its SLO to be judged at its confidence (a capacity step,
    which is extended when inconclusive, does not)."""
    on_ray = RayRunner.for_run(ray) if ray is not None else None  # no Ray: said first
    prepared = prepare(spec, options)
    runner = on_ray or choose_runner(spec, prepared.work, options.workers)
    run_id = options.run_id or new_run_id(spec.name)
    # Every process of the run sends the same nonce, and writes under the same run id.
    options = replace(options, run_id=run_id, nonce=prepared.cache.nonce)
    terminal = Terminal(sys.stderr if log is None else log, quiet=options.quiet)
    run = RunContext(spec=spec, options=options, work=prepared.work,
                     run_dir=options.out_dir / run_id, terminal=terminal, live=live,
                     warn_size=warn_size)  # fmt: skip
    return runner.run(run, prepared)


def choose_runner(spec: WorkloadSpec, work: Work, workers: int | None) -> Runner:
    """The runner of a run on this host: one engine process, or `--workers` (asked for, or
    one per core past this host's calibrated envelope: `host.choose_workers`)."""
    count, why = choose_workers(spec, work, workers)
    return WorkersRunner(count=count, chosen=why) if count > 1 else LocalRunner(chosen=why)
