"""What the command line adds to a workload: the options of one run, in every process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loadgen.engine.network import Network
from loadgen.workload.shards import Share


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """What the command line adds to a workload."""

    url: str | None = None
    seed: int | None = None
    out_dir: Path = Path("reports")
    run_id: str | None = None
    max_in_flight: int | None = None
    quiet: bool = False
    lag_bound_ms: float | None = None  # `--lag-bound-ms`: a strict bound when given
    grace_s: float = 5.0
    check_target: bool = True
    preflight_timeout_s: float | None = None  # None: the class deadlines (engine.preflight)
    sim_trace: bool = False
    otlp_receiver: str | None = None  # `--otlp-receiver [HOST:]PORT`: the server's spans
    otlp_receiver_grace_s: float = 10.0  # `--otlp-receiver-grace`: wait this long for them
    watchdog_s: float = 300.0  # abort (exit 4) after this long with nothing progressing
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    workers: int | None = None  # engine processes; None: 1, or one per core past the envelope
    shard: Share | None = None  # run only this share of the schedule (`--shard i/N`)
    start_at_unix_ns: int | None = None  # the agreed wall-clock t0 (`--start-at`)
    start_when_told: bool = False  # a driver tells the start on stdin (`processes.told`, `--ray`)
    warm_connections: int | None = None  # opened before t0 (`--warm-connections`); None: auto
    price_per_hour: float | None = None  # `--price-per-hour`: one replica's, or the fleet's
    replicas: int = 1  # `--replicas`: the fleet's price is price_per_hour × replicas
    server_metrics_url: str | None = None  # `--server-metrics-url`; else target's, if any
    server_metrics_interval_s: float | None = None  # `--server-metrics-interval`
    # `--server-metrics-header`s: the metrics endpoint's own (over target.server_metrics_headers)
    server_metrics_headers: Mapping[str, str] = field(default_factory=dict)
    nonce: str | None = None  # `--nonce`: a cold run's prompts start with it; None: drawn
    verdict: str = "interval"  # `--verdict`: judge each check by its bounds, or `point`
    # TLS trust and forward proxies (`--cacert`, `--cert`/`--key`, `--insecure`, `--proxy`,
    # and the environment as the command read it): every connection of the run uses them.
    network: Network = field(default_factory=Network)
