"""One run, end to end: plans → target → engine → records → summary, in a run folder.

The only module that owns a run's side effects: the run folder, `run.json`, the embedded
simulator's lifetime, signals, the progress line and the final summary. Everything it
computes comes from the pure stages (spec, arrivals, plans, metrics); everything it
measures comes from the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import re
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio
import polars as pl
from polars.exceptions import PanicException

from loadgen import __version__
from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import Adapter, BodyOptions
from loadgen.analysis.metrics import generator_health
from loadgen.analysis.minutes import write_histograms
from loadgen.analysis.objectives import Objective, apply_objectives
from loadgen.analysis.slo import summarize
from loadgen.engine.clock import SYSTEM_CLOCK, Clock
from loadgen.engine.harness import run_beside, run_engine
from loadgen.engine.host import raise_open_files_limit
from loadgen.engine.logs import LOGGER, run_log
from loadgen.engine.preflight import preflight, preflight_deadline
from loadgen.engine.runner import Engine, EngineConfig, LiveStats
from loadgen.engine.secrets import Redactor, run_secrets
from loadgen.engine.transport import Endpoint, Pool, make_endpoint, redact_url
from loadgen.errors import (
    TRANSIENT_ERRNOS,
    ClientFailure,
    ConfigError,
    LoadgenError,
    TargetError,
    describe_os_error,
)
from loadgen.results.records import (
    PARTS_DIR,
    RECORDS_FILE,
    RecordWriter,
    RequestRecord,
    read_parts,
    remove_parts,
    write_parquet_atomic,
)
from loadgen.results.runfolder import (
    EXIT_INTERRUPTED,
    SCHEMA_VERSION,
    new_run_id,
    write_json_atomic,
)
from loadgen.run.envelope import envelope_warning, expected_peak_load, last_envelope
from loadgen.run.simulator import target_url
from loadgen.workload.identity import identity
from loadgen.workload.plans import Work, plan_work
from loadgen.workload.prompts import PromptMaker
from loadgen.workload.shards import Share, check_start_at, split_work, utc_text
from loadgen.workload.spec import WorkloadSpec, header_problem

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    """What the command line adds to a workload."""

    url: str | None = None
    seed: int | None = None
    out_dir: Path = Path("reports")
    run_id: str | None = None
    max_in_flight: int | None = None
    quiet: bool = False
    lag_bound_ms: float = 5.0
    grace_s: float = 5.0
    check_target: bool = True
    preflight_timeout_s: float | None = None  # None: the class deadlines (engine.preflight)
    sim_trace: bool = False
    watchdog_s: float = 300.0  # abort (exit 4) after this long with nothing progressing
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    workers: int | None = None  # engine processes; None: 1, or one per core past the envelope
    shard: Share | None = None  # run only this share of the schedule (`--shard i/N`)
    start_at_unix_ns: int | None = None  # the agreed wall-clock t0 (`--start-at`)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What a finished (or interrupted) run left behind."""

    run_dir: Path
    summary: dict[str, Any]
    interrupted: bool

    watchdog: str | None = None  # what the run was waiting for when the watchdog stopped it
    run_info: Mapping[str, Any] = field(default_factory=dict)  # run.json as written

    @property
    def exit_code(self) -> int:
        """The summary's verdict: 0 met, 2 missed, 3 fell behind; 4 stopped by the
        watchdog, 130 interrupted (no verdict on the server)."""
        return int(self.summary["verdict"]["exit_code"])


def resolve_headers(
    spec: WorkloadSpec, extra: Mapping[str, str], env_values: list[str] | None = None
) -> dict[str, str]:
    """Request headers: the API's, the file's (with `${VAR}` from the environment), extras.

    Every value read from the environment is appended to `env_values` (they are secrets).
    """
    source = spec.source
    headers: dict[str, str] = {}
    env_values = env_values if env_values is not None else []
    for name, value in {**spec.target.headers, **extra}.items():

        def expand(match: re.Match[str], name: str = name) -> str:
            var = match.group(1)
            if var not in os.environ:
                raise ConfigError(
                    source,
                    f"target.headers.{name}",
                    f"${{{var}}} is not set",
                    f"export {var}=... before the run",
                )
            env_values.append(os.environ[var])
            return os.environ[var]

        headers[name] = ENV_REF.sub(expand, value)
    key_env, key = spec.target.api_key_env, None
    if key_env:
        key = os.environ.get(key_env)
        if not key:
            raise ConfigError(
                source,
                "target.api_key_env",
                f"environment variable {key_env} is not set",
                f"export {key_env}=<your key> before the run",
            )
        env_values.append(key)
    # The API's own headers and the key where it expects it (Bearer; Anthropic: x-api-key).
    resolved = {**adapter_for(spec.target.api, spec.target.generic).headers(key), **headers}
    for name, value in resolved.items():  # a value read from the environment: CR/LF, ...
        if problem := header_problem(name, value):
            problem = problem.replace("a header value", "its value")
            fix = "check the environment variable it is read from"
            raise ConfigError(source, f"header {name}", problem, fix)
    return resolved


