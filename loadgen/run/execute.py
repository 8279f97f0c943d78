"""One run, end to end: plans → target → engine → records → summary, in a run folder.

The top of a run: it owns the run folder, `run.json`, the embedded simulator's lifetime
and the final summary (`finish`), for one engine process (`_run`, with `run.drive`) or
several (`run.workers`). Everything it computes comes from the pure stages (spec,
arrivals, plans, metrics); everything it measures comes from the engine. Below it, each
arrow points one way: workers → drive → setup → options.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import secrets
import shutil
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import polars as pl

from loadgen import __version__
from loadgen.adapters.protocol import Adapter
from loadgen.analysis.audit import audit, with_cache
from loadgen.analysis.cost import Price
from loadgen.analysis.live import LiveTally
from loadgen.analysis.minutes import write_histograms
from loadgen.analysis.objectives import Objective
from loadgen.analysis.server import with_server
from loadgen.codec import from_json, to_json
from loadgen.engine.cache_reset import reset_prefix_cache
from loadgen.engine.host import raise_open_files_limit
from loadgen.engine.logs import LOGGER, RUN_LOG, run_log
from loadgen.engine.preflight import preflight, preflight_deadline
from loadgen.engine.request_ids import PREFLIGHT_ID, RequestIds, put_in_body
from loadgen.engine.runner import Engine, EngineConfig, LiveStats
from loadgen.engine.scrape import scrape_auth
from loadgen.engine.secrets import Redactor
from loadgen.engine.transport import Endpoint, redact_url
from loadgen.errors import ConfigError, LoadgenError, TargetError
from loadgen.results.liveness import run_lock
from loadgen.results.records import PARTS_DIR, RecordWriter, RequestRecord, from_frame
from loadgen.results.runfolder import (
    SCHEMA_VERSION,
    SERVER_PARTS_DIR,
    RunInfo,
    ServerMetricsInfo,
    join_server_metrics,
    new_run_id,
    write_json_atomic,
    write_run_info,
    write_summary,
)
from loadgen.results.summary import CacheWarmth, Summary
from loadgen.run.drive import drive, watch_signals
from loadgen.run.envelope import envelope_warning, expected_peak_load, last_envelope
from loadgen.run.failure import client_failures
from loadgen.run.live import LiveExporter, LiveRun
from loadgen.run.options import RunOptions
from loadgen.run.scraper import ScraperProcess
from loadgen.run.setup import client_setup, engine_setup, metrics_headers, metrics_url
from loadgen.run.simulator import target_url
from loadgen.run.workers import process_info, run_workers, total_connections
from loadgen.workload.identity import identity
from loadgen.workload.plans import Work, plan_work
from loadgen.workload.prompts import nonce_words
from loadgen.workload.shards import check_start_at, split_work, utc_text
from loadgen.workload.spec import WorkloadSpec

__all__ = ["RunOptions", "RunResult", "choose_workers", "client_setup", "execute", "finish"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What a finished (or interrupted) run left behind."""

    run_dir: Path
    summary: Summary
    interrupted: bool
    run_info: RunInfo  # run.json as written
    watchdog: str | None = None  # what the run was waiting for when the watchdog stopped it

    @property
    def exit_code(self) -> int:
        """The summary's verdict: 0 met, 2 missed, 3 fell behind; 4 stopped by the
        watchdog, 130 interrupted (no verdict on the server)."""
        return self.summary.verdict.exit_code


