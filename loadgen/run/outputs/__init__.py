"""A run's outputs: what consumes its records, each with one lifecycle.

`begin(t0)` once t0 is fixed (before the first send), `record` for each record as it lands
(None: the output takes none), `end(ended)` once the run is judged, with every record and
the summary. In a run's process they are the records spilled as parts (`records.Records`),
run.json and the judged run's files (`folder.RunJson`), the live figures
(`publish.LiveOutput`) and the progress line (`progress.Progress`); a worker process keeps
its records and its live tally. `Outputs` begins, feeds and ends them together, so no
runner wires them one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import polars as pl

from loadgen.results.records import RequestRecord
from loadgen.results.runfolder import T0, RunInfo
from loadgen.results.summary import Summary

OnRecord = Callable[[RequestRecord], None]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Ended:
    """A judged run, as its outputs end with it."""

    frame: pl.DataFrame  # every record, joined
    summary: Summary
    info: RunInfo  # run.json as the run ended


class Output(Protocol):
    """One consumer of a run's records in one process (see the module docstring)."""

    @property
    def record(self) -> OnRecord | None:
        """Takes each record as it lands, in the event loop: cheap, no I/O (None: none)."""

    def begin(self, t0: T0) -> None:
        """t0 is fixed; the schedule has not begun."""

    def end(self, ended: Ended) -> None:
        """The run is judged: every record and its summary are in `ended`."""


class Outputs:
    """The outputs of one process of a run, begun, fed and ended together, in their order
    (the records first: a record is never lost to a tally)."""

    def __init__(self, *each: Output | None) -> None:
        self.each = [output for output in each if output is not None]

    def begin(self, t0: T0) -> None:
        for output in self.each:
            output.begin(t0)

    def on_record(self) -> OnRecord:
        """What the engine calls with each record: the one output's own method when one
        takes records (no call in between), else each in turn."""
        takers = [output.record for output in self.each if output.record is not None]
        if len(takers) == 1:
            return takers[0]
        if len(takers) == 2:
            first, second = takers

            def both(record: RequestRecord) -> None:
                first(record)
                second(record)

            return both

        def every(record: RequestRecord) -> None:
            for take in takers:
                take(record)

        return every

    def end(self, ended: Ended) -> None:
        for output in self.each:
            output.end(ended)

    def first(self, kind: type[T]) -> T | None:
        """The first output of `kind` (the drive loop spills the records and draws the
        progress line)."""
        return next((output for output in self.each if isinstance(output, kind)), None)
