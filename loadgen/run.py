"""One run, end to end: plans → target → engine → records → summary, in a run folder.

The only module that owns a run's side effects: the run folder, `run.json`, the embedded
simulator's lifetime, signals, the progress line and the final summary. Everything it
computes comes from the pure stages (spec, arrivals, plans, metrics); everything it
measures comes from the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import platform
import re
import secrets
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter_ns
from typing import Any, TextIO

import anyio
from polars.exceptions import PanicException

from loadgen import __version__
from loadgen.adapters import BodyOptions, adapter_for
from loadgen.errors import ConfigError, LoadgenError, TargetError
from loadgen.logs import LOGGER, run_log
from loadgen.objectives import Objective, apply_objectives
from loadgen.plans import Work, plan_work
from loadgen.preflight import preflight
from loadgen.prompts import PromptMaker
from loadgen.records import RecordWriter
from loadgen.runner import Engine, EngineConfig, LiveStats
from loadgen.secrets import Redactor, run_secrets
from loadgen.slo import summarize
from loadgen.spec import WorkloadSpec
from loadgen.store import write_histograms
from loadgen.transport import Endpoint, Pool, make_endpoint, redact_url

SCHEMA_VERSION = 3  # 3: adapters (visible-token TTFT, server timings), workers/shards
# 2: client_error outcome, generator.client_errors, host.open_files_limit
EXIT_INTERRUPTED = 130
EXIT_WATCHDOG = 4
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
    sim_trace: bool = False
    watchdog_s: float = 300.0  # abort (exit 4) after this long with nothing progressing
    extra_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What a finished (or interrupted) run left behind."""

    run_dir: Path
    summary: dict[str, Any]
    interrupted: bool

    watchdog: str | None = None  # what the run was waiting for when the watchdog stopped it

    @property
    def exit_code(self) -> int:
        """4 when the watchdog stopped it, 130 when interrupted, else the summary's verdict
        (0 met, 2 missed, 3 fell behind)."""
        if self.watchdog:
            return EXIT_WATCHDOG
        if self.interrupted:
            return EXIT_INTERRUPTED
        return int(self.summary["verdict"]["exit_code"])