def execute(
    spec: WorkloadSpec, options: RunOptions, *, log: TextIO | None = None,
    live: LiveExporter | None = None,
) -> RunResult:  # fmt: skip
    """Run the workload and write its folder; see `RunResult.exit_code` for the verdict.

    `log` takes the progress lines; none: whatever `sys.stderr` is at the call, not at
    import (click's test runner, pytest's capture and an embedding program swap it).
    `live` publishes the run's figures as they come (`--prometheus-port`, `--otlp-endpoint`);
    the caller closes it (a capacity search keeps one for all its steps)."""
    log = sys.stderr if log is None else log
    work = plan_work(spec, options.seed)
    if options.shard is not None:
        work = split_work(work, options.shard)
    planned = len(work.plans)
    if not planned:
        raise ConfigError(
            spec.source, "classes", "plans no requests", "raise requests or duration_s"
        )
    if options.start_at_unix_ns is not None:
        check_start_at(options.start_at_unix_ns, time.time_ns())
    workers, why = choose_workers(spec, work, options.workers)
    if not options.quiet:
        print(f"workers: {workers} ({why})", file=log)
    for said in workers_warnings(work, options.workers, workers):  # even with -q
        print(f"warning: {said}", file=log)

    if not options.quiet and (warning := envelope_warning(spec, work.plans, processes=workers)):
        print(warning, file=log)
    adapter, headers, redactor, url = client_setup(spec, options)
    open_files = raise_open_files_limit()
    cache = cache_warmth(spec, options)
    options = dataclasses.replace(options, nonce=cache.nonce)  # every worker sends the same
    run_dir = _make_run_dir(options.out_dir, options.run_id or new_run_id(spec.name))
    try:
        return _execute(spec, options, log, live, work, (workers, why), planned, adapter,
                        headers, redactor, url, open_files, run_dir, cache)  # fmt: skip
    except TargetError as exc:
        if (kept := _unstarted(run_dir)) is None:
            raise
        raise TargetError(f"{exc} (nothing was sent; its log: {kept})") from None
    except BaseException:
        _unstarted(run_dir)
        raise


def _unstarted(run_dir: Path) -> Path | None:
    """A run that ended before t0 (a failed or interrupted preflight, a simulator that did
    not start) leaves no half-made folder, so the same --run-id can be given again: its log
    is moved beside it to `<run-id>.failed.log`, the folder removed. Returns the log's new
    path; None (the folder kept) once the run has begun (run.json) or measured anything."""
    measured = ("run.json", PARTS_DIR, SERVER_PARTS_DIR, "records.parquet")
    if not run_dir.is_dir() or any((run_dir / name).exists() for name in measured):
        return None
    kept = run_dir.parent / f"{run_dir.name}.failed.log"
    try:
        if (run_dir / RUN_LOG).exists():
            os.replace(run_dir / RUN_LOG, kept)
        shutil.rmtree(run_dir)
    except OSError:
        return None  # a read-only or vanished folder: left as it is
    return kept if kept.exists() else None


def _execute(
    spec: WorkloadSpec, options: RunOptions, log: TextIO, live: LiveExporter | None, work: Work,
    chosen: tuple[int, str], planned: int, adapter: Adapter, headers: dict[str, str],
    redactor: Redactor, url: str | None, open_files: int | None, run_dir: Path,
    cache: CacheWarmth,
) -> RunResult:  # fmt: skip
    """`execute` once its run folder exists (`chosen`: the worker count and why)."""
    workers, why = chosen
    trace = run_dir / "sim-trace.jsonl" if options.sim_trace else None
    with (
        run_lock(run_dir, doing="write into"),  # one writer: `report --recover` refuses it
        run_log(run_dir, redactor.redact),
        target_url(url, spec, trace_file=trace) as target,
    ):
        base_url, sim_args = target
        if sim_args is not None and not options.quiet:
            print(
                f"no --url given: started the built-in simulator (loadgen sim) at {base_url}"
                f"{' with ' + ' '.join(sim_args) if sim_args else ' with the seed parameters'}",
                file=log,
            )
        endpoint, config = engine_setup(spec, options, base_url, adapter, headers, redactor)
        LOGGER.info("run %s: %d planned requests to %s%s", run_dir.name, planned,
                    endpoint.origin, endpoint.target)  # fmt: skip
        if options.check_target:
            _check_target(spec, options, endpoint, adapter, config, redactor)
        run_info = _run_info(spec, options, endpoint, planned, sim_args)
        run_info["host"]["open_files_limit"] = open_files
        run_info["workers"] = {"count": workers, "chosen": why, "processes": []}
        scraper = _scraper(spec, options, endpoint, run_dir, run_info, log, redactor)
        if cache.mode == "reset":
            cache = _reset(cache, endpoint, scraper, redactor, options.quiet, log)
        run_info["cache"] = to_json(cache)
        publish = _publisher(live, spec, work, run_dir.name, run_info)
        if publish is not None:
            publish.scraper = scraper
        try:
            if workers > 1:  # the parent scrapes, once, for every worker
                frame, run_info, state = run_workers(
                    work, workers, base_url, run_dir, run_info, spec, options, log, publish=publish
                )
                if publish is not None:
                    publish.final = tally_of(spec, from_frame(frame))
                result = finish(frame, run_dir, run_info, spec, options, planned=planned,
                                state=state, scraper=scraper)  # fmt: skip
            else:
                result = _run(work, endpoint, config, run_dir, run_info, spec, options, log,
                              publish, scraper=scraper)  # fmt: skip
        finally:
            if scraper is not None:
                scraper.stop()
        if publish is not None and live is not None:
            live.end(publish.final)
        LOGGER.info("run %s: written, exit code %d", run_dir.name, result.exit_code)
    if sim_args is not None and not options.quiet:
        print("stopped the built-in simulator", file=log)
    return result


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