def execute(spec: WorkloadSpec, options: RunOptions, *, log: TextIO = sys.stderr) -> RunResult:
    """Run the workload and write its folder; see `RunResult.exit_code` for the verdict."""
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

    if not options.quiet and (warning := envelope_warning(spec, work.plans, processes=workers)):
        print(warning, file=log)
    adapter, headers, redactor, url = client_setup(spec, options)
    open_files = raise_open_files_limit()
    run_dir = _make_run_dir(options.out_dir, options.run_id or new_run_id(spec.name))
    trace = run_dir / "sim-trace.jsonl" if options.sim_trace else None
    with run_log(run_dir, redactor.redact), target_url(url, spec, trace_file=trace) as target:
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
            timeout_s, why = preflight_deadline(
                spec, options.preflight_timeout_s, options.watchdog_s
            )
            try:
                preflight(endpoint, adapter, config.body_options, timeout_s=timeout_s,
                          deadline_why=why, redactor=redactor,
                          max_event_bytes=max(config.max_event_bytes.values()))  # fmt: skip
            except LoadgenError as exc:
                raise TargetError(redactor.redact(str(exc))) from None
        run_info = _run_info(spec, options, endpoint, planned, sim_args)
        run_info["host"]["open_files_limit"] = open_files
        run_info["workers"] = {"count": workers, "chosen": why, "processes": []}
        if workers > 1:
            from loadgen.run.workers import run_workers

            result = run_workers(work, workers, base_url, run_dir, run_info, spec, options, log)
        else:
            result = _run(work, endpoint, config, run_dir, run_info, spec, options, log)
        LOGGER.info("run %s: written, exit code %d", run_dir.name, result.exit_code)
    if sim_args is not None and not options.quiet:
        print("stopped the built-in simulator", file=log)
    return result


def choose_workers(spec: WorkloadSpec, work: Work, requested: int | None) -> tuple[int, str]:
    """How many engine processes, and why: as asked; else one per core when the workload's
    expected peak load exceeds what one process held in this host's last `loadgen
    calibrate`; else one."""
    if requested is not None:
        return requested, f"--workers {requested}"
    envelope = last_envelope()
    if envelope is None:
        return 1, "the default: this host has no calibrated envelope (see loadgen calibrate)"
    peak = expected_peak_load(spec, work.plans)
    cores = os.cpu_count() or 1
    if peak.exceeds(envelope.load):
        return cores, (
            f"one per core: the expected peak ({peak}) exceeds one process's calibrated "
            f"envelope ({envelope.load})"
        )
    return 1, f"the expected peak ({peak}) fits one process's calibrated envelope ({envelope.load})"


def client_setup(
    spec: WorkloadSpec, options: RunOptions
) -> tuple[Adapter, dict[str, str], Redactor, str | None]:
    """The adapter, the request headers, the redactor of their secrets, and the URL."""
    adapter = adapter_for(spec.target.api, spec.target.generic)
    env_values: list[str] = []
    headers = resolve_headers(spec, options.extra_headers, env_values)
    url = options.url or spec.target.url
    return adapter, headers, Redactor(run_secrets(headers, env_values, url)), url


