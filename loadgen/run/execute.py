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
import secrets
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

import polars as pl

from loadgen.adapters.protocol import Adapter
from loadgen.analysis.audit import audit, with_cache
from loadgen.analysis.confidence import INTERVAL
from loadgen.analysis.cost import Price
from loadgen.analysis.live import LiveTally
from loadgen.analysis.minutes import run_histograms
from loadgen.analysis.objectives import Objective
from loadgen.analysis.server import with_server
from loadgen.analysis.sizing import size_warnings
from loadgen.engine.cache_reset import reset_prefix_cache
from loadgen.engine.encoding import RequestEncoder
from loadgen.engine.host import raise_open_files_limit
from loadgen.engine.logs import LOGGER, run_log
from loadgen.engine.network import Network
from loadgen.engine.preflight import check_connection, preflight, preflight_deadline
from loadgen.engine.runner import Engine, EngineConfig, LiveStats
from loadgen.engine.scrape import scrape_auth
from loadgen.engine.secrets import Redactor
from loadgen.engine.transport import Endpoint
from loadgen.errors import ConfigError, LoadgenError, OptionError, TargetError
from loadgen.results.liveness import run_lock
from loadgen.results.records import from_frame
from loadgen.results.runfolder import (
    SIM_TRACE_FILE,
    T0,
    RunInfo,
    ServerMetricsInfo,
    WorkersInfo,
    new_run_id,
)
from loadgen.results.summary import CacheWarmth, Summary
from loadgen.results.write import (
    RecordWriter,
    discard_unstarted,
    join_server_metrics,
    make_run_folder,
    write_histograms,
    write_run_info,
    write_summary,
)
from loadgen.run.drive import drive, watch_signals
from loadgen.run.envelope import envelope_warning, expected_peak_load, last_envelope
from loadgen.run.failure import client_failures
from loadgen.run.live import LiveExporter
from loadgen.run.options import RunOptions
from loadgen.run.publish import Publish, publisher, tally_of
from loadgen.run.record import (
    Ran,
    RunState,
    begin,
    interrupted_record,
    process_info,
    shard_anchor,
    told_shard,
    with_processes,
)
from loadgen.run.scraper import ScraperProcess
from loadgen.run.setup import client_setup, engine_setup, metrics_headers, metrics_url
from loadgen.run.simulator import sim_args_from_mapping, target_url
from loadgen.run.told import ToldStart
from loadgen.run.workers import run_workers
from loadgen.workload.plans import Work, plan_work
from loadgen.workload.prompts import nonce_words
from loadgen.workload.shards import check_start_at, split_work
from loadgen.workload.spec import WorkloadSpec, redact_url

__all__ = [
    "Prepared", "RunOptions", "RunResult", "choose_workers", "client_setup", "execute", "finish",
    "prepare",
]  # fmt: skip


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
        """The summary's verdict: 0 met, 2 missed, 7 inconclusive, 3 fell behind; 4 stopped
        by the watchdog, 130 interrupted (no verdict on the server)."""
        return self.summary.verdict.exit_code