def _publisher(
    live: LiveExporter | None, spec: WorkloadSpec, work: Work, run_id: str,
    run_info: Mapping[str, Any],
) -> Publish | None:  # fmt: skip
    if live is None:
        return None
    labels = {
        "run_id": run_id,
        "workload": spec.name,
        "workload_key": str(run_info["workload"]["identity"].get("key", "")),
        "api": spec.target.api,
        "model": spec.target.model or "",
        "version": __version__,
    }
    planned = dict(Counter(plan.class_name for plan in work.plans))
    return Publish(live=live, labels=labels, planned=planned, thresholds_ms=thresholds(spec))


def _check_target(
    spec: WorkloadSpec, options: RunOptions, endpoint: Endpoint, adapter: Adapter,
    config: EngineConfig, redactor: Redactor,
) -> None:  # fmt: skip
    """The preflight: one request to the target before any load (TargetError: exit 1)."""
    timeout_s, why = preflight_deadline(spec, options.preflight_timeout_s, options.watchdog_s)
    headers, fields = preflight_extras(spec, endpoint, config)
    try:
        preflight(endpoint, adapter, config.body_options, timeout_s=timeout_s,
                  deadline_why=why, redactor=redactor,
                  max_event_bytes=max(config.max_event_bytes.values()),
                  extra_headers=headers, extra_fields=fields)  # fmt: skip
    except LoadgenError as exc:
        raise TargetError(redactor.redact(str(exc))) from None


def _scraper(
    spec: WorkloadSpec, options: RunOptions, endpoint: Endpoint, run_dir: Path,
    run_info: dict[str, Any], log: TextIO, redactor: Redactor,
) -> ScraperProcess | None:  # fmt: skip
    """The server-metrics scraper (a process of its own: `run.scraper`), started, when a URL
    is given (a path is on the target).

    It sends the target's credentials only to the target's origin, and the endpoint's own
    headers (`engine.scrape.scrape_auth`). Unless quiet, the first scrape's outcome is
    awaited (before t0: it delays no request) so a refused endpoint is said at once.
    """
    url = metrics_url(spec, options)
    if url is None:
        return None
    if url.startswith("/"):
        url = endpoint.origin + url
    interval_s = options.server_metrics_interval_s or spec.target.server_metrics_interval_s
    auth = scrape_auth(url, endpoint.origin, endpoint.headers, metrics_headers(spec, options))
    run_info["server_metrics"] = {"url": redact_url(url), "interval_s": interval_s}
    scraper = ScraperProcess(url, interval_s, run_dir=run_dir, auth=auth, redactor=redactor)
    scraper.start()
    if not options.quiet:
        sent = f" with {', '.join(sorted(auth.headers))}" if auth.headers else ""
        print(f"scraping {redact_url(url)} every {interval_s:g} s{sent}", file=log)
        if scraper.first_done.wait(scraper.timeout_s + 1) and scraper.failures:
            note = scraper.access().problem
            print(f"server metrics: {note}; the run goes on, its client figures unaffected",
                  file=log)  # fmt: skip
    return scraper