def engine_setup(
    spec: WorkloadSpec,
    options: RunOptions,
    base_url: str,
    adapter: Adapter,
    headers: Mapping[str, str],
    redactor: Redactor,
) -> tuple[Endpoint, EngineConfig]:
    """The endpoint and the engine's configuration (the same in every worker process)."""
    endpoint = make_endpoint(base_url, spec.target.path or adapter.default_path, dict(headers))
    body_options = BodyOptions(
        model=spec.target.model,
        include_usage=spec.target.include_usage,
        force_output_tokens=spec.target.force_output_tokens,
        extra_body=spec.target.extra_body,
    )
    seed = spec.seed if options.seed is None else options.seed
    config = EngineConfig(
        adapter=adapter,
        body_options=body_options,
        seed=seed,
        max_in_flight=options.max_in_flight,
        priority_header=spec.target.priority_header,
        prompts=PromptMaker(seed, spec.target.tokenizer),
        redactor=redactor,
        max_event_bytes={name: c.limits.max_event_bytes for name, c in spec.classes.items()},
    )
    return endpoint, config


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
) -> RunResult:
    """One engine process: its own signals, progress line and watchdog."""
    writer = RecordWriter(run_dir)
    stats = LiveStats()
    run_info = {"run_id": run_dir.name, **run_info}

    def started(t0: dict[str, Any]) -> None:
        run_info["t0"] = t0
        write_json_atomic(
            run_dir / "run.json", {**run_info, "interrupted": False, "finished": False}
        )

    async def control(engine: Engine, state: dict[str, Any]) -> None:
        await _watch_signals(engine, options.grace_s, writer, state, log)

    with client_failures(run_dir, writer, stats, run_info):
        state = drive(
            work, endpoint, config, writer, stats, options,
            start_at_unix_ns=options.start_at_unix_ns, started=started, control=control,
            quiet=options.quiet, log=log,
        )  # fmt: skip
        if state.get("client_failure") is not None:
            raise state["client_failure"]
        frame = writer.close()
        run_info["t0"] = state["t0"]
        run_info["workers"]["processes"] = [
            process_info(frame, None, index=0, pid=os.getpid(), t0=state["t0"],
                         parent_t0=state["t0"], lag_bound_ms=options.lag_bound_ms)
        ]  # fmt: skip
        return finish(frame, run_dir, run_info, spec, options, planned=stats.planned, state=state)


@contextlib.contextmanager
def client_failures(
    run_dir: Path, writer: RecordWriter, stats: LiveStats, run_info: dict[str, Any]
) -> Iterator[None]:
    """Turn a failed write (no space left, permission denied, out of file descriptors,
    file too large) into a `ClientFailure` (exit 3); see `client_failure`.

    The engine was already stopped (see `drive`); what is still pending is written if the
    resource is back, and counted as lost if not.
    """
    try:
        yield
    except OSError as exc:
        with contextlib.suppress(OSError):  # still failing: counted as lost below
            writer.flush()
        raise client_failure(
            describe_os_error(exc, exc.filename or run_dir), run_dir, run_info,
            written=writer.written, planned=stats.planned, lost=writer.pending, sent=stats.sent,
        ) from None  # fmt: skip


def client_failure(
    what: str, run_dir: Path, run_info: Mapping[str, Any], *, written: int, planned: int,
    lost: int = 0, sent: int | None = None,
) -> ClientFailure:  # fmt: skip
    """The one-line error of a run the client could not finish: what failed (the path or
    the limit), how many records are on disk, and how to finish them (`loadgen report
    --recover`). run.json says what happened, if it still can be written."""
    with contextlib.suppress(OSError):
        info = {"run_id": run_dir.name, **run_info, "interrupted": True, "finished": False}
        write_json_atomic(run_dir / "run.json", {**info, "client_failure": what})
    kept = f"{written:,} of {planned:,} planned records are on disk"
    if lost:
        kept += f" ({lost:,} more could not be written)"
    stopped = f"the run stopped ({sent:,} sent)" if sent is not None else "the run stopped"
    return ClientFailure(
        f"{what}; {stopped}: the client failed, so this is not a measurement of the server "
        f"(exit 3). {kept}; once the cause is fixed, `loadgen report --recover {run_dir}` "
        "finishes them"
    )