def execute(
    spec: WorkloadSpec, options: RunOptions, *, log: TextIO | None = None,
    live: LiveExporter | None = None, warn_size: bool = True,
) -> RunResult:  # fmt: skip
    """Run the workload and write its folder; see `RunResult.exit_code` for the verdict.

    `log` takes the progress lines; none: whatever `sys.stderr` is at the call, not at
    import (click's test runner, pytest's capture and an embedding program swap it).
    `live` publishes the run's figures as they come (`--prometheus-port`, `--otlp-endpoint`);
    the caller closes it (a capacity search keeps one for all its steps). `warn_size`: say
    (even with -q) when a class's plan is too small for its SLO to be judged at its
    confidence (a capacity step, which is extended when inconclusive, does not)."""
    log = sys.stderr if log is None else log
    ready = prepare(spec, options)
    work = ready.work
    workers, why = choose_workers(spec, work, options.workers)
    if options.start_when_told and workers > 1:
        raise OptionError("--start-when-told", "takes one engine process per shard",
                          "add --workers 1 (a driver places more shards instead)")  # fmt: skip
    if not options.quiet:
        print(f"workers: {workers} ({why})", file=log)
    for said in workers_warnings(work, options.workers, workers):  # even with -q
        print(f"warning: {said}", file=log)
    # even with -q: the verdict depends on it (a shard's merge is judged, not the shard)
    if warn_size and options.verdict == INTERVAL and options.shard is None:
        for said in size_warnings(spec, work.plans):
            print(said, file=log)

    if not options.quiet and (warning := envelope_warning(spec, work.plans, processes=workers)):
        print(warning, file=log)
    open_files = raise_open_files_limit()
    options = dataclasses.replace(options, nonce=ready.cache.nonce)  # every worker sends it
    run_dir = _make_run_dir(options.out_dir, options.run_id or new_run_id(spec.name))
    try:
        return _execute(spec, options, log, live, ready, (workers, why), open_files, run_dir)
    except TargetError as exc:
        if (kept := discard_unstarted(run_dir)) is None:
            raise
        raise TargetError(f"{exc} (nothing was sent; its log: {kept})") from None
    except BaseException:
        discard_unstarted(run_dir)
        raise


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a run checks and builds before it makes its folder (`prepare`)."""

    work: Work  # this run's plans (its shard's share, with --shard)
    adapter: Adapter
    headers: dict[str, str]
    redactor: Redactor
    url: str | None  # None: the built-in simulator
    cache: CacheWarmth


def prepare(spec: WorkloadSpec, options: RunOptions) -> Prepared:
    """Everything a run checks before it sends or writes anything, shared by `execute` and
    `loadgen run --dry-run` (so both refuse alike): the plans and the shard's share of them,
    the agreed start, the client (headers and their ${VAR}s), the simulator profile when
    there is no URL, the cache mode and nonce, and that the run folder is free and can be
    made."""
    work = plan_work(spec, options.seed)
    if options.shard is not None:
        work = split_work(work, options.shard)
    if not work.plans:
        raise ConfigError(
            spec.source, "classes", "plans no requests", "raise requests or duration_s"
        )
    if options.start_at_unix_ns is not None:
        check_start_at(options.start_at_unix_ns, time.time_ns())
    adapter, headers, redactor, url = client_setup(spec, options)
    if url is None:
        sim_args_from_mapping(spec.sim, spec.source)
    else:
        options.network.proxy_for(url)  # a proxy variable that names no usable proxy: here
    cache = cache_warmth(spec, options)  # a --nonce outside cold mode is refused here
    check_out_dir(options.out_dir)
    if options.run_id is not None:
        check_run_dir(options.out_dir / options.run_id)
    return Prepared(work=work, adapter=adapter, headers=headers, redactor=redactor, url=url,
                    cache=cache)  # fmt: skip


def check_out_dir(out_dir: Path) -> None:
    """The results store can take a new run folder: it, or the nearest folder above it that
    exists, is a folder this user may write into, on a file system mounted writable. Checked
    without writing anything (`--dry-run` writes nothing), so what only a write can tell (a
    full disk, a quota) is still the run's to find."""
    existing = out_dir
    try:
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
    except OSError as exc:  # a name longer than the file system takes, a loop of links
        raise OptionError("--out", f"cannot use {str(out_dir)[:120]!r} as a results folder: "
                          f"{exc.strerror or exc}", "give --out a shorter, plain folder path",
                          ) from None  # fmt: skip
    if not existing.is_dir():
        problem = f"{existing} is not a folder"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"this user may not write into {existing}"
    elif hasattr(os, "statvfs") and os.statvfs(existing).f_flag & os.ST_RDONLY:
        problem = f"{existing} is on a read-only file system"
    else:
        return
    raise OptionError("--out", f"cannot create the run folder under {out_dir}: {problem}",
                      "give --out a folder this user may write into")  # fmt: skip


def check_run_dir(run_dir: Path) -> None:
    """A run folder is never overwritten."""
    if run_dir.exists():
        raise OptionError(
            "--run-id",
            f"{run_dir} already exists",
            "runs are never overwritten: choose another --run-id",
        )