def preflight_extras(
    spec: WorkloadSpec, endpoint: Endpoint, config: EngineConfig
) -> tuple[dict[str, str], dict[str, object]]:
    """What the engine adds to a real request, for the preflight to send too: the id header
    (the preflight's own id, `…-ffffffffffff`) and its body field, and a class priority as
    header or body field."""
    ids = RequestIds(config.request_id_header, config.request_id_format,
                     config.request_id_nonce, endpoint.headers)  # fmt: skip
    headers, value = ids.headers(PREFLIGHT_ID)
    fields: dict[str, Any] = {}
    extra = dict(config.body_options.extra_body or {})
    body = dict(extra)
    put_in_body(body, config.adapter.name, config.request_id_body, value)
    fields.update({k: v for k, v in body.items() if extra.get(k) != v})
    priority = next((c.priority for c in spec.classes.values() if c.priority is not None), None)
    if priority is not None:
        if config.priority_header is not None:
            headers[config.priority_header] = str(priority)
        else:
            fields["priority"] = priority
    return headers, fields


def choose_workers(spec: WorkloadSpec, work: Work, requested: int | None) -> tuple[int, str]:
    """How many engine processes, and why: as asked; else one per core when the workload's
    expected peak load exceeds what one process held in this host's last `loadgen
    calibrate`; else one."""
    starts = start_count(work)
    if requested is not None:
        if requested > starts:
            return starts, f"--workers {requested}, capped at the plan's {_starts(starts)}"
        return requested, f"--workers {requested}"
    envelope = last_envelope()
    if envelope is None:
        return 1, "the default: this host has no calibrated envelope (see loadgen calibrate)"
    peak = expected_peak_load(spec, work.plans)
    cores = os.cpu_count() or 1
    if peak.exceeds(envelope.load):
        return min(cores, starts), (
            f"one per core: the expected peak ({peak}) exceeds one process's calibrated "
            f"envelope ({envelope.load})"
        )
    return 1, f"the expected peak ({peak}) fits one process's calibrated envelope ({envelope.load})"


def start_count(work: Work) -> int:
    """The plan's starts (independent requests and flows): what the workers share out; a
    worker beyond them would get nothing to send (`workload.shards`)."""
    return max(len(work.singles) + len(work.flows), 1)


def _starts(count: int) -> str:
    return f"{count:,} start{'' if count == 1 else 's'}"