def new_run_id(name: str) -> str:
    """`20261129T101500Z-chat-smoke-1a2b`: sortable, unique, readable."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "run"
    return f"{stamp}-{slug}-{secrets.token_hex(2)}"


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
    return {**adapter_for(spec.target.api, spec.target.generic).headers(key), **headers}


def execute(spec: WorkloadSpec, options: RunOptions, *, log: TextIO = sys.stderr) -> RunResult:
    """Run the workload and write its folder; see `RunResult.exit_code` for the verdict."""
    work = plan_work(spec, options.seed)
    prompts = PromptMaker(
        spec.seed if options.seed is None else options.seed, spec.target.tokenizer
    )
    planned = len(work.plans)
    if not planned:
        raise ConfigError(
            spec.source, "classes", "plans no requests", "raise requests or duration_s"
        )
    from loadgen.calibrate import envelope_warning  # the last `loadgen calibrate` on this host

    if not options.quiet and (warning := envelope_warning(spec, work.plans)):
        print(warning, file=log)
    adapter = adapter_for(spec.target.api, spec.target.generic)
    env_values: list[str] = []
    headers = resolve_headers(spec, options.extra_headers, env_values)
    url = options.url or spec.target.url
    redactor = Redactor(run_secrets(headers, env_values, url))
    open_files = raise_open_files_limit()
    run_dir = _make_run_dir(options.out_dir, options.run_id or new_run_id(spec.name))
    with run_log(run_dir, redactor.redact), _target(url, spec, run_dir, options, log) as (
        base_url,
        sim_args,
    ):
        endpoint = make_endpoint(base_url, spec.target.path or adapter.default_path, headers)
        LOGGER.info("run %s: %d planned requests to %s%s", run_dir.name, planned,
                    endpoint.origin, endpoint.target)  # fmt: skip
        body_options = BodyOptions(
            model=spec.target.model,
            include_usage=spec.target.include_usage,
            force_output_tokens=spec.target.force_output_tokens,
            extra_body=spec.target.extra_body,
        )
        if options.check_target:
            try:
                preflight(endpoint, adapter, body_options)
            except LoadgenError as exc:
                raise TargetError(redactor.redact(str(exc))) from None
        seed = spec.seed if options.seed is None else options.seed
        config = EngineConfig(
            adapter=adapter,
            body_options=body_options,
            seed=seed,
            max_in_flight=options.max_in_flight,
            priority_header=spec.target.priority_header,
            prompts=prompts,
            redact=redactor.redact,
        )
        run_info = _run_info(spec, options, endpoint, planned, sim_args)
        run_info["host"]["open_files_limit"] = open_files
        result = _run(work, endpoint, config, run_dir, run_info, spec, options, log)
        LOGGER.info("run %s: written, exit code %d", run_dir.name, result.exit_code)
        return result


@contextlib.contextmanager
def _target(
    url: str | None, spec: WorkloadSpec, run_dir: Path, options: RunOptions, log: TextIO
) -> Iterator[tuple[str, list[str] | None]]:
    """The given URL, or the built-in simulator started for this run and stopped after it."""
    if url:
        yield url, None
        return
    from loadgen.sim.launch import running_sim, sim_args_from_mapping

    args = sim_args_from_mapping(spec.sim, spec.source)
    trace = run_dir / "sim-trace.jsonl" if options.sim_trace else None
    with running_sim(args, trace_file=trace) as sim:
        if not options.quiet:
            print(
                f"no --url given: started the built-in simulator (loadgen sim) at {sim.url}"
                f"{' with ' + ' '.join(args) if args else ' with the seed parameters'}",
                file=log,
            )
        yield sim.url, args
    if not options.quiet:
        print("stopped the built-in simulator", file=log)


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
        "workload": {"name": spec.name, "source": spec.source, "spec": resolved},
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
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
    }


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON to a temp name and rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


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
    writer = RecordWriter(run_dir)
    stats = LiveStats()
    state: dict[str, Any] = {"interrupted": False}
    run_id = run_dir.name
    run_info = {"run_id": run_id, **run_info}

    async def main() -> None:
        pool = Pool(endpoint)
        engine = Engine(work, pool, config, writer.add, stats)
        t0_ns = perf_counter_ns() + 200_000_000  # time for the tasks and first imports to settle
        run_info["t0"] = {
            "perf_counter_ns": t0_ns,
            "unix_ns": time.time_ns() + (t0_ns - perf_counter_ns()),
        }
        run_info["t0"]["utc"] = datetime.fromtimestamp(
            run_info["t0"]["unix_ns"] / 1e9, UTC
        ).isoformat()
        write_json_atomic(
            run_dir / "run.json", {**run_info, "interrupted": False, "finished": False}
        )
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch_signals, engine, options.grace_s, writer, state, log)
                tg.start_soon(_progress, stats, writer, options.quiet, t0_ns, log)
                tg.start_soon(_watchdog, engine, pool, options.watchdog_s, state, log)
                await engine.run(t0_ns)
                tg.cancel_scope.cancel()
        finally:
            pool.close()

    with quiet_gc():
        anyio.run(main, backend="asyncio", backend_options=backend_options())
    frame = writer.close()
    watchdog = state.get("watchdog")
    interrupted = bool(state["interrupted"]) or watchdog is not None
    summary = summarize(
        frame,
        run_id=run_id,
        slos={name: cls.slo for name, cls in spec.classes.items()},
        planned=stats.planned,
        interrupted=interrupted,
        lag_bound_ms=options.lag_bound_ms,
    )
    objectives = {name: Objective.of(cls) for name, cls in spec.classes.items()}
    summary = apply_objectives(summary, frame, objectives)
    summary = {"schema_version": SCHEMA_VERSION, "loadgen_version": __version__, **summary}
    write_json_atomic(run_dir / "summary.json", summary)
    # Per-minute mergeable histograms: rolling windows over many runs read these, not records.
    write_histograms(run_dir, frame, {name: cls.slo for name, cls in spec.classes.items()})
    write_json_atomic(
        run_dir / "run.json", {**run_info, "interrupted": interrupted, "finished": True}
    )
    return RunResult(run_dir=run_dir, summary=summary, interrupted=interrupted, watchdog=watchdog)


def raise_open_files_limit() -> int | None:
    """Raise the soft open-files limit to the hard one (each stream holds a socket).

    Returns the limit now in force (None where the platform has none). What is still too
    few shows up as `client_error` records and an invalid run (exit 3), never as server
    failures.
    """
    try:
        import resource
    except ImportError:  # not on this platform
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return int(soft)


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Keep the garbage collector's full passes out of the measurement window.

    A full (generation 2) collection walks every live object; mid-run that is the records
    and chunk lists of thousands of requests, a pause of several ms during which no chunk
    is stamped. The plans and imports are frozen out of the collector, and full passes
    wait for the end of the run; young generations are still collected as usual (the
    engine breaks its own reference cycles, so little reaches the old generation).
    """
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], 1_000_000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def backend_options() -> dict[str, Any]:
    """anyio's asyncio backend, on uvloop when it is installed (lower per-event cost)."""
    try:
        import uvloop  # noqa: F401  # only probing that it is installed
    except ImportError:
        return {}
    return {"use_uvloop": True}


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