def drive(
    work: Work,
    endpoint: Endpoint,
    config: EngineConfig,
    writer: RecordWriter,
    stats: LiveStats,
    options: RunOptions,
    *,
    start_at_unix_ns: int | None,
    started: Callable[[dict[str, Any]], None],
    control: Callable[[Engine, dict[str, Any]], Coroutine[Any, Any, None]],
    quiet: bool,
    log: TextIO,
    wait_start: Callable[[], Awaitable[int]] | None = None,
) -> dict[str, Any]:
    """Run the engine on `work` from t0 (200 ms from now, or the agreed `start_at_unix_ns`),
    with `control` (signals, or a parent's commands), record spills and the watchdog.

    Returns the state: `interrupted`, `watchdog` (what it stopped), `t0`. `started(t0)` is
    called once t0 is fixed, before the schedule begins. A worker process passes
    `wait_start`: it reports ready and returns the start its parent chose, once the loop
    and the engine are up (so a worker is not still setting up when t0 comes).
    """
    state: dict[str, Any] = {"interrupted": False}

    async def session(engine: Engine) -> None:
        def client_failed(exc: OSError) -> None:
            """A record write failed for good: stop sending, end what is in flight."""
            if state.get("client_failure") is None:
                state["client_failure"] = exc
                what = describe_os_error(exc, exc.filename)
                print(f"\nclient failure: {what}; stopping the run", file=log)
            engine.stop()
            engine.requests.cancel()

        start = start_at_unix_ns if wait_start is None else await wait_start()
        state["t0"] = t0 = choose_t0(start, engine.clock)
        t0_ns = int(t0["perf_counter_ns"])
        if start is not None and not quiet:
            wait_s = (t0_ns - engine.clock.now_ns()) / 1e9
            print(f"waiting {max(0.0, wait_s):,.1f} s for the agreed start {t0['utc']}", file=log)
        started(t0)
        await run_beside(
            engine, t0_ns,
            partial(control, engine, state),
            partial(_progress, stats, writer, quiet, t0_ns, log, client_failed, engine.clock),
            partial(_watchdog, engine, options.watchdog_s, state, log),
            partial(_measure_anchor, t0, engine.clock),
        )  # fmt: skip

    run_engine(work, Pool(endpoint), config, writer.add, session, stats=stats)
    return state


def choose_t0(start_at_unix_ns: int | None, clock: Clock = SYSTEM_CLOCK) -> dict[str, Any]:
    """t0 on both clocks: 200 ms from now (time for the tasks and first imports to settle),
    or the agreed wall-clock start converted to this process's monotonic clock."""
    perf_now, unix_now = clock.now_ns(), clock.wall_ns()
    if start_at_unix_ns is None:
        t0_ns = perf_now + 200_000_000
        unix_ns = unix_now + 200_000_000
    else:
        t0_ns, unix_ns = perf_now + (start_at_unix_ns - unix_now), start_at_unix_ns
    return {"perf_counter_ns": t0_ns, "unix_ns": unix_ns, "utc": utc_text(unix_ns)}


async def _measure_anchor(t0: dict[str, Any], clock: Clock) -> None:
    """At t0, read the wall clock again: `measured_unix_ns` is the wall-clock time of t0 as
    read when the monotonic clock got there (what `loadgen merge` aligns shards by; it
    differs from `unix_ns` by any wall-clock adjustment during the wait), and
    `reached_late_ms` how late this process woke for it."""
    t0_ns = int(t0["perf_counter_ns"])
    delay_ns = t0_ns - clock.now_ns()
    if delay_ns > 0:
        await anyio.sleep(delay_ns / 1e9)
    unix_now, perf_now = clock.wall_ns(), clock.now_ns()
    t0["measured_unix_ns"] = unix_now - (perf_now - t0_ns)
    t0["reached_late_ms"] = round(max(0, perf_now - t0_ns) / 1e6, 3)


def process_info(
    frame: pl.DataFrame,
    ids: Sequence[int] | None,
    *,
    index: int,
    pid: int,
    t0: Mapping[str, Any],
    parent_t0: Mapping[str, Any],
    lag_bound_ms: float,
    exit_code: int | None = 0,
) -> dict[str, Any]:
    """One engine process's share of the run: its records, send lag and t0 skew.

    `t0_skew_us` is its t0 on the monotonic clock minus the parent's (one host, one clock:
    the cost of converting the agreed wall-clock start on each side).
    """
    mine = frame if ids is None else frame.filter(pl.col("request_id").is_in(list(ids)))
    health = generator_health(mine, planned=mine.height, lag_bound_ms=lag_bound_ms)
    skew_ns = int(t0["perf_counter_ns"]) - int(parent_t0["perf_counter_ns"])
    return {
        "index": index,
        "pid": pid,
        "exit_code": exit_code,
        "records": mine.height,
        "lag_ms_p99": health["lag_ms"]["p99"],
        "late_share": late_share(mine, lag_bound_ms),
        "fell_behind": health["fell_behind"],
        "t0_skew_us": round(skew_ns / 1e3, 3),
        "reached_late_ms": t0.get("reached_late_ms"),
    }


