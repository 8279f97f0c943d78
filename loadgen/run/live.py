"""A run's live figures for scrapers and collectors: a Prometheus endpoint, an OTLP push.

`LiveExporter` sits beside a run (`run.execute`), a capacity search (one exporter for all
its steps) or a calibration; it publishes a `LiveTally` (`loadgen.analysis.live`, folded in
record by record from the record stream, never from the per-chunk path) and the engines'
in-flight counts. Exposition is the official `prometheus_client` library's (a custom
collector: the tally is mergeable across worker processes, so the parent serves one
endpoint for a `--workers N` run), served from its own thread; `loadgen.run.otlp` pushes the
same figures through the OpenTelemetry SDK's OTLP exporter.

Metric names (all exported; the Grafana dashboard in `dashboards/` queries these):

| name | type | labels | what |
|---|---|---|---|
| `loadgen_run_info` | info | run_id, workload, workload_key, api, model, version | the run |
| `loadgen_requests_total` | counter | class, outcome | finished requests (every record) |
| `loadgen_requests_planned` | gauge | class | requests the run plans |
| `loadgen_requests_in_flight` | gauge | class | sent, not yet finished |
| `loadgen_good_requests_total` | counter | class | ok within every per-request SLO threshold |
| `loadgen_output_tokens_total` | counter | class, outcome | output tokens of every record |
| `loadgen_good_output_tokens_total` | counter | class | output tokens of good requests (goodput) |
| `loadgen_<measure>_seconds` | histogram | class | each `analysis.live.LIVE`, ok requests |
| `loadgen_send_lag_seconds` | histogram | class | dispatch − intended of scheduled sends |
| `loadgen_price_per_hour` | gauge | | `--price-per-hour` × `--replicas` (when given) |
| `loadgen_run_elapsed_seconds` | gauge | | since t0 (0 before it) |
| `loadgen_run_finished` | gauge | | 1 once the last record is in: final counts |
| `loadgen_server_{queue_depth,running,kv_usage}` | gauge | | the server's own, latest scrape |
| `loadgen_server_prefix_cache_hit_rate` | gauge | | (`--server-metrics-url`, if exposed) |
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import start_http_server

from loadgen.analysis.live import BUCKETS_S, LIVE, MEASURES, SEND_LAG, LiveTally
from loadgen.engine.network import Network
from loadgen.errors import OptionError

LATENCY_HELP = {
    **{m.name: f"{m.about}, ok requests" for m in LIVE},
    SEND_LAG: "Generator lag: dispatch - intended send time, scheduled requests",
}
SERVER_HELP = {  # analysis.server.LIVE_FIGURES, as the latest scrape of the server's /metrics
    "queue_depth": "The server's waiting requests, as its /metrics said at the latest scrape",
    "running": "The server's running requests, as its /metrics said at the latest scrape",
    "kv_usage": "The server's KV-cache usage (0-1), as its /metrics said at the latest scrape",
    "prefix_cache_hit_rate": "The server's prefix-cache hit rate (0-1), at the latest scrape",
}


@dataclass(slots=True)
class LiveRun:
    """What is published about the run going on now (replaced by each capacity step)."""

    labels: dict[str, str]
    tally: Callable[[], LiveTally]  # the current tally (a snapshot, or a merge of workers')
    in_flight: Callable[[], Mapping[str, int]]
    planned: Mapping[str, int]
    t0_ns: Callable[[], int | None] = lambda: None  # perf_counter_ns of t0, once known
    # the server's own gauges from the latest scrape of its /metrics (--server-metrics-url)
    server: Callable[[], Mapping[str, float]] = dict


@dataclass(slots=True)
class LiveState:
    """Finished runs' figures (a capacity search's earlier steps) plus the current run's."""

    done: LiveTally = field(default_factory=LiveTally)
    current: LiveRun | None = None
    finished: bool = False
    price_per_hour: float | None = None
    elapsed_s: float = 0.0  # of finished runs
    labels: dict[str, str] | None = None  # the latest run's, kept after it ends
    planned: dict[str, int] = field(default_factory=dict)  # of finished runs
    server: dict[str, float] = field(default_factory=dict)  # the last run's, kept after it ends


