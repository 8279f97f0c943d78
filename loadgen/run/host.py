"""A run whose engine processes are on this host: its folder, its target, its judging.

The part of a run the local runner (`run.local`) and the workers' (`run.scale.workers`)
share, around their engine processes: how many processes (`choose_workers`, chosen once by
`run.execute`) and what to say about that, the run folder (its lock and log), the target
(the URL, or the built-in simulator started and stopped), the preflight, run.json before
t0, the server-metrics scraper, the cache reset, the live exporter's publication; then,
once the runner has the records, the audit (`finish`) and the outputs ended with the
summary. A run folder in which nothing was sent is removed again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import polars as pl

from loadgen.analysis.audit import audit, with_cache
from loadgen.analysis.confidence import INTERVAL
from loadgen.analysis.cost import Price
from loadgen.analysis.objectives import Objective
from loadgen.analysis.server import with_server
from loadgen.analysis.sizing import size_warnings
from loadgen.engine.cache_reset import reset_prefix_cache
from loadgen.engine.encoding import RequestEncoder
from loadgen.engine.host import raise_open_files_limit
from loadgen.engine.logs import LOGGER, run_log
from loadgen.engine.network import Network
from loadgen.engine.otlp_receiver import SpanReceiver
from loadgen.engine.preflight import check_connection, preflight, preflight_deadline
from loadgen.engine.scrape import scrape_auth
from loadgen.engine.secrets import Redactor
from loadgen.engine.traceparent import shared_trace_warning
from loadgen.engine.transport import Endpoint
from loadgen.errors import LoadgenError, OptionError, TargetError
from loadgen.results.liveness import run_lock
from loadgen.results.runfolder import SIM_TRACE_FILE, RunInfo, ServerMetricsInfo, WorkersInfo
from loadgen.results.summary import CacheWarmth, Summary
from loadgen.results.write import discard_unstarted, join_server_metrics, make_run_folder
from loadgen.run.context import RunContext, Target
from loadgen.run.envelope import envelope_warning, expected_peak_load, last_envelope
from loadgen.run.outputs import Ended, Outputs
from loadgen.run.outputs.publish import Publish, publisher
from loadgen.run.prepare import Prepared, check_run_dir
from loadgen.run.processes.scraper import ScraperProcess
from loadgen.run.processes.simulator import target_url
from loadgen.run.record import Ran, RunResult, begin, shard_anchor
from loadgen.run.setup import engine_setup, metrics_headers, metrics_url
from loadgen.run.spans import collect_spans, receiver_line, span_receiver
from loadgen.workload.plans import Work
from loadgen.workload.spec import WorkloadSpec, redact_url


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSetup:
    """What a run on this host has set up for its engine processes before t0."""

    target: Target
    info: RunInfo  # run.json as it stands before t0
    publish: Publish | None  # the live exporter's part, when the run has one
    scraper: ScraperProcess | None  # the server's /metrics, when scraped
    spans: SpanReceiver | None = None  # the server's spans, under --otlp-receiver


class HostRunner(Protocol):
    """A runner whose engine processes are on this host (`run.local`, `run.scale.workers`)."""

    @property
    def count(self) -> int:
        """Its engine processes."""

    @property
    def chosen(self) -> str:
        """Why that many (run.json's `workers.chosen`)."""

    def send(self, run: RunContext, setup: HostSetup) -> RunResult:
        """Send the plans from t0, collect every record, judge them (`finish`)."""


def on_this_host(run: RunContext, prepared: Prepared, runner: HostRunner) -> RunResult:
    """The run with `runner`'s engine processes, in a run folder of its own (see the module
    docstring); see `RunResult.exit_code` for the verdict."""
    options, terminal, work = run.options, run.terminal, run.work
    if options.start_when_told and runner.count > 1:
        raise OptionError("--start-when-told", "takes one engine process per shard",
                          "add --workers 1 (a driver places more shards instead)")  # fmt: skip
    terminal.say(f"workers: {runner.count} ({runner.chosen})")
    for said in workers_warnings(work, options.workers, runner.count):  # even with -q
        terminal.warn(f"warning: {said}")
    if shared := shared_trace_warning({**run.spec.target.headers, **options.extra_headers}):
        terminal.warn(shared)
    # even with -q: the verdict depends on it (a shard's merge is judged, not the shard)
    if run.warn_size and options.verdict == INTERVAL and options.shard is None:
        for said in size_warnings(run.spec, work.plans):
            terminal.warn(said)
    if not terminal.quiet and (
        warning := envelope_warning(run.spec, work.plans, processes=runner.count)
    ):
        terminal.say(warning)
    open_files = raise_open_files_limit()
    _make_run_dir(run.run_dir)
    try:
        return _in_folder(run, prepared, runner, open_files)
    except TargetError as exc:
        if (kept := discard_unstarted(run.run_dir)) is None:
            raise
        raise TargetError(f"{exc} (nothing was sent; its log: {kept})") from None
    except BaseException:
        discard_unstarted(run.run_dir)
        raise


def _make_run_dir(run_dir: Path) -> None:
    check_run_dir(run_dir)
    try:
        make_run_folder(run_dir)
    except OSError as exc:
        raise LoadgenError(f"cannot create run folder {run_dir}: {exc.strerror}") from None


def _in_folder(
    run: RunContext, prepared: Prepared, runner: HostRunner, open_files: int | None
) -> RunResult:
    """`on_this_host` once its run folder exists."""
    spec, terminal, run_dir = run.spec, run.terminal, run.run_dir
    trace = run_dir / SIM_TRACE_FILE if run.options.sim_trace else None
    with (
        run_lock(run_dir, doing="write into"),  # one writer: `report --recover` refuses it
        run_log(run_dir, prepared.redactor.redact),
        span_receiver(run) as spans,
        target_url(
            prepared.url, spec, trace_file=trace, spans_url=spans.url if spans else None
        ) as (base_url, sim_args),
    ):
        if spans is not None:
            terminal.say(receiver_line(spans, simulator=sim_args is not None))
        if sim_args is not None:  # on loopback: its scrapes and cache reset go direct too
            run = replace(run, options=replace(run.options, network=run.options.network.direct()))
            terminal.say(
                f"no --url given: started the built-in simulator (loadgen sim) at {base_url}"
                f"{' with ' + ' '.join(sim_args) if sim_args else ' with its default parameters'}"
            )
        endpoint, config = engine_setup(spec, run.options, base_url, prepared.adapter,
                                        prepared.headers, prepared.redactor)  # fmt: skip
        target = Target(base_url=base_url, endpoint=endpoint, config=config)
        LOGGER.info("run %s: %d planned requests to %s", run_dir.name, len(run.work.plans),
                    redact_url(endpoint.origin + endpoint.target))  # fmt: skip
        _check_target(run, target, prepared.redactor)
        info = begin(spec, run.options, endpoint, run_id=run_dir.name,
                     planned=len(run.work.plans), sim_args=sim_args, open_files=open_files,
                     workers=WorkersInfo(count=runner.count, chosen=runner.chosen))  # fmt: skip
        scraper, server_metrics = _scraper(run, endpoint, prepared.redactor)
        cache = prepared.cache
        if cache.mode == "reset":
            cache = _reset(cache, endpoint, scraper, prepared.redactor, run)
        info = replace(info, server_metrics=server_metrics, cache=cache)
        gauges = scraper.live_gauges if scraper is not None else dict
        publish = publisher(run.live, spec, run.work, info, server=gauges)
        setup = HostSetup(target=target, info=info, publish=publish, scraper=scraper, spans=spans)
        try:
            result = runner.send(run, setup)
        finally:
            if scraper is not None:
                scraper.stop()
        LOGGER.info("run %s: written, exit code %d", run_dir.name, result.exit_code)
    if sim_args is not None:
        terminal.say("stopped the built-in simulator")
    return result


def _check_target(run: RunContext, target: Target, redactor: Redactor) -> None:
    """What the terminal says of the path to the target, and the preflight: one request to
    the target before any load (TargetError: exit 1) and what it warns about (a route that
    compresses event streams); without it, still no certificate failure judged as the
    server's: exit 1 before t0."""
    options, terminal = run.options, run.terminal
    for line in network_lines(target.endpoint, options.network, quiet=options.quiet):
        terminal.warn(line)
        LOGGER.info("%s", line)
    if not options.check_target:
        check_connection(target.endpoint)
        return
    for note in _preflight(run.spec, options.preflight_timeout_s, options.watchdog_s, target,
                           redactor):  # fmt: skip
        if options.quiet:  # still said, once: warnings reach stderr and the run's log
            LOGGER.warning("preflight: %s", note)
        else:
            LOGGER.info("preflight: %s", note)
            terminal.warn(f"preflight: {note}")


def _preflight(
    spec: WorkloadSpec, timeout_s: float | None, watchdog_s: float, target: Target,
    redactor: Redactor,
) -> list[str]:  # fmt: skip
    """The preflight request (TargetError: exit 1), and what it warns about."""
    endpoint, config = target.endpoint, target.config
    timeout_s, why = preflight_deadline(spec, timeout_s, watchdog_s)
    priority = next((c.priority for c in spec.classes.values() if c.priority is not None), None)
    request = RequestEncoder(config, None, endpoint).preflight_request(priority)
    try:
        return preflight(endpoint, config.adapter, config.body_options, timeout_s=timeout_s,
                         deadline_why=why, redactor=redactor, request=request,
                         max_event_bytes=max(config.max_event_bytes.values()))  # fmt: skip
    except LoadgenError as exc:
        raise TargetError(redactor.redact(str(exc))) from None


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


def _scraper(
    run: RunContext, endpoint: Endpoint, redactor: Redactor
) -> tuple[ScraperProcess | None, ServerMetricsInfo | None]:
    """The server-metrics scraper (a process of its own: `processes.scraper`), started, when
    a URL is given (a path is on the target), and run.json's `server_metrics` for it.

    It sends the target's credentials only to the target's origin, and the endpoint's own
    headers (`engine.scrape.scrape_auth`). The first scrape is awaited, up to its timeout
    (before t0: it delays no request): it is every counter's baseline, and a spawned, niced
    scraper on a busy host could otherwise first read the server after a short run had
    ended (its counters would read 0). Unless quiet, a refused endpoint is said at once.
    """
    spec, options, terminal = run.spec, run.options, run.terminal
    url = metrics_url(spec, options)
    if url is None:
        return None, None
    if url.startswith("/"):
        url = endpoint.origin + url
    interval_s = options.server_metrics_interval_s or spec.target.server_metrics_interval_s
    auth = scrape_auth(url, endpoint.origin, endpoint.headers, metrics_headers(spec, options))
    info = ServerMetricsInfo(url=redact_url(url), interval_s=interval_s)
    scraper = ScraperProcess(url, interval_s, run_dir=run.run_dir, auth=auth, redactor=redactor,
                             network=options.network)  # fmt: skip
    scraper.start()
    first = scraper.first_done.wait(scraper.timeout_s + 5)  # a starved scraper is late
    if not terminal.quiet:
        sent = f" with {', '.join(sorted(auth.headers))}" if auth.headers else ""
        terminal.say(f"scraping {redact_url(url)} every {interval_s:g} s{sent}")
        if first and scraper.failures:
            note = scraper.access().problem
            terminal.say(f"server metrics: {note}; the run goes on, its client figures "
                         "unaffected")  # fmt: skip
    return scraper, info


def _reset(
    cache: CacheWarmth, endpoint: Endpoint, scraper: ScraperProcess | None, redactor: Redactor,
    run: RunContext,
) -> CacheWarmth:  # fmt: skip
    """Ask the server to empty its prefix cache (its kind from the first scrape, if any)."""
    family = None
    if scraper is not None and scraper.first_done.wait(scraper.timeout_s + 1):
        family = scraper.family
    said = reset_prefix_cache(endpoint.origin, endpoint.headers, family=family,
                              redact=redactor.redact, network=run.options.network)  # fmt: skip
    LOGGER.info("cache: reset: %s", said)
    run.terminal.say(f"cache: reset: {endpoint.origin} emptied its prefix cache ({said})")
    return replace(cache, reset=said)


# -- judging ---------------------------------------------------------------------------


def finish(
    ran: Ran, run: RunContext, outputs: Outputs, *, planned: int, scraper: ScraperProcess | None,
    spans: SpanReceiver | None = None,
) -> RunResult:  # fmt: skip
    """Audit the joined records (with the server's figures, the scraper stopped, when the run
    scraped a server; with the server's spans joined, when it received them), and end the
    outputs with the summary (summary.json, histograms.parquet and the final run.json among
    them)."""
    frame, info, state, options = ran.frame, ran.info, ran.state, run.options
    watchdog = state.watchdog
    interrupted = state.interrupted or watchdog is not None
    stopped = "watchdog" if watchdog is not None else "interrupted" if interrupted else None
    if info.shard is not None and info.t0 is not None:
        info = replace(info, shard=shard_anchor(info.shard, info.t0))
    objectives = {name: Objective.of(cls) for name, cls in run.spec.classes.items()}
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
        path_buffers=run.spec.target.path_buffers,
    )  # fmt: skip
    if scraper is not None:
        summary, info = _server_block(summary, scraper, run.run_dir, info, frame)
    if spans is not None:
        summary = collect_spans(spans, run, frame, info, summary)
    summary = with_cache(summary, info.cache)
    final = replace(info, interrupted=interrupted, finished=True, stopped=stopped,
                    watchdog=watchdog)  # fmt: skip
    outputs.end(Ended(frame=frame, summary=summary, info=final))
    return RunResult(run_dir=run.run_dir, summary=summary, interrupted=interrupted,
                     watchdog=watchdog, run_info=final)  # fmt: skip


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


# -- how many engine processes ---------------------------------------------------------


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