def late_share(frame: pl.DataFrame, lag_bound_ms: float) -> float | None:
    """Share of the schedule's sends (singles and first turns) later than the bound."""
    lag_ns = pl.coalesce(pl.col("dispatched_ns"), pl.col("sent_ns")) - pl.col("intended_ns")
    scheduled = frame.filter(pl.col("turn").fill_null(0) == 0).select(lag_ns.alias("lag"))
    lags = scheduled.get_column("lag").drop_nulls()
    if not lags.len():
        return None
    return round(float((lags > lag_bound_ms * 1e6).sum()) / lags.len(), 6)


def finish(
    frame: pl.DataFrame,
    run_dir: Path,
    run_info: dict[str, Any],
    spec: WorkloadSpec,
    options: RunOptions,
    *,
    planned: int,
    state: Mapping[str, Any],
) -> RunResult:
    """Audit the joined records; write summary.json, histograms.parquet and the final run.json."""
    run_id = run_dir.name
    watchdog = state.get("watchdog")
    interrupted = bool(state["interrupted"]) or watchdog is not None
    stopped = "watchdog" if watchdog is not None else "interrupted" if interrupted else None
    if run_info.get("shard") is not None:
        t0 = run_info["t0"]
        run_info["shard"] = {**run_info["shard"], **shard_anchor(t0)}
    summary = summarize(
        frame,
        run_id=run_id,
        slos={name: cls.slo for name, cls in spec.classes.items()},
        planned=planned,
        stopped=stopped,
        lag_bound_ms=options.lag_bound_ms,
    )
    objectives = {name: Objective.of(cls) for name, cls in spec.classes.items()}
    summary = apply_objectives(summary, frame, objectives)
    summary = {"schema_version": SCHEMA_VERSION, "loadgen_version": __version__, **summary}
    write_json_atomic(run_dir / "summary.json", summary)
    # Per-minute mergeable histograms: rolling windows over many runs read these, not records.
    write_histograms(run_dir, frame, {name: cls.slo for name, cls in spec.classes.items()})
    final = {"run_id": run_id, **run_info, "interrupted": interrupted, "finished": True,
             "stopped": stopped, "watchdog": watchdog}  # fmt: skip
    write_json_atomic(run_dir / "run.json", final)
    return RunResult(
        run_dir=run_dir, summary=summary, interrupted=interrupted, watchdog=watchdog,
        run_info=final,
    )  # fmt: skip


def shard_anchor(t0: Mapping[str, Any]) -> dict[str, Any]:
    """A shard's t0 wall-clock anchor (measured at t0) and its skew from the agreed start."""
    measured = t0.get("measured_unix_ns")
    agreed = int(t0["unix_ns"])
    return {
        "t0_unix_ns": measured,
        "t0_skew_ms": round((measured - agreed) / 1e6, 6) if measured is not None else None,
    }


def join_parts(run_dir: Path) -> pl.DataFrame:
    """Every part in the run's parts folder as `records.parquet`; the parts are removed."""

    parts = run_dir / PARTS_DIR
    frame = read_parts(parts)
    write_parquet_atomic(frame, run_dir / RECORDS_FILE)
    remove_parts(parts)
    return frame