class LiveExporter:
    """One Prometheus endpoint (and optionally an OTLP push) for a run or a search.

    `begin(run)` publishes a run; `end(final)` folds its final tally in (counters stay
    monotonic across a capacity search's steps) and marks the figures final; `close()`
    keeps the endpoint up `grace_s` (a last scrape sees the final counts), then stops it.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        address: str = "127.0.0.1",
        grace_s: float = 15.0,
        otlp_endpoint: str | None = None,
        otlp_interval_s: float = 5.0,
        price_per_hour: float | None = None,
        network: Network | None = None,
    ) -> None:
        self.state = LiveState(price_per_hour=price_per_hour)
        self.grace_s = grace_s
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self.url: str | None = None
        self._server: Any = None
        if port is not None:
            try:
                self._server, _ = start_http_server(port, address, self.registry)
            except OSError as exc:
                raise OptionError(
                    "--prometheus-port",
                    f"cannot serve on {address}:{port}: {exc.strerror or exc}",
                    "choose a free port (0 picks one) or another address",
                ) from None  # fmt: skip
            host, bound = self._server.server_address[:2]
            self.url = f"http://{_url_host(str(host))}:{bound}/metrics"
        self.otlp = None
        if otlp_endpoint is not None:
            try:
                from loadgen.run.otlp import OtlpPush  # defers opentelemetry (the [otel] extra)
            except ImportError:
                raise OptionError(
                    "--otlp-endpoint", "needs the OpenTelemetry SDK",
                    "pip install 'loadgen[otel]'",
                ) from None  # fmt: skip
            self.otlp = OtlpPush(otlp_endpoint, self.families, interval_s=otlp_interval_s,
                                 network=network)  # fmt: skip

    def begin(self, run: LiveRun) -> None:
        with self._lock:
            self.state.current = run
            self.state.labels = run.labels
            self.state.finished = False

    def end(self, final: LiveTally) -> None:
        """The current run is over: `final` (its tally from every record) replaces it."""
        with self._lock:
            run = self.state.current
            if run is not None:
                self.state.elapsed_s += _elapsed_s(run)
                for cls, n in run.planned.items():
                    self.state.planned[cls] = self.state.planned.get(cls, 0) + n
            self.state.done.merge(final)
            if run is not None:
                self.state.server = dict(run.server())
            self.state.current = None
            self.state.finished = True
        if self.otlp is not None:
            self.otlp.push()

    def close(self, *, log: Callable[[str], None] | None = None) -> None:
        """Stay up `grace_s` for a last scrape (Ctrl-C cuts it short), then stop."""
        if self._server is not None and self.grace_s > 0:
            if log is not None:
                log(f"prometheus: {self.url} stays up {self.grace_s:g} s for a last scrape")
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(self.grace_s)
        if self.otlp is not None:
            self.otlp.close(log)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def tally(self) -> LiveTally:
        """Finished runs' figures plus the current run's, now."""
        with self._lock:
            done, run = self.state.done, self.state.current
            total = done.snapshot()
        if run is not None:
            total.merge(run.tally())
        return total

    def families(self) -> list[Metric]:
        """Every metric family as of now (what a scrape and an OTLP push carry)."""
        with self._lock:
            run, state = self.state.current, self.state
            finished, price, elapsed = state.finished, state.price_per_hour, state.elapsed_s
            labels, planned = state.labels, dict(state.planned)
        tally = self.tally()
        in_flight = dict(run.in_flight()) if run is not None else {}
        for cls, n in (run.planned if run is not None else {}).items():
            planned[cls] = planned.get(cls, 0) + n
        elapsed += _elapsed_s(run) if run is not None else 0.0
        with self._lock:
            server = dict(run.server()) if run is not None else dict(self.state.server)
        return list(
            _families(labels, tally, in_flight, planned, finished=finished,
                      price_per_hour=price, elapsed_s=elapsed, server=server)
        )  # fmt: skip


class _Collector:
    """The registry's one collector: families built from the exporter's state per scrape."""

    def __init__(self, exporter: LiveExporter) -> None:
        self.exporter = exporter

    def collect(self) -> Iterator[Metric]:
        yield from self.exporter.families()


def _elapsed_s(run: LiveRun) -> float:
    t0 = run.t0_ns()
    return max(0.0, (time.perf_counter_ns() - t0) / 1e9) if t0 is not None else 0.0


def _families(
    labels: Mapping[str, str] | None, tally: LiveTally, in_flight: Mapping[str, int],
    planned: Mapping[str, int], *, finished: bool, price_per_hour: float | None,
    elapsed_s: float, server: Mapping[str, float] | None = None,
) -> Iterator[Metric]:  # fmt: skip
    if labels is not None:
        yield InfoMetricFamily("loadgen_run", "The run being measured", value=dict(labels))
    classes = sorted(set(tally.classes()) | set(in_flight) | set(planned))
    requests = CounterMetricFamily(
        "loadgen_requests", "Finished requests by class and outcome", labels=["class", "outcome"]
    )
    for (cls, outcome), n in sorted(tally.requests.items()):
        requests.add_metric([cls, outcome], n)
    yield requests
    yield _per_class(GaugeMetricFamily, "loadgen_requests_planned", "Requests the run plans",
                     classes, planned)  # fmt: skip
    yield _per_class(GaugeMetricFamily, "loadgen_requests_in_flight",
                     "Requests sent and not yet finished", classes, in_flight)  # fmt: skip
    yield _per_class(CounterMetricFamily, "loadgen_good_requests",
                     "Ok requests within every per-request SLO threshold", classes,
                     tally.good_requests)  # fmt: skip
    tokens = CounterMetricFamily(
        "loadgen_output_tokens",
        "Output tokens of finished requests by class and outcome",
        labels=["class", "outcome"],
    )
    for (cls, outcome), n in sorted(tally.output_tokens.items()):
        tokens.add_metric([cls, outcome], n)
    yield tokens
    yield _per_class(CounterMetricFamily, "loadgen_good_output_tokens",
                     "Output tokens of good requests (goodput)", classes,
                     tally.good_output_tokens)  # fmt: skip
    for measure in MEASURES:
        hist = HistogramMetricFamily(
            f"loadgen_{measure}_seconds", LATENCY_HELP[measure], labels=["class"]
        )
        bounds = [*(_bound(b) for b in BUCKETS_S[measure]), "+Inf"]
        for cls in classes:
            found = tally.histograms.get((measure, cls))
            if found is None:
                continue
            cumulative = found.cumulative()
            hist.add_metric([cls], list(zip(bounds, cumulative, strict=True)), found.sum_s)
        yield hist
    if price_per_hour is not None:
        yield GaugeMetricFamily("loadgen_price_per_hour",
                                "Price of the fleet under test per hour (--price-per-hour x "
                                "--replicas)", value=price_per_hour)  # fmt: skip
    yield GaugeMetricFamily("loadgen_run_elapsed_seconds", "Seconds since t0", value=elapsed_s)
    for figure, value in sorted((server or {}).items()):
        yield GaugeMetricFamily(f"loadgen_server_{figure}", SERVER_HELP[figure], value=value)
    yield GaugeMetricFamily(
        "loadgen_run_finished",
        "1 once the last record is in: the counts are final",
        value=1.0 if finished else 0.0,
    )


def _per_class(
    kind: Any, name: str, documentation: str, classes: list[str], values: Mapping[str, int]
) -> Metric:
    family = kind(name, documentation, labels=["class"])
    for cls in classes:
        family.add_metric([cls], values.get(cls, 0))
    return family  # type: ignore[no-any-return]


def _bound(seconds: float) -> str:
    """A bucket bound as Prometheus clients write it (`0.25`, `1.0`)."""
    return repr(float(seconds))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_listen(text: str) -> tuple[str, int]:
    """`--prometheus-port`: `PORT` (loopback) or `ADDRESS:PORT`; 0 picks a free port."""
    address, _, port_text = text.rpartition(":")
    address = address.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise OptionError(
            "--prometheus-port", f"{text!r} is not a port",
            "give PORT (0-65535, served on 127.0.0.1) or ADDRESS:PORT, e.g. 0.0.0.0:9464",
        )  # fmt: skip
    return address, int(port_text)