def _execute(
    spec: WorkloadSpec, options: RunOptions, log: TextIO, live: LiveExporter | None,
    ready: Prepared, chosen: tuple[int, str], open_files: int | None, run_dir: Path,
) -> RunResult:  # fmt: skip
    """`execute` once its run folder exists (`chosen`: the worker count and why)."""
    workers, why = chosen
    work, url, redactor, cache = ready.work, ready.url, ready.redactor, ready.cache
    planned = len(work.plans)
    trace = run_dir / SIM_TRACE_FILE if options.sim_trace else None
    with (
        run_lock(run_dir, doing="write into"),  # one writer: `report --recover` refuses it
        run_log(run_dir, redactor.redact),
        target_url(url, spec, trace_file=trace) as target,
    ):
        base_url, sim_args = target
        if sim_args is not None:  # on loopback: its scrapes and cache reset go direct too
            options = dataclasses.replace(options, network=options.network.direct())
        if sim_args is not None and not options.quiet:
            print(
                f"no --url given: started the built-in simulator (loadgen sim) at {base_url}"
                f"{' with ' + ' '.join(sim_args) if sim_args else ' with its default parameters'}",
                file=log,
            )
        endpoint, config = engine_setup(spec, options, base_url, ready.adapter, ready.headers,
                                        redactor)  # fmt: skip
        LOGGER.info("run %s: %d planned requests to %s", run_dir.name, planned,
                    redact_url(endpoint.origin + endpoint.target))  # fmt: skip
        for line in network_lines(endpoint, options.network, quiet=options.quiet):
            print(line, file=log)
            LOGGER.info("%s", line)
        if options.check_target:
            for note in _check_target(spec, options, endpoint, ready.adapter, config, redactor):
                if options.quiet:  # still said, once: warnings reach stderr and the run's log
                    LOGGER.warning("preflight: %s", note)
                else:
                    LOGGER.info("preflight: %s", note)
                    print(f"preflight: {note}", file=log)
        else:  # still no certificate failure judged as the server's: exit 1 before t0
            check_connection(endpoint)
        info = begin(spec, options, endpoint, run_id=run_dir.name, planned=planned,
                     sim_args=sim_args, open_files=open_files,
                     workers=WorkersInfo(count=workers, chosen=why))  # fmt: skip
        scraper, server_metrics = _scraper(spec, options, endpoint, run_dir, log, redactor)
        if cache.mode == "reset":
            cache = _reset(cache, endpoint, scraper, redactor, options, log)
        info = replace(info, server_metrics=server_metrics, cache=cache)
        publish = publisher(live, spec, work, info)
        if publish is not None:
            publish.scraper = scraper
        try:
            if workers > 1:  # the parent scrapes, once, for every worker
                ran = run_workers(work, workers, base_url, run_dir, info, spec, options, log,
                                  publish=publish)  # fmt: skip
                if publish is not None:
                    publish.final = tally_of(spec, from_frame(ran.frame))
                result = finish(ran, run_dir, spec, options, planned=planned, scraper=scraper)
            else:
                result = _run(work, endpoint, config, run_dir, info, spec, options, log,
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


def _check_target(
    spec: WorkloadSpec, options: RunOptions, endpoint: Endpoint, adapter: Adapter,
    config: EngineConfig, redactor: Redactor,
) -> list[str]:  # fmt: skip
    """The preflight: one request to the target before any load (TargetError: exit 1), and
    what it warns about (a route that compresses event streams)."""
    timeout_s, why = preflight_deadline(spec, options.preflight_timeout_s, options.watchdog_s)
    priority = next((c.priority for c in spec.classes.values() if c.priority is not None), None)
    request = RequestEncoder(config, None, endpoint).preflight_request(priority)
    try:
        return preflight(endpoint, adapter, config.body_options, timeout_s=timeout_s,
                         deadline_why=why, redactor=redactor, request=request,
                         max_event_bytes=max(config.max_event_bytes.values()))  # fmt: skip
    except LoadgenError as exc:
        raise TargetError(redactor.redact(str(exc))) from None


def _scraper(
    spec: WorkloadSpec, options: RunOptions, endpoint: Endpoint, run_dir: Path, log: TextIO,
    redactor: Redactor,
) -> tuple[ScraperProcess | None, ServerMetricsInfo | None]:  # fmt: skip
    """The server-metrics scraper (a process of its own: `run.scraper`), started, when a URL
    is given (a path is on the target), and run.json's `server_metrics` for it.

    It sends the target's credentials only to the target's origin, and the endpoint's own
    headers (`engine.scrape.scrape_auth`). Unless quiet, the first scrape's outcome is
    awaited (before t0: it delays no request) so a refused endpoint is said at once.
    """
    url = metrics_url(spec, options)
    if url is None:
        return None, None
    if url.startswith("/"):
        url = endpoint.origin + url
    interval_s = options.server_metrics_interval_s or spec.target.server_metrics_interval_s
    auth = scrape_auth(url, endpoint.origin, endpoint.headers, metrics_headers(spec, options))
    info = ServerMetricsInfo(url=redact_url(url), interval_s=interval_s)
    scraper = ScraperProcess(url, interval_s, run_dir=run_dir, auth=auth, redactor=redactor,
                             network=options.network)  # fmt: skip
    scraper.start()
    if not options.quiet:
        sent = f" with {', '.join(sorted(auth.headers))}" if auth.headers else ""
        print(f"scraping {redact_url(url)} every {interval_s:g} s{sent}", file=log)
        if scraper.first_done.wait(scraper.timeout_s + 1) and scraper.failures:
            note = scraper.access().problem
            print(f"server metrics: {note}; the run goes on, its client figures unaffected",
                  file=log)  # fmt: skip
    return scraper, info


def network_lines(endpoint: Endpoint, network: Network, *, quiet: bool) -> list[str]:
    """What the terminal says of the path to the target: the proxy (unless quiet), and
    always that verification is off (`--insecure`: credentials go to whoever answers)."""
    lines = []
    if endpoint.proxy is not None and not quiet:
        how = "a CONNECT tunnel" if endpoint.tunnelled else "requests in absolute form"
        lines.append(f"proxy: {endpoint.proxy.shown} for {endpoint.origin} ({how})")
    if network.tls.insecure:
        lines.append(
            "warning: --insecure: TLS certificates are not verified (the target's, the "
            "scraper's, the OTLP collector's): requests and their credentials go to whoever "
            "answers"
        )
    return lines


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
    check_run_dir(run_dir)
    try:
        make_run_folder(run_dir)
    except OSError as exc:
        raise LoadgenError(f"cannot create run folder {run_dir}: {exc.strerror}") from None
    return run_dir


def _run(
    work: Work,
    endpoint: Endpoint,
    config: EngineConfig,
    run_dir: Path,
    info: RunInfo,
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
    tally = LiveTally(publish.thresholds_ms) if publish is not None else None
    if publish is not None and tally is not None:
        publish.begin(tally.snapshot, lambda: dict(stats.in_flight_by_class))
    current = info  # the record as it stands: t0 is added when it is fixed
    told = ToldStart() if options.start_when_told else None

    def started(t0: T0) -> None:
        nonlocal current, info
        if told is not None and told.start_at_unix_ns is not None:
            info = replace(info, shard=told_shard(info.shard, told.start_at_unix_ns,
                                                  told.clock_offset_ns))  # fmt: skip
        if publish is not None:
            publish.t0_ns.append(int(t0.perf_counter_ns or 0))
        current = replace(info, t0=t0)
        write_run_info(run_dir, replace(current, interrupted=False, finished=False))

    def exit_now() -> None:
        """A second Ctrl-C: write what is pending, and record that the user stopped the run
        (so `report --recover` finishes it as interrupted, 130, never as killed)."""
        writer.flush()
        write_run_info(run_dir, interrupted_record(current))

    async def control(engine: Engine, state: RunState) -> None:
        await watch_signals(engine, options.grace_s, exit_now, state, log, folder=run_dir)

    with client_failures(run_dir, writer, stats, lambda: current):
        state = drive(
            work, endpoint, config, writer, stats, options,
            start_at_unix_ns=options.start_at_unix_ns, started=started, control=control,
            quiet=options.quiet, log=log, observe=tally.observe if tally is not None else None,
            wait_start=told.wait if told is not None else None,
        )  # fmt: skip
        if publish is not None and tally is not None:
            publish.final = tally
        if state.client_failure is not None:
            raise state.client_failure
        frame = writer.close()
        t0 = state.t0
        assert t0 is not None  # fixed before the schedule began
        mine = process_info(
            frame,
            None,
            index=0,
            pid=os.getpid(),
            t0=t0,
            parent_t0=t0,
            lag_bound_ms=options.lag_bound_ms,
            connections=state.connections,
        )
        ran = Ran(frame=frame, info=with_processes(replace(info, t0=t0), [mine]), state=state)
        return finish(ran, run_dir, spec, options, planned=stats.planned, scraper=scraper)


def finish(
    ran: Ran,
    run_dir: Path,
    spec: WorkloadSpec,
    options: RunOptions,
    *,
    planned: int,
    scraper: ScraperProcess | None = None,
) -> RunResult:
    """Audit the joined records; write summary.json, histograms.parquet and the final run.json
    (and server_metrics.parquet, the scraper stopped, when the run scraped a server)."""
    frame, info, state = ran.frame, ran.info, ran.state
    watchdog = state.watchdog
    interrupted = state.interrupted or watchdog is not None
    stopped = "watchdog" if watchdog is not None else "interrupted" if interrupted else None
    if info.shard is not None and info.t0 is not None:
        info = replace(info, shard=shard_anchor(info.shard, info.t0))
    objectives = {name: Objective.of(cls) for name, cls in spec.classes.items()}
    summary = audit(
        frame,
        run_id=info.run_id,
        objectives=objectives,
        planned=planned,
        stopped=stopped,
        lag_bound_ms=options.lag_bound_ms,
        price=None if options.price_per_hour is None
        else Price(per_hour=options.price_per_hour, replicas=options.replicas),
        rule=options.verdict,
        path_buffers=spec.target.path_buffers,
    )  # fmt: skip
    if scraper is not None:
        summary, info = _server_block(summary, scraper, run_dir, info, frame)
    summary = with_cache(summary, info.cache)
    write_summary(run_dir, summary)
    # Per-minute mergeable histograms: rolling windows over many runs read these, not records.
    slos = {name: cls.slo for name, cls in spec.classes.items()}
    write_histograms(run_dir, run_histograms(run_dir, frame, slos))
    final = replace(info, interrupted=interrupted, finished=True, stopped=stopped,
                    watchdog=watchdog)  # fmt: skip
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
            raise OptionError("--nonce", f"applies to cache: cold, not "
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
    options: RunOptions, log: TextIO,
) -> CacheWarmth:  # fmt: skip
    """Ask the server to empty its prefix cache (its kind from the first scrape, if any)."""
    family = None
    if scraper is not None and scraper.first_done.wait(scraper.timeout_s + 1):
        family = scraper.family
    said = reset_prefix_cache(endpoint.origin, endpoint.headers, family=family,
                              redact=redactor.redact, network=options.network)  # fmt: skip
    LOGGER.info("cache: reset: %s", said)
    if not options.quiet:
        print(f"cache: reset: {endpoint.origin} emptied its prefix cache ({said})", file=log)
    return dataclasses.replace(cache, reset=said)


def _server_block(
    summary: Summary, scraper: ScraperProcess, run_dir: Path, info: RunInfo, frame: pl.DataFrame
) -> tuple[Summary, RunInfo]:
    """Stop the scraper, join its parts on the run's t0, tally it in run.json, audit it."""
    stats = scraper.stop()
    assert info.server_metrics is not None  # set with the scraper
    assert info.t0 is not None  # a run with a scraper reached t0 before it stopped it
    block = replace(info.server_metrics, scrapes=stats.scrapes, failures=stats.failures,
                    malformed_lines=stats.malformed_lines, last_error=stats.last_error,
                    dropped_lines=stats.dropped_lines, access=stats.access)  # fmt: skip
    server = join_server_metrics(run_dir, int(info.t0.perf_counter_ns or 0))
    return with_server(summary, server, block, frame), replace(info, server_metrics=block)
