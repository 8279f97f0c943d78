"""run.json as the run writes it, and the judged run's files: the run folder's own output.

At t0, run.json with t0 in it (not yet finished: `report --recover` can finish a run killed
from then on); at the end, summary.json, histograms.parquet (the per-minute histograms
rolling windows read) and the final run.json. In between it is the run record as it stands,
what a second Ctrl-C (`interrupted`) or a client failure writes. The records themselves
are `records.Records`' (or, with workers, theirs).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from loadgen.analysis.minutes import run_histograms
from loadgen.results.runfolder import T0, RunInfo
from loadgen.results.write import write_histograms, write_run_info, write_summary
from loadgen.run.outputs import Ended
from loadgen.run.processes.told import ToldStart
from loadgen.run.record import interrupted_record, told_shard
from loadgen.workload.spec import WorkloadSpec


class RunJson:
    """The run record from t0 to the end (see the module docstring). `told`: the start a
    driver told this shard, which its record says once it is known (at t0)."""

    record = None

    def __init__(
        self, run_dir: Path, info: RunInfo, spec: WorkloadSpec, *, told: ToldStart | None = None
    ) -> None:
        self.run_dir = run_dir
        self.info = info  # the record before t0 (the told start added at t0)
        self.current = info  # the record as it stands: with t0 once fixed
        self.slos = {name: cls.slo for name, cls in spec.classes.items()}
        self.told = told

    def begin(self, t0: T0) -> None:
        told = self.told
        if told is not None and told.start_at_unix_ns is not None:
            shard = told_shard(self.info.shard, told.start_at_unix_ns, told.clock_offset_ns)
            self.info = replace(self.info, shard=shard)
        self.current = replace(self.info, t0=t0)
        write_run_info(self.run_dir, replace(self.current, interrupted=False, finished=False))

    def interrupted(self) -> None:
        """A second Ctrl-C: record that the user stopped the run (so `report --recover`
        finishes it as interrupted, 130, never as killed)."""
        write_run_info(self.run_dir, interrupted_record(self.current))

    def end(self, ended: Ended) -> None:
        write_summary(self.run_dir, ended.summary)
        # Per-minute mergeable histograms: rolling windows over many runs read these, not records.
        write_histograms(self.run_dir, run_histograms(self.run_dir, ended.frame, self.slos))
        write_run_info(self.run_dir, ended.info)