async def _watch_signals(
    engine: Engine, grace_s: float, writer: RecordWriter, state: dict[str, Any], log: TextIO
) -> None:
    """First Ctrl-C/SIGTERM: stop sending, give in-flight requests `grace_s`, then cancel them.
    Second: write what is pending and exit at once (the parts written so far stay readable)."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if state["interrupted"]:
                print("\nsecond interrupt: exiting now; records written so far are kept", file=log)
                writer.flush()
                os._exit(EXIT_INTERRUPTED)
            state["interrupted"] = True
            print(
                f"\ninterrupted: no new requests; waiting up to {grace_s:g} s for "
                "in-flight ones (interrupt again to exit now)",
                file=log,
            )
            engine.stop()
            with anyio.move_on_after(grace_s):
                async for _ in signals:
                    print(
                        "\nsecond interrupt: exiting now; records written so far are kept", file=log
                    )
                    writer.flush()
                    os._exit(EXIT_INTERRUPTED)
            engine.requests.cancel()


async def _watchdog(engine: Engine, limit_s: float, state: dict[str, Any], log: TextIO) -> None:
    """Abort the run when nothing has progressed for `limit_s` while work is due.

    Progress is a send, a byte received or a request ending. Work is due when requests are
    in flight or the next scheduled send time has passed. Deadlines normally end stuck
    requests; this catches what they cannot (a client bug, deadlines set longer than the
    patience of the job). Everything not finished is recorded as cancelled.
    """
    stats, connector = engine.stats, engine.connector
    while True:
        await anyio.sleep(min(1.0, limit_s / 4))
        now = engine.clock.now_ns()
        last = max(stats.last_progress_ns, connector.last_read_ns, engine.t0_ns)
        due = engine.next_due_ns is not None and engine.next_due_ns <= now
        if (stats.in_flight or due) and now - last > limit_s * 1e9:
            waiting = (f"{stats.in_flight} requests in flight" if stats.in_flight
                       else "the scheduler's next send")  # fmt: skip
            state["watchdog"] = (
                f"nothing progressed for {limit_s:g} s (no send, no byte, no completion) while "
                f"waiting for {waiting}; {stats.sent} of {stats.planned} sent"
            )
            print(f"\nwatchdog: {state['watchdog']}; stopping, records kept", file=log)
            engine.stop()
            engine.requests.cancel()
            return


async def _progress(
    stats: LiveStats, writer: RecordWriter, quiet: bool, t0_ns: int, log: TextIO,
    client_failed: Callable[[OSError], None], clock: Clock,
) -> None:  # fmt: skip
    """Spill records about once a second (in a thread) and redraw the progress line.

    A write that fails for want of file descriptors is retried with the next batch (they
    come back as requests end); any other failed write (no space, permission, file size
    limit) stops the run through `client_failed`.
    """
    tty = log.isatty()
    last_line = 0.0
    try:
        while True:
            await anyio.sleep(0.25)
            batch = writer.take_due()
            if batch:
                await _spill(writer, batch, client_failed)
            now = time.monotonic()
            if quiet or (not tty and now - last_line < 10):
                continue
            last_line = now
            line = progress_line(stats, (clock.now_ns() - t0_ns) / 1e9)
            print(f"\r{line}\x1b[K" if tty else line, end="" if tty else "\n", file=log, flush=True)
    finally:
        if tty and not quiet:
            print(file=log)


async def _spill(
    writer: RecordWriter, batch: list[RequestRecord], client_failed: Callable[[OSError], None]
) -> None:
    """Write one batch as a part in a thread. A batch whose write fails goes back to the
    writer (out of file descriptors: retried later; any other OSError, such as no space
    left, also stops the run through `client_failed`); so does one whose task is cancelled
    (the run is ending) before the thread took it, for the final flush: never lost, never
    written twice."""
    written = False

    def write() -> None:
        nonlocal written
        writer.write_part(batch)
        written = True

    try:
        await anyio.to_thread.run_sync(write)
    except PanicException:  # polars short of file descriptors: retry later
        writer.requeue(batch)
    except OSError as exc:
        writer.requeue(batch)
        if exc.errno not in TRANSIENT_ERRNOS:
            client_failed(exc)
    except BaseException:
        if not written:  # cancelled at the checkpoint before the (shielded) write began
            writer.requeue(batch)
        raise


def progress_line(stats: LiveStats, elapsed_s: float) -> str:
    """`[  12.3s] sent 120/400  in flight 14  ok 100  failed 6  TTFT p50 250 ms  p99 800 ms`."""
    ttft = stats.ttft
    ttft_text = (
        f"TTFT p50 {ttft.percentile_ms(50):,.0f} ms  p99 {ttft.percentile_ms(99):,.0f} ms"
        if ttft.count
        else "TTFT -"
    )
    return (
        f"[{max(0.0, elapsed_s):7.1f}s] sent {stats.sent}/{stats.planned}  "
        f"in flight {stats.in_flight}  ok {stats.ok}  failed {stats.failed}  {ttft_text}"
    )
