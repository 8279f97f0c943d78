"""`--otlp-endpoint`: the live figures pushed by the OpenTelemetry SDK's OTLP/HTTP exporter.

Optional (`pip install 'loadgen[otel]'`). The figures are the Prometheus endpoint's own
metric families (`LiveExporter.families`), converted once per push into the SDK's metric
data (cumulative temporality: counters as monotonic sums, gauges as gauges, histograms with
the same explicit bounds, the run's info metric as a gauge of 1 with its labels as
attributes), and sent by `OTLPMetricExporter` from a thread of its own every
`interval_s`, and once more when a run ends. A collector's Prometheus exporter turns them
back into the same names (`loadgen_requests` + `_total`), so one dashboard serves both.
The histograms carry no min and max (the tally keeps buckets, not extremes).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from loadgen import __version__
from loadgen.engine.network import Network
from loadgen.engine.secrets import Redactor, run_secrets
from loadgen.workload.spec import redact_url

CUMULATIVE = AggregationTemporality.CUMULATIVE
SDK_LOGGER = "opentelemetry.exporter"  # the exporter's retries and failures log here


class _LastProblem(logging.Handler):
    """Keeps the SDK exporter's first warning (the cause; later ones say it gave up)
    instead of printing each retry: the push's failures are counted and said once, at the
    end (`OtlpPush.close`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.last is None:
            self.last = record.getMessage()[:300]


class OtlpPush:
    """Pushes `families()` (prometheus_client metric families) to an OTLP/HTTP endpoint."""

    def __init__(
        self, endpoint: str, families: Callable[[], Sequence[Any]], *, interval_s: float = 5.0,
        network: Network | None = None,
    ) -> None:  # fmt: skip
        self.problem = _LastProblem()
        sdk_logger = logging.getLogger(SDK_LOGGER)
        sdk_logger.addHandler(self.problem)
        self._propagate, sdk_logger.propagate = sdk_logger.propagate, False
        self.endpoint = endpoint
        # The run's TLS trust and proxy (engine.network), not requests' own CA bundle and
        # environment: the collector is verified as the target is.
        session = (network or Network()).requests_session(endpoint)
        self.exporter = OTLPMetricExporter(endpoint=endpoint, timeout=5, session=session)
        self.families = families
        self.pushes = 0
        self.interval_s = interval_s
        self.start_ns = time.time_ns()
        self.failures = 0  # pushes the collector refused or did not answer
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loadgen-otlp", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.push()

    def push(self) -> bool:
        """Send the figures now; False when the collector did not take them (counted)."""
        with self._lock:
            data = metrics_data(self.families(), start_ns=self.start_ns, now_ns=time.time_ns())
            result = self.exporter.export(data)
        ok = bool(result.name == "SUCCESS")
        self.pushes += 1
        self.failures += not ok
        return ok

    def close(self, log: Callable[[str], None] | None = None) -> None:
        """A last push (the final counts), then stop the thread and the exporter; `log`
        hears how many pushes the collector did not take, and the last reason."""
        self._halt.set()
        self._thread.join(timeout=10)
        self.push()
        self.exporter.shutdown()
        sdk_logger = logging.getLogger(SDK_LOGGER)
        sdk_logger.removeHandler(self.problem)
        sdk_logger.propagate = self._propagate
        if self.failures and log is not None:
            # The exporter's own words may quote the endpoint: its user-info and query hidden.
            hide = Redactor(run_secrets({}, (), self.endpoint)).redact
            why = f" ({hide(self.problem.last)})" if self.problem.last else ""
            shown = redact_url(self.endpoint)
            log(f"otlp: {self.failures} of {self.pushes} pushes to {shown} failed{why}")


def metrics_data(families: Sequence[Any], *, start_ns: int, now_ns: int) -> Any:
    """prometheus_client families as the SDK's `MetricsData` (cumulative since `start_ns`)."""
    metrics = [m for family in families if (m := _metric(family, start_ns, now_ns)) is not None]
    scope = InstrumentationScope("loadgen", __version__)
    resource = Resource.create({"service.name": "loadgen"})
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource,
                scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics, schema_url="")],
                schema_url="",
            )
        ]
    )


def _metric(family: Any, start_ns: int, now_ns: int) -> Any:
    unit = "s" if family.name.endswith("_seconds") else ""
    if family.type == "histogram":
        return Metric(name=family.name, description=family.documentation, unit=unit,
                      data=Histogram(data_points=_histogram_points(family, start_ns, now_ns),
                                     aggregation_temporality=CUMULATIVE))  # fmt: skip
    points = [
        NumberDataPoint(attributes=dict(s.labels), start_time_unix_nano=start_ns,
                        time_unix_nano=now_ns, value=s.value)
        for s in family.samples
        if family.type != "info" and not s.name.endswith("_created")
    ]  # fmt: skip
    if family.type == "info":
        points = [
            NumberDataPoint(attributes=dict(s.labels), start_time_unix_nano=start_ns,
                            time_unix_nano=now_ns, value=1)
            for s in family.samples
        ]  # fmt: skip
        return Metric(name=f"{family.name}_info", description=family.documentation, unit="",
                      data=Gauge(data_points=points))  # fmt: skip
    if family.type == "counter":
        return Metric(name=family.name, description=family.documentation, unit=unit,
                      data=Sum(data_points=points, aggregation_temporality=CUMULATIVE,
                               is_monotonic=True))  # fmt: skip
    if family.type == "gauge":
        return Metric(name=family.name, description=family.documentation, unit=unit,
                      data=Gauge(data_points=points))  # fmt: skip
    return None


def _histogram_points(family: Any, start_ns: int, now_ns: int) -> list[Any]:
    """One point per label set: per-bucket counts from the cumulative `_bucket` samples."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for sample in family.samples:
        labels = {k: v for k, v in sample.labels.items() if k != "le"}
        entry = series.setdefault(tuple(sorted(labels.items())), {"buckets": [], "sum": 0.0})
        if sample.name.endswith("_bucket"):
            entry["buckets"].append((float(sample.labels["le"]), int(sample.value)))
        elif sample.name.endswith("_sum"):
            entry["sum"] = float(sample.value)
    points = []
    for key, entry in series.items():
        buckets = sorted(entry["buckets"])
        cumulative = [n for _, n in buckets]
        counts = [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]
        points.append(
            HistogramDataPoint(
                attributes=dict(key), start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                count=cumulative[-1] if cumulative else 0, sum=entry["sum"],
                bucket_counts=counts, explicit_bounds=[le for le, _ in buckets[:-1]],
                min=None, max=None,  # type: ignore[arg-type]  # optional in OTLP; not kept
            )
        )  # fmt: skip
    return points