async def _watchdog(
    engine: Engine, pool: Pool, limit_s: float, state: dict[str, Any], log: TextIO
) -> None:
    """Abort the run when nothing has progressed for `limit_s` while work is due.

    Progress is a send, a byte received or a request ending. Work is due when requests are
    in flight or the next scheduled send time has passed. Deadlines normally end stuck
    requests; this catches what they cannot (a client bug, deadlines set longer than the
    patience of the job). Everything not finished is recorded as cancelled.
    """
    stats = engine.stats
    while True:
        await anyio.sleep(min(1.0, limit_s / 4))
        now = perf_counter_ns()
        last = max(stats.last_progress_ns, pool.last_read_ns, engine.t0_ns)
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
    stats: LiveStats, writer: RecordWriter, quiet: bool, t0_ns: int, log: TextIO
) -> None:
    """Spill records about once a second (in a thread) and redraw the progress line."""
    tty = log.isatty()
    last_line = 0.0
    try:
        while True:
            await anyio.sleep(0.25)
            batch = writer.take_due()
            if batch:
                try:
                    await anyio.to_thread.run_sync(writer.write_part, batch)
                except (OSError, PanicException):  # out of file descriptors: retry later
                    writer.requeue(batch)
            now = time.monotonic()
            if quiet or (not tty and now - last_line < 10):
                continue
            last_line = now
            line = progress_line(stats, (perf_counter_ns() - t0_ns) / 1e9)
            print(f"\r{line}\x1b[K" if tty else line, end="" if tty else "\n", file=log, flush=True)
    finally:
        if tty and not quiet:
            print(file=log)


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


def recover(run_dir: Path) -> int:
    """Finish a run that was killed: join its record parts into `records.parquet`, mark
    `run.json` interrupted. Returns the number of records kept. A finished run is left as is.
    """
    from loadgen.records import PARTS_DIR, RECORDS_FILE, read_parts, write_parquet_atomic

    info_path = run_dir / "run.json"
    if not info_path.exists():
        raise LoadgenError(f"{run_dir} has no run.json: not a run folder")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    parts = run_dir / PARTS_DIR
    if (run_dir / RECORDS_FILE).exists() and not parts.exists():
        return int(info.get("planned", 0)) if info.get("finished") else 0
    frame = read_parts(parts) if parts.exists() else None
    if frame is None:
        raise LoadgenError(f"{run_dir} has neither records.parquet nor records.parts")
    write_parquet_atomic(frame, run_dir / RECORDS_FILE)
    for part in parts.glob("part-*.parquet"):
        part.unlink()
    for leftover in parts.glob(".*.tmp"):  # a part being written when the run was killed
        leftover.unlink()
    parts.rmdir()
    write_json_atomic(info_path, {**info, "interrupted": True, "recovered": True})
    return frame.height
