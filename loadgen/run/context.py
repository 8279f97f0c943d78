"""The run context: one run as every part of it sees it, and the one interface of its runners.

`RunContext` is fixed before anything is sent: the workload, the options as every process
of the run uses them (its nonce and run id chosen), this process's plans, the run folder
and where its lines go. The runners, the drive loop of each engine process and the judging
take it whole instead of the values one by one. `Target` is the server as one engine
process reaches it, once the target is up (the built-in simulator started, or the URL).

A `Runner` sends a run's plans one way (`run.execute` chooses it once): in this process
(`run.local`), from N worker processes on this host (`run.scale.workers`), or from shards
on a Ray cluster (`run.scale.raycluster.driver`); each returns the one `RunResult`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loadgen.engine.runner import EngineConfig
from loadgen.engine.transport import Endpoint
from loadgen.run.live import LiveExporter
from loadgen.run.options import RunOptions
from loadgen.run.prepare import Prepared
from loadgen.run.record import RunResult
from loadgen.run.terminal import Terminal
from loadgen.workload.plans import Work
from loadgen.workload.spec import WorkloadSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """One run, as each of its parts needs it (see the module docstring)."""

    spec: WorkloadSpec
    options: RunOptions  # as every process of the run uses them
    work: Work  # this process's plans (its shard's share; a worker's share)
    run_dir: Path  # the run folder (made by the runner; a Ray run's by its merge)
    terminal: Terminal  # where its lines go, and whether it is quiet
    live: LiveExporter | None = None  # publishes its figures as they come; the caller closes it
    warn_size: bool = (
        True  # say when a class's plan is too small to be judged (not a capacity step)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """The server as one engine process reaches it."""

    base_url: str  # the URL given, or the built-in simulator's
    endpoint: Endpoint
    config: EngineConfig


class Runner(Protocol):
    """One way to send a run's plans (see the module docstring)."""

    def run(self, run: RunContext, prepared: Prepared) -> RunResult:
        """Send the run, write its folder, judge it."""
        ...
