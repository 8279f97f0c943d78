"""The run's live figures: per-class counts and bucketed latencies, folded in record by record.

Beside the engine, not in it: `LiveTally.observe` is called once per *finished request*
(from the record stream, where `RecordWriter.add` is), never per chunk, and feeds what the
live exporters publish while a run goes on (`loadgen.run.live`: a Prometheus endpoint and
an OTLP push). A tally is mergeable (`merge`) and travels as plain data (`to_wire`), so a
`--workers N` run's parent publishes one endpoint for all processes, and a capacity search
one endpoint for all its steps.

The measures follow `metrics.derive` and the summary's populations exactly, so a last
scrape equals `summary.json`: TTFT, TPOT, ITL and E2E are over `ok` requests (TTFT =
first token − intended send, TPOT = (last − first) / (N − 1) for N > 1, ITL = every gap
between output-bearing chunks, E2E = last token (else end) − intended); `output_tokens`
counts every record's tokens by class and outcome, failures' partial output included (its
`ok` part is the summary's `output_tokens.total`; `good_output_tokens` are goodput's); `good`
is `slo.per_request`'s `meets_slo` (ok and within every per-request threshold); the send
lag is the generator's lag (dispatch − intended) of the requests the schedule placed
(singles and first turns), as `generator.lag_ms`.
"""

from __future__ import annotations

import itertools
import threading
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from loadgen.measures import BY_COLUMN, E2E, GAP, ITL, SLO_MEASURES, TOKEN, TPOT, TTFT, Measure
from loadgen.results.records import Outcome, RequestRecord
from loadgen.units import NS_PER_MS, NS_PER_S

# The measures the live tally follows: those a target can be set on, as the per-minute
# histograms keep them; and the generator's own send lag (dispatch − intended, of the
# scheduled sends: the summary's `generator.lag_ms`), which is no class's measure.
LIVE: tuple[Measure, ...] = SLO_MEASURES
SEND_LAG = "send_lag"
# Histogram bucket upper bounds in seconds, chosen for LLM serving latencies, for each
# measure a target can be set on (`LIVE`) and the generator's send lag. TTFT spans a
# warm short prompt (10 ms) to a long prefill behind a queue (2 min); TPOT and ITL a fast
# speculative decode (1 ms a token) to a stalled stream (5 s a gap); E2E a short answer to a
# long generation (10 min). The steps are roughly 1-2.5-5 per decade, finer where SLOs are
# usually set (TTFT 100 ms-2 s, TPOT 10-100 ms: 5 ms apart from 25 to 50 ms, where a
# `histogram_quantile` would otherwise interpolate across a wide bucket), and the
# boundaries of vLLM's own `vllm:time_to_first_token_seconds` (0.001 ... 2560) and
# `vllm:time_per_output_token_seconds` (0.01 ... 80), which the OpenTelemetry GenAI
# conventions' gen_ai.server.* histograms share, are all included inside that range, so
# client and server histograms can be read on one Grafana panel.
BUCKETS_S: dict[str, tuple[float, ...]] = {
    TTFT.name: (
        0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.25,
        1.5, 2.0, 2.5, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 120.0,
    ),
    TPOT.name: (
        0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.045,
        0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    ),
    ITL.name: (
        0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.045,
        0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    ),
    E2E.name: (
        0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0,
        120.0, 180.0, 300.0, 600.0,
    ),
    SEND_LAG: (
        0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        2.5, 5.0,
    ),
}  # fmt: skip
MEASURES = (*(m.name for m in LIVE), SEND_LAG)
if set(BUCKETS_S) != set(MEASURES):  # a measure with no buckets would be tallied nowhere
    raise ValueError(f"BUCKETS_S needs buckets for {sorted(set(MEASURES) ^ set(BUCKETS_S))}")
BUCKETS_NS = {
    name: tuple(round(b * NS_PER_S) for b in bounds) for name, bounds in BUCKETS_S.items()
}


class Histogram:
    """Counts per bucket (the last is +Inf), their sum in seconds and their count."""

    __slots__ = ("counts", "sum_s")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)
        self.sum_s = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        """Counts at or below each bound, +Inf last (what the exposition formats carry)."""
        total, out = 0, []
        for n in self.counts:
            total += n
            out.append(total)
        return out