def usable_cores() -> int:
    """The cores this process may run on (its affinity, else the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on this platform
        return os.cpu_count() or 1


def workers_warnings(work: Work, requested: int | None, chosen: int) -> list[str]:
    """What to tell the user about --workers: capped at the plan's starts (a worker with
    none costs its start-up and sends nothing), or more processes than cores (they share
    the cores: each one's start-up queues behind the others' and its sends lag)."""
    warnings = []
    if requested is not None and chosen < requested:
        warnings.append(
            f"--workers {requested} capped at {chosen}: the plan has {_starts(chosen)} "
            "(requests and flows) to share out, and a worker without one sends nothing"
        )
    cores = usable_cores()
    if requested is not None and chosen > cores:
        warnings.append(
            f"{chosen} workers on {cores} cores: the processes share the cores, so their "
            "start-up queues and their sends lag (a late send makes the run invalid, exit 3); "
            f"use --workers {cores} or fewer here"
        )
    return warnings


def _make_run_dir(out_dir: Path, run_id: str) -> Path:
    run_dir = out_dir / run_id
    if run_dir.exists():
        raise ConfigError(
            "command line",
            "--run-id",
            f"{run_dir} already exists",
            "runs are never overwritten: choose another --run-id",
        )
    try:
        run_dir.mkdir(parents=True)
    except OSError as exc:
        raise LoadgenError(f"cannot create run folder {run_dir}: {exc.strerror}") from None
    return run_dir


def _run_info(
    spec: WorkloadSpec,
    options: RunOptions,
    endpoint: Endpoint,
    planned: int,
    sim_args: list[str] | None,
) -> dict[str, Any]:
    resolved = dataclasses.asdict(spec)
    resolved.pop("raw", None)
    resolved["target"]["headers"] = sorted(spec.target.headers)  # names only: values may be secret
    resolved["target"]["server_metrics_headers"] = sorted(spec.target.server_metrics_headers)
    return {
        "schema_version": SCHEMA_VERSION,
        "loadgen_version": __version__,
        "seed": spec.seed if options.seed is None else options.seed,
        "planned": planned,
        "workload": {
            "name": spec.name,
            "source": spec.source,
            "spec": resolved,
            # what the results store pools by (loadgen.workload.identity): name + spec fingerprint
            "identity": identity(spec, max_in_flight=options.max_in_flight),
        },
        "target": {
            "url": redact_url(endpoint.origin + endpoint.target),
            "api": spec.target.api,
            "model": spec.target.model,
            "builtin_sim": sim_args is not None,
            "sim_args": sim_args,
        },
        "options": {
            "max_in_flight": options.max_in_flight,
            "lag_bound_ms": options.lag_bound_ms,
            "grace_s": options.grace_s,
            **(
                {"price_per_hour": options.price_per_hour, "replicas": options.replicas}
                if options.price_per_hour is not None
                else {}
            ),
        },
        "shard": _shard_info(options),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
    }


def _shard_info(options: RunOptions) -> dict[str, Any] | None:
    """The shard this run is (`--shard`), its agreed start; the anchor is added at t0."""
    if options.shard is None:
        return None
    start = options.start_at_unix_ns
    return {
        "index": options.shard.index,
        "count": options.shard.count,
        "start_at_unix_ns": start,
        "start_at_utc": utc_text(start) if start is not None else None,
    }


def _run(
    work: Work,
    endpoint: Endpoint,
    config: EngineConfig,
    run_dir: Path,
    run_info: dict[str, Any],
    spec: WorkloadSpec,
    options: RunOptions,
    log: TextIO,
    publish: Publish | None = None,
    *,
    scraper: ScraperProcess | None = None,
) -> RunResult:
    """One engine process: its own signals, progress line and watchdog."""
    writer = RecordWriter(run_dir)
    stats = LiveStats()
    run_info = {"run_id": run_dir.name, **run_info}
    tally = LiveTally(publish.thresholds_ms) if publish is not None else None
    if publish is not None and tally is not None:
        publish.begin(tally.snapshot, lambda: dict(stats.in_flight_by_class))

    def started(t0: dict[str, Any]) -> None:
        if publish is not None:
            publish.t0_ns.append(int(t0["perf_counter_ns"]))
        run_info["t0"] = t0
        write_json_atomic(
            run_dir / "run.json", {**run_info, "interrupted": False, "finished": False}
        )

    async def control(engine: Engine, state: dict[str, Any]) -> None:
        await watch_signals(engine, options.grace_s, writer, state, log)

    with client_failures(run_dir, writer, stats, run_info):
        state = drive(
            work, endpoint, config, writer, stats, options,
            start_at_unix_ns=options.start_at_unix_ns, started=started, control=control,
            quiet=options.quiet, log=log, observe=tally.observe if tally is not None else None,
        )  # fmt: skip
        if publish is not None and tally is not None:
            publish.final = tally
        if state.get("client_failure") is not None:
            raise state["client_failure"]
        frame = writer.close()
        run_info["t0"] = state["t0"]
        run_info["workers"]["processes"] = [
            process_info(frame, None, index=0, pid=os.getpid(), t0=state["t0"],
                         parent_t0=state["t0"], lag_bound_ms=options.lag_bound_ms,
                         connections=state.get("connections"))
        ]  # fmt: skip
        run_info["connections"] = total_connections(run_info["workers"]["processes"])
        return finish(frame, run_dir, run_info, spec, options, planned=stats.planned, state=state,
                      scraper=scraper)  # fmt: skip


def finish(
    frame: pl.DataFrame,
    run_dir: Path,
    run_info: dict[str, Any],
    spec: WorkloadSpec,
    options: RunOptions,
    *,
    planned: int,
    state: Mapping[str, Any],
    scraper: ScraperProcess | None = None,
) -> RunResult:
    """Audit the joined records; write summary.json, histograms.parquet and the final run.json
    (and server_metrics.parquet, the scraper stopped, when the run scraped a server)."""
    run_id = run_dir.name
    watchdog = state.get("watchdog")
    interrupted = bool(state["interrupted"]) or watchdog is not None
    stopped = "watchdog" if watchdog is not None else "interrupted" if interrupted else None
    if run_info.get("shard") is not None:
        t0 = run_info["t0"]
        run_info["shard"] = {**run_info["shard"], **shard_anchor(t0)}
    objectives = {name: Objective.of(cls) for name, cls in spec.classes.items()}
    summary = audit(
        frame,
        run_id=run_id,
        objectives=objectives,
        planned=planned,
        stopped=stopped,
        lag_bound_ms=options.lag_bound_ms,
        price=None if options.price_per_hour is None
        else Price(per_hour=options.price_per_hour, replicas=options.replicas),
    )  # fmt: skip
    if scraper is not None:
        summary = _server_block(summary, scraper, run_dir, run_info, frame)
    cache = run_info.get("cache")
    summary = with_cache(summary, from_json(CacheWarmth, cache) if cache else None)
    write_summary(run_dir, summary)
    # Per-minute mergeable histograms: rolling windows over many runs read these, not records.
    write_histograms(run_dir, frame, {name: cls.slo for name, cls in spec.classes.items()})
    ended = {"interrupted": interrupted, "finished": True, "stopped": stopped, "watchdog": watchdog}
    final = from_json(RunInfo, {"run_id": run_id, **run_info, **ended})
    write_run_info(run_dir, final)
    return RunResult(
        run_dir=run_dir, summary=summary, interrupted=interrupted, watchdog=watchdog,
        run_info=final,
    )  # fmt: skip


def cache_warmth(spec: WorkloadSpec, options: RunOptions) -> CacheWarmth:
    """The run's cache mode and, when cold, its nonce: `--nonce`, else (shards of one run
    must share it) derived from the agreed start and the seed, else random."""
    if spec.cache != "cold":
        if options.nonce is not None:
            raise ConfigError("command line", "--nonce", f"applies to cache: cold, not "
                              f"{spec.cache} (which sends the same bytes every run)",
                              "drop --nonce, or add --cache cold")  # fmt: skip
        return CacheWarmth(mode=spec.cache)
    nonce = options.nonce
    if nonce is None and options.start_at_unix_ns is not None:
        seed = spec.seed if options.seed is None else options.seed
        agreed = f"{options.start_at_unix_ns}:{seed}:{spec.name}".encode()
        nonce = hashlib.sha256(agreed).hexdigest()[:NONCE_HEX]
    nonce = nonce or secrets.token_hex(NONCE_HEX // 2)
    return CacheWarmth(mode="cold", nonce=nonce, nonce_words=nonce_words(nonce))


NONCE_HEX = 8  # hex digits of a drawn nonce


def _reset(
    cache: CacheWarmth, endpoint: Endpoint, scraper: ScraperProcess | None, redactor: Redactor,
    quiet: bool, log: TextIO,
) -> CacheWarmth:  # fmt: skip
    """Ask the server to empty its prefix cache (its kind from the first scrape, if any)."""
    family = None
    if scraper is not None and scraper.first_done.wait(scraper.timeout_s + 1):
        family = scraper.family
    said = reset_prefix_cache(endpoint.origin, endpoint.headers, family=family,
                              redact=redactor.redact)  # fmt: skip
    LOGGER.info("cache: reset: %s", said)
    if not quiet:
        print(f"cache: reset: {endpoint.origin} emptied its prefix cache ({said})", file=log)
    return dataclasses.replace(cache, reset=said)


def _server_block(
    summary: Summary, scraper: ScraperProcess, run_dir: Path, run_info: dict[str, Any],
    frame: pl.DataFrame,
) -> Summary:  # fmt: skip
    """Stop the scraper, join its parts on the run's t0, tally it in run.json, audit it."""
    stats = scraper.stop()
    run_info["server_metrics"] = {
        **run_info.get("server_metrics", {}), "scrapes": stats.scrapes,
        "failures": stats.failures, "malformed_lines": stats.malformed_lines,
        "last_error": stats.last_error,
        "access": to_json(stats.access) if stats.access is not None else None,
    }  # fmt: skip
    server = join_server_metrics(run_dir, int(run_info["t0"]["perf_counter_ns"]))
    info = from_json(ServerMetricsInfo, run_info["server_metrics"])
    return with_server(summary, server, info, frame)


def shard_anchor(t0: Mapping[str, Any]) -> dict[str, Any]:
    """A shard's t0 wall-clock anchor (measured at t0) and its skew from the agreed start."""
    measured = t0.get("measured_unix_ns")
    agreed = int(t0["unix_ns"])
    return {
        "t0_unix_ns": measured,
        "t0_skew_ms": round((measured - agreed) / 1e6, 6) if measured is not None else None,
    }
