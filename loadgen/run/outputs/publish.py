"""How one run feeds a `LiveExporter` (`--prometheus-port`, `--otlp-endpoint`), in one
process or from the workers' tallies: its labels, its plans per class, t0, the tally as the
records land, and once the run is over its final tally, of every record."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from loadgen import __version__
from loadgen.analysis.live import LiveTally
from loadgen.results.records import RequestRecord, from_frame
from loadgen.results.runfolder import T0, RunInfo
from loadgen.run.live import LiveExporter, LiveRun
from loadgen.run.outputs import Ended
from loadgen.workload.plans import Work
from loadgen.workload.spec import WorkloadSpec


@dataclass(frozen=True, slots=True)
class Publish:
    """What one run publishes on a `LiveExporter`: its labels, its plans per class, its
    per-request thresholds, and the server's own gauges (the scraper's latest, if any)."""

    live: LiveExporter
    labels: dict[str, str]
    planned: dict[str, int]
    thresholds_ms: dict[str, dict[str, float]]
    server: Callable[[], Mapping[str, float]] = dict


class LiveOutput:
    """The run's figures on its exporter as the run goes: published at once (before t0),
    t0 once fixed, and when the run is judged its final tally, of every record.

    In the process that sends (`merged` None) it keeps its own tally of each record as it
    lands; a workers' parent (`merged`: their latest tallies) sees no record until the end,
    and then tallies every one."""

    def __init__(
        self, publish: Publish, *, in_flight: Callable[[], Mapping[str, int]],
        merged: Callable[[], LiveTally] | None = None,
    ) -> None:  # fmt: skip
        self.publish = publish
        self.tally = LiveTally(publish.thresholds_ms) if merged is None else None
        self.record = self.tally.observe if self.tally is not None else None
        self.t0_ns: int | None = None
        current = self.tally.snapshot if self.tally is not None else merged
        assert current is not None
        publish.live.begin(LiveRun(labels=publish.labels, tally=current, in_flight=in_flight,
                                   planned=publish.planned, server=publish.server,
                                   t0_ns=lambda: self.t0_ns))  # fmt: skip

    def begin(self, t0: T0) -> None:
        self.t0_ns = int(t0.perf_counter_ns or 0)

    def end(self, ended: Ended) -> None:
        """The final tally (this process's, or every record's) replaces the live one."""
        final = self.tally
        if final is None:
            final = tally_of(self.publish.thresholds_ms, from_frame(ended.frame))
        self.publish.live.end(final)


class Tally:
    """A worker's live tally of its records: its heartbeat carries it to the parent, whose
    `LiveOutput` merges every worker's."""

    def __init__(self, thresholds_ms: dict[str, dict[str, float]]) -> None:
        self.tally = LiveTally(thresholds_ms)
        self.record = self.tally.observe

    def begin(self, t0: T0) -> None:
        pass

    def end(self, ended: Ended) -> None:
        pass  # a worker does not judge: the parent tallies every record at the end


def tally_of(
    thresholds_ms: dict[str, dict[str, float]], records: Iterable[RequestRecord]
) -> LiveTally:
    """The live tally of `records` under the per-request thresholds."""
    tally = LiveTally(thresholds_ms)
    for record in records:
        tally.observe(record)
    return tally


def thresholds(spec: WorkloadSpec) -> dict[str, dict[str, float]]:
    return {name: cls.slo.thresholds_ms() for name, cls in spec.classes.items()}


def publisher(
    live: LiveExporter | None, spec: WorkloadSpec, work: Work, info: RunInfo,
    server: Callable[[], Mapping[str, float]] = dict,
) -> Publish | None:  # fmt: skip
    """The run's `Publish`, when it has a live exporter."""
    if live is None:
        return None
    known = info.workload.identity if info.workload is not None else None
    labels = {
        "run_id": info.run_id,
        "workload": spec.name,
        "workload_key": str((known or {}).get("key", "")),
        "api": spec.target.api,
        "model": spec.target.model or "",
        "version": __version__,
    }
    planned = dict(Counter(plan.class_name for plan in work.plans))
    return Publish(live=live, labels=labels, planned=planned, thresholds_ms=thresholds(spec),
                   server=server)  # fmt: skip