class LiveTally:
    """Counts and histograms per class, safe to read from another thread while observed.

    `thresholds_ms`: per class, the per-request limits of its SLO (`SloTargets.thresholds_ms`)
    that make a request good. Keys of the counters are class names (and outcomes).
    """

    def __init__(self, thresholds_ms: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self.thresholds_ms = {k: dict(v) for k, v in (thresholds_ms or {}).items()}
        self.requests: dict[tuple[str, str], int] = {}
        self.output_tokens: dict[tuple[str, str], int] = {}  # by class and outcome
        self.good_requests: dict[str, int] = {}
        self.good_output_tokens: dict[str, int] = {}
        self.histograms: dict[tuple[str, str], Histogram] = {}
        self._lock = threading.Lock()

    def observe(self, record: RequestRecord) -> None:
        """Fold one finished request in (one call per record, never per chunk)."""
        cls = record.class_name
        values = _measures_ns(record)
        good = _is_good(record, values, self.thresholds_ms.get(cls, {}))
        with self._lock:
            key = (cls, record.outcome.value)
            self.requests[key] = self.requests.get(key, 0) + 1
            self.output_tokens[key] = self.output_tokens.get(key, 0) + record.output_tokens
            if good:
                self.good_requests[cls] = self.good_requests.get(cls, 0) + 1
                self.good_output_tokens[cls] = (
                    self.good_output_tokens.get(cls, 0) + record.output_tokens
                )
            for measure, seconds in values.items():
                self._add(measure, cls, seconds)

    def _add(self, measure: str, cls: str, values_ns: Iterable[float]) -> None:
        bounds = BUCKETS_NS[measure]
        hist = self.histograms.get((measure, cls))
        if hist is None:
            hist = self.histograms[(measure, cls)] = Histogram(len(bounds))
        counts = hist.counts
        total_ns = 0.0
        for value in values_ns:
            counts[bisect_left(bounds, value)] += 1  # a value on a bound is in its bucket (le)
            total_ns += value
        hist.sum_s += total_ns / NS_PER_S

    def classes(self) -> list[str]:
        """Every class seen, sorted."""
        with self._lock:
            seen = {c for c, _ in self.requests} | set(self.thresholds_ms)
        return sorted(seen)

    def snapshot(self) -> LiveTally:
        """A copy to read while observing goes on (what an exporter collects from)."""
        return LiveTally.from_wire(self.to_wire())

    def merge(self, other: LiveTally) -> None:
        """Add another tally's counts (another worker's, a finished capacity step's)."""
        wire = other.to_wire()
        with self._lock:
            for name in ("good_requests", "good_output_tokens"):
                mine: dict[str, int] = getattr(self, name)
                for cls, n in wire[name].items():
                    mine[cls] = mine.get(cls, 0) + n
            for cls, outcome, n in wire["requests"]:
                self.requests[(cls, outcome)] = self.requests.get((cls, outcome), 0) + n
            for cls, outcome, n in wire["output_tokens"]:
                key = (cls, outcome)
                self.output_tokens[key] = self.output_tokens.get(key, 0) + n
            for measure, cls, counts, sum_s in wire["histograms"]:
                hist = self.histograms.get((measure, cls))
                if hist is None:
                    hist = self.histograms[(measure, cls)] = Histogram(len(BUCKETS_S[measure]))
                hist.counts = [a + b for a, b in zip(hist.counts, counts, strict=True)]
                hist.sum_s += sum_s
            for cls, limits in other.thresholds_ms.items():
                self.thresholds_ms.setdefault(cls, dict(limits))

    def to_wire(self) -> dict[str, Any]:
        """Plain data (a worker sends it to its parent twice a second)."""
        with self._lock:
            return {
                "thresholds_ms": {k: dict(v) for k, v in self.thresholds_ms.items()},
                "requests": [(c, o, n) for (c, o), n in self.requests.items()],
                "output_tokens": [(c, o, n) for (c, o), n in self.output_tokens.items()],
                "good_requests": dict(self.good_requests),
                "good_output_tokens": dict(self.good_output_tokens),
                "histograms": [
                    (m, c, list(h.counts), h.sum_s) for (m, c), h in self.histograms.items()
                ],
            }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> LiveTally:
        tally = cls(wire["thresholds_ms"])
        tally.requests = {(c, o): n for c, o, n in wire["requests"]}
        tally.output_tokens = {(c, o): n for c, o, n in wire["output_tokens"]}
        tally.good_requests = dict(wire["good_requests"])
        tally.good_output_tokens = dict(wire["good_output_tokens"])
        for measure, name, counts, sum_s in wire["histograms"]:
            hist = tally.histograms[(measure, name)] = Histogram(len(BUCKETS_S[measure]))
            hist.counts, hist.sum_s = list(counts), float(sum_s)
        return tally


def _measures_ns(record: RequestRecord) -> dict[str, list[float]]:
    """This record's values of each measure in ns (see the module docstring), as
    `metrics.derive` computes them from each measure's columns (`measures`)."""
    out: dict[str, list[float]] = {}
    intended = record.intended_ns
    if record.turn in (None, 0):
        dispatched = record.dispatched_ns if record.dispatched_ns is not None else record.sent_ns
        if dispatched is not None:
            out[SEND_LAG] = [dispatched - intended]
    if record.outcome is not Outcome.OK:
        return out
    for measure in LIVE:
        values = _values_ns(record, measure)
        if values:
            out[measure.name] = values
    return out


def _values_ns(record: RequestRecord, measure: Measure) -> list[float]:
    """One ok record's values of one measure in ns: none where a moment never happened."""
    if measure.per == GAP:
        times: Sequence[int] = getattr(record, measure.end)
        return [b - a for a, b in itertools.pairwise(times)]
    start: int | None = getattr(record, measure.start)
    end: int | None = getattr(record, measure.end)
    if end is None and measure.end_if_none is not None:
        end = getattr(record, measure.end_if_none)
    if start is None or end is None:
        return []
    if measure.per == TOKEN:
        n = record.output_tokens
        return [(end - start) / (n - 1)] if n > 1 else []
    return [end - start]


def _is_good(
    record: RequestRecord, values_ns: Mapping[str, list[float]], limits_ms: Mapping[str, float]
) -> bool:
    """`meets_slo`: ok, and within every set threshold (a measure that does not apply,
    such as TPOT for one token, passes). ITL's limit applies to the largest gap, an
    unstamped one included (`RequestRecord.unstamped_max_gap_ns`). Compared in float ms as
    `metrics.derive` computes them, so a value on the limit judges alike."""
    if record.outcome is not Outcome.OK:
        return False
    for name, limit_ms in limits_ms.items():
        measure = BY_COLUMN[name]
        seen = values_ns.get(measure.name, [])
        if measure.per == GAP and record.unstamped_max_gap_ns is not None:
            seen = [*seen, record.unstamped_max_gap_ns]
        if seen and float(max(seen)) / NS_PER_MS > limit_ms:
            return False
    return True
