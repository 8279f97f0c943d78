"""The run record as the run proceeds: typed from its start to its end.

A run's `run.json` is a `RunInfo` (results.runfolder) from the moment the run folder is
made: `begin` fills what is known before t0 (spec, seed, target, options, shard, host,
workers), and each step after adds its part with `dataclasses.replace` (the scraper's
endpoint, the cache warmth, t0, each engine process's share, how the run ended). It is
JSON only where the run folder writes it (`write_run_info`).

Beside it, `RunState` is what one engine process (`run.drive`), or the parent of several
(`run.scale.workers`), learns while it runs: interrupted, the watchdog, t0, connections;
and `RunResult` is what every runner hands back, however the run was sent.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from loadgen import __version__
from loadgen.analysis.metrics import generator_health
from loadgen.engine.transport import Endpoint
from loadgen.results.runfolder import (
    SCHEMA_VERSION,
    T0,
    ConnectionCounts,
    HostInfo,
    ProcessInfo,
    RunInfo,
    RunSettings,
    ShardInfo,
    TargetInfo,
    TlsInfo,
    WorkersInfo,
    WorkloadInfo,
)
from loadgen.results.summary import Summary
from loadgen.run.options import RunOptions
from loadgen.workload.identity import identity
from loadgen.workload.shards import utc_text
from loadgen.workload.spec import WorkloadSpec, redact_url


@dataclass(slots=True)
class RunState:
    """What an engine process (or the parent of several) learns while the run goes on."""

    interrupted: bool = False  # Ctrl-C / SIGTERM (or the parent's stop)
    watchdog: str | None = None  # what the run was waiting for when the watchdog stopped it
    t0: T0 | None = None  # fixed before the schedule begins, measured again at t0
    connections: ConnectionCounts | None = None  # warmed before t0, opened during the run
    client_failure: OSError | None = None  # a record write that failed for good


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerEnd:
    """What a worker process tells its parent when it is done (pickled over its pipe)."""

    interrupted: bool = False
    watchdog: str | None = None
    t0: T0 | None = None
    connections: ConnectionCounts | None = None
    client_failure: str | None = None  # described (`errors.describe_os_error`)


@dataclass(frozen=True, slots=True)
class Ran:
    """What the engine processes of a run on this host (one, or the parent of N workers)
    hand to `host.finish`: the joined records, the record with t0 and each process's share,
    and how the run ended."""

    frame: pl.DataFrame
    info: RunInfo
    state: RunState


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What a finished (or interrupted) run left behind, whichever runner sent it (one
    process, workers, Ray shards), and what `loadgen merge` leaves of a sharded run."""

    run_dir: Path
    summary: Summary
    interrupted: bool
    run_info: RunInfo  # run.json as written
    watchdog: str | None = None  # what the run was waiting for when the watchdog stopped it

    @property
    def exit_code(self) -> int:
        """The summary's verdict: 0 met, 2 missed, 7 inconclusive, 3 fell behind; 4 stopped
        by the watchdog, 130 interrupted (no verdict on the server)."""
        return self.summary.verdict.exit_code


def _shown(spec: WorkloadSpec) -> WorkloadSpec:
    """`spec` with its target's URL, path and metrics URL as `redact_url` shows them."""
    target = spec.target

    def shown(url: str | None) -> str | None:
        return None if url is None else redact_url(url)

    target = dataclasses.replace(target, url=shown(target.url), path=shown(target.path),
                                 server_metrics_url=shown(target.server_metrics_url))  # fmt: skip
    return dataclasses.replace(spec, target=target)


def begin(
    spec: WorkloadSpec,
    options: RunOptions,
    endpoint: Endpoint,
    *,
    run_id: str,
    planned: int,
    sim_args: Sequence[str] | None,
    open_files: int | None,
    workers: WorkersInfo,
) -> RunInfo:
    """The run record as it stands before t0: what was run, where, with what, on which host.

    What may hold a secret is kept as it may be shown: header names only (their values may
    be secret), the target's URL, path and metrics URL through `redact_url` (user-info and
    query values); the workload's identity is that of the spec as stored, so a key in a
    path's query never enters its fingerprint (a rotated key is the same workload)."""
    spec = _shown(spec)
    resolved = dataclasses.asdict(spec)
    resolved.pop("raw", None)
    resolved["target"]["headers"] = sorted(spec.target.headers)  # names only: values may be secret
    resolved["target"]["server_metrics_headers"] = sorted(spec.target.server_metrics_headers)
    priced = options.price_per_hour is not None
    return RunInfo(
        run_id=run_id,
        schema_version=SCHEMA_VERSION,
        loadgen_version=__version__,
        seed=spec.seed if options.seed is None else options.seed,
        planned=planned,
        workload=WorkloadInfo(
            name=spec.name,
            source=spec.source,
            spec=resolved,
            # what the results store pools by (loadgen.workload.identity): name + spec fingerprint
            identity=identity(spec, max_in_flight=options.max_in_flight),
        ),
        target=TargetInfo(
            url=redact_url(endpoint.origin + endpoint.target),
            api=spec.target.api,
            model=spec.target.model,
            builtin_sim=sim_args is not None,
            sim_args=tuple(sim_args) if sim_args is not None else None,
            tls=tls_info(endpoint),
            proxy=endpoint.proxy.shown if endpoint.proxy is not None else None,
        ),
        options=RunSettings(
            max_in_flight=options.max_in_flight,
            lag_bound_ms=options.lag_bound_ms,
            grace_s=options.grace_s,
            price_per_hour=options.price_per_hour if priced else None,
            replicas=options.replicas if priced else None,
            verdict=options.verdict,
        ),
        shard=shard_info(options),
        host=HostInfo(
            hostname=socket.gethostname(),
            platform=platform.platform(),
            python=platform.python_version(),
            cpus=os.cpu_count(),
            open_files_limit=open_files,
        ),
        workers=workers,
    )


