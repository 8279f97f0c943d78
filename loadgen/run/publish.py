"""How one run feeds a `LiveExporter` (`--prometheus-port`, `--otlp-endpoint`), in one
process or from the workers' tallies: its labels, its plans per class, t0, its final tally."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from loadgen import __version__
from loadgen.analysis.live import LiveTally
from loadgen.results.records import RequestRecord
from loadgen.results.runfolder import RunInfo
from loadgen.run.live import LiveExporter, LiveRun
from loadgen.run.scraper import ScraperProcess
from loadgen.workload.plans import Work
from loadgen.workload.spec import WorkloadSpec


@dataclass(slots=True)
class Publish:
    """How one run feeds a `LiveExporter`: the run's labels, its plans per class, a t0
    holder, and (once the run is over) its final tally, of every record."""

    live: LiveExporter
    labels: dict[str, str]
    planned: dict[str, int]
    thresholds_ms: dict[str, dict[str, float]]
    t0_ns: list[int] = field(default_factory=list)  # filled in at t0
    final: LiveTally = field(default_factory=LiveTally)
    scraper: ScraperProcess | None = None  # the server's /metrics, re-published as scraped

    def begin(
        self, tally: Callable[[], LiveTally], in_flight: Callable[[], dict[str, int]]
    ) -> None:
        scraper = self.scraper

        def server() -> dict[str, float]:
            return scraper.live_gauges() if scraper is not None else {}

        self.live.begin(LiveRun(labels=self.labels, tally=tally, in_flight=in_flight,
                                planned=self.planned, server=server,
                                t0_ns=lambda: self.t0_ns[0] if self.t0_ns else None))  # fmt: skip


def tally_of(spec: WorkloadSpec, records: Iterable[RequestRecord]) -> LiveTally:
    """The live tally of `records` under the spec's per-request thresholds."""
    tally = LiveTally(thresholds(spec))
    for record in records:
        tally.observe(record)
    return tally


def thresholds(spec: WorkloadSpec) -> dict[str, dict[str, float]]:
    return {name: cls.slo.thresholds_ms() for name, cls in spec.classes.items()}


def publisher(
    live: LiveExporter | None, spec: WorkloadSpec, work: Work, info: RunInfo
) -> Publish | None:
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
    return Publish(live=live, labels=labels, planned=planned, thresholds_ms=thresholds(spec))