def tls_info(endpoint: Endpoint) -> TlsInfo | None:
    """run.json's `target.tls`: for an https target, or whenever a TLS flag was given."""
    tls = endpoint.tls
    if endpoint.scheme != "https" and not (tls.cacert or tls.cert or tls.insecure):
        return None
    return TlsInfo(verify=not tls.insecure, trust=tls.trust, client_certificate=tls.cert)


def shard_info(options: RunOptions) -> ShardInfo | None:
    """The shard this run is (`--shard`), its agreed start; the anchor is added at t0."""
    if options.shard is None:
        return None
    start = options.start_at_unix_ns
    return ShardInfo(
        index=options.shard.index,
        count=options.shard.count,
        start_at_unix_ns=start,
        start_at_utc=utc_text(start) if start is not None else None,
    )


def told_shard(shard: ShardInfo | None, start_at_unix_ns: int, clock_offset_ns: int) -> ShardInfo:
    """A shard's record once a driver told it the agreed start and its clock offset."""
    assert shard is not None  # --start-when-told needs --shard
    return replace(
        shard, start_at_unix_ns=start_at_unix_ns, start_at_utc=utc_text(start_at_unix_ns),
        clock_offset_ns=clock_offset_ns,
    )  # fmt: skip


def shard_anchor(shard: ShardInfo, t0: T0) -> ShardInfo:
    """A shard's t0 wall-clock anchor (measured at t0) and its skew from the agreed start."""
    measured = t0.measured_unix_ns
    return replace(
        shard,
        t0_unix_ns=measured,
        t0_skew_ms=round((measured - t0.unix_ns) / 1e6, 6) if measured is not None else None,
    )


def interrupted_record(info: RunInfo) -> RunInfo:
    """run.json at a second Ctrl-C/SIGTERM: the user stopped the run (`stopped:
    interrupted`) before it wrote its end (`finished: false`), so `report --recover`
    finishes it as interrupted (exit 130), never as killed."""
    return replace(info, interrupted=True, finished=False, stopped="interrupted")


def with_processes(info: RunInfo, processes: Sequence[ProcessInfo]) -> RunInfo:
    """The record with each engine process's share, and their connections summed."""
    workers = info.workers or WorkersInfo()
    return replace(
        info,
        workers=replace(workers, processes=tuple(processes)),
        connections=total_connections(processes),
    )


def process_info(
    frame: pl.DataFrame,
    ids: Sequence[int] | None,
    *,
    index: int,
    pid: int,
    t0: T0,
    parent_t0: T0,
    lag_bound_ms: float | None,
    exit_code: int | None = 0,
    connections: ConnectionCounts | None = None,
) -> ProcessInfo:
    """One engine process's share of the run: its records, send lag and t0 skew.

    `t0_skew_us` is its t0 on the monotonic clock minus the parent's (one host, one clock:
    the cost of converting the agreed wall-clock start on each side).
    """
    mine = frame if ids is None else frame.filter(pl.col("request_id").is_in(list(ids)))
    health = generator_health(mine, planned=mine.height, lag_bound_ms=lag_bound_ms)
    skew_ns = int(t0.perf_counter_ns or 0) - int(parent_t0.perf_counter_ns or 0)
    return ProcessInfo(
        index=index,
        pid=pid,
        exit_code=exit_code,
        records=mine.height,
        lag_ms_p99=health.lag_ms.p99,
        late_share=late_share(mine, lag_bound_ms),
        fell_behind=health.fell_behind,
        t0_skew_us=round(skew_ns / 1e3, 3),
        reached_late_ms=t0.reached_late_ms,
        connections=connections,
    )


def total_connections(processes: Sequence[ProcessInfo]) -> ConnectionCounts | None:
    """The engine processes' connection counts, summed (warm_s: the slowest's)."""
    blocks = [p.connections for p in processes if p.connections is not None]
    if not blocks:
        return None
    opened = [b.opened_during_run for b in blocks if b.opened_during_run is not None]
    return ConnectionCounts(
        warm_requested=sum(b.warm_requested for b in blocks),
        warm_opened=sum(b.warm_opened for b in blocks),
        warm_failed=sum(b.warm_failed for b in blocks),
        warm_s=max(b.warm_s for b in blocks),
        opened_during_run=sum(opened) if opened else None,
    )


def late_share(frame: pl.DataFrame, lag_bound_ms: float | None) -> float | None:
    """Share of the schedule's sends (singles and first turns) later than `--lag-bound-ms`
    (None without a bound, or without sends)."""
    if lag_bound_ms is None:
        return None
    lag_ns = pl.coalesce(pl.col("dispatched_ns"), pl.col("sent_ns")) - pl.col("intended_ns")
    scheduled = frame.filter(pl.col("turn").fill_null(0) == 0).select(lag_ns.alias("lag"))
    lags = scheduled.get_column("lag").drop_nulls()
    if not lags.len():
        return None
    return round(float((lags > lag_bound_ms * 1e6).sum()) / lags.len(), 6)
