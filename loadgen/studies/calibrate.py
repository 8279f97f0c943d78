"""How much load this machine's client can measure truthfully: the calibrated envelope.

A side stage next to the engine: `loadgen calibrate` drives the simulator (with its
ground-truth trace of every chunk write) through the same engine a run uses, at increasing
load levels, and compares every client chunk timestamp with the server's write time. The
envelope is the highest level at which the client's numbers are still the server's. It is
saved per host, and `loadgen run` warns when a workload's expected peak exceeds it.

Load is measured as the client sees it: concurrent streams (sockets open at once) and
chunks per second (≈ tokens per second) arriving; CPU per chunk is what limits the second,
the event loop's polling what limits the first.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import orjson

import loadgen.engine.runner  # noqa: F401  # imported for its import time
from loadgen import __version__
from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.analysis.calibration import Ladder, Level, Thresholds
from loadgen.analysis.live import LiveTally
from loadgen.engine import harness
from loadgen.engine.host import (
    backend_options,
    open_files_limit,
    quiet_gc,
    raise_open_files_limit,
)
from loadgen.engine.runner import Engine, EngineConfig, LiveStats
from loadgen.engine.transport import Pool, make_endpoint
from loadgen.engine.warmup import warm_count
from loadgen.errors import LoadgenError
from loadgen.percentiles import nearest_rank
from loadgen.results.records import RequestRecord
from loadgen.results.runfolder import SIM_TRACE_FILE
from loadgen.run.envelope import Load, host_name
from loadgen.run.live import LiveExporter, LiveRun
from loadgen.run.processes.group import DONE, Child, ProcessGroup, obey_parent, ready_then_wait
from loadgen.run.processes.simulator import running_sim
from loadgen.run.record import RunState
from loadgen.run.terminal import Terminal
from loadgen.workload.plans import RequestPlan
from loadgen.workload.spec import Deadlines

Observe = Callable[[RequestRecord], None]

START_DELAY_NS = 200_000_000  # t0 this far after the engines are ready, as `loadgen run` does


def now_iso() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- measuring one load level ------------------------------------------------------------


def level_plans(streams: int, tokens: int, ramp_s: float) -> list[RequestPlan]:
    """`streams` plans with intended times spread evenly over [0, ramp_s)."""
    step_ns = int(ramp_s * 1e9) // max(streams, 1)
    return [
        RequestPlan(
            request_id=i,
            class_name="calibrate",
            intended_ns=i * step_ns,
            prompt_tokens=8,
            output_tokens=tokens,
            deadlines=Deadlines(),
        )
        for i in range(streams)
    ]


def sim_args(streams: int, tokens_per_s: float) -> list[str]:
    """A simulator with a clean cadence: one token per stream every 1/tokens_per_s, all
    streams in one batch, near-instant prefill, real time."""
    return [
        "--decode-table", f"{1000.0 / tokens_per_s:g}",
        "--max-batch", str(max(streams, 1)),
        "--prefill-tokens-per-s", "100000000",
        "--speed", "1",
    ]  # fmt: skip  # flag/value pairs read better one per line


def run_engine(
    plans: Sequence[RequestPlan], url: str, t0_ns: int, *, observe: Observe | None = None,
    stats: LiveStats | None = None, control: Callable[[Engine], Awaitable[None]] | None = None,
) -> tuple[list[Any], float]:  # fmt: skip
    """Run the plans through the engine harness as `loadgen run` does (uvloop, quiet GC,
    the connections its start needs opened before t0: `--warm-connections auto`), with
    t0 = `t0_ns` (absolute perf_counter_ns); return the records and the CPU s the run
    cost from t0 (warming is before it, in no figure). `observe` sees each record as it
    lands (the live exporter's tally); `control` runs beside the engine (a spawned
    process's parent's commands)."""

    raise_open_files_limit()
    adapter = adapter_for("openai-chat")
    endpoint = make_endpoint(url, adapter.default_path, {})
    # `loadgen-<n>` ids: the comparison finds each request's server writes by its id.
    config = EngineConfig(adapter=adapter, body_options=BodyOptions(model="sim"), seed=0,
                          request_id_format="counter")  # fmt: skip
    records: list[RequestRecord] = []
    keep = records.append

    def observed(record: RequestRecord) -> None:
        keep(record)
        observe(record)  # type: ignore[misc]  # only used when observe is set

    from_s: list[float] = []

    async def session(engine: Engine) -> None:
        await engine.connector.warm(warm_count(engine.work, None, open_files_limit()))
        from_s.append(time.process_time())  # user + system, ns resolution
        beside = () if control is None else (functools.partial(control, engine),)
        await harness.run_beside(engine, t0_ns, *beside)

    with quiet_gc():  # entered here, not by the harness: its collection is not the engine's CPU
        harness.run_engine(plans, Pool(endpoint), config, keep if observe is None else observed,
                           session, stats=stats, quiet=False)  # fmt: skip
        cpu_s = time.process_time() - from_s[0]
    return records, cpu_s


def warm_up() -> None:
    """Import everything the engine needs and start a loop once, before t0 is set (else
    the first sends are late by the imports)."""

    anyio.run(anyio.sleep, 0, backend="asyncio", backend_options=backend_options())


def _engine_process(plans: list[RequestPlan], url: str, conn: Any) -> None:
    """A spawned engine process (a `run.processes.child.Child`: it dies with its parent and
    leaves it the signals): warm up, say ready, wait for t0, run (obeying its parent's stop,
    `run.processes.group.obey_parent`: a stopped level is cancelled at once), send its
    records."""
    warm_up()
    t0_ns = ready_then_wait(conn)
    if t0_ns is None:  # the parent gave up before the start
        return
    state = RunState()

    async def control(engine: Engine) -> None:
        await obey_parent(conn, engine, state, 0.0)

    conn.send((DONE, os.getpid(), run_engine(plans, url, t0_ns, control=control)))
    conn.close()


def run_processes(
    plans: Sequence[RequestPlan], url: str, processes: int, *, observe: Observe | None = None,
    stats: LiveStats | None = None,
) -> tuple[list[Any], float, int]:  # fmt: skip
    """Run the plans on `processes` engine processes (plan i on process i mod N), all with
    one t0 (perf_counter is CLOCK_MONOTONIC, shared by processes on Linux); return every
    record, their summed CPU s, and t0. One process runs in this process. `observe` sees
    each record: as it lands with one process, as its process sends them back with more.
    More processes run as `loadgen run --workers` runs its workers (a
    `run.processes.group.ProcessGroup`): Ctrl-C or SIGTERM stops every one at once, and ends
    the calibration (KeyboardInterrupt, exit 130); a second exits at once."""
    if processes == 1:
        warm_up()
        t0_ns = time.perf_counter_ns() + START_DELAY_NS
        own, own_cpu_s = run_engine(plans, url, t0_ns, observe=observe, stats=stats)
        return own, own_cpu_s, t0_ns
    shares = [(list(plans[k::processes]), url) for k in range(processes)]
    parts: dict[int, tuple[list[Any], float]] = {}

    def keep(child: Child, message: tuple[Any, ...]) -> None:
        if message[0] == DONE:
            parts[child.index] = message[2]

    with ProcessGroup(_engine_process, shares, "loadgen-calibrate", "calibrate engine") as group:
        group.wait_ready()
        t0_ns = time.perf_counter_ns() + START_DELAY_NS
        group.start(t0_ns)
        state = group.supervise(keep, grace_s=0.0, terminal=Terminal(sys.stderr))
    if state.interrupted:
        raise KeyboardInterrupt
    lost = next((child for child in group.children if child.index not in parts), None)
    if lost is not None:
        raise LoadgenError(f"calibrate engine process {lost.index} exited with code "
                           f"{lost.exit_code} (see its error above)")  # fmt: skip
    records = [record for index in sorted(parts) for record in parts[index][0]]
    if observe is not None:
        for record in records:
            observe(record)
    return records, sum(cpu_s for _, cpu_s in parts.values()), t0_ns


def read_trace(path: Path) -> dict[str, list[int]]:
    """The simulator's chunk write times (absolute perf_counter_ns) by X-Request-Id."""
    by_id: dict[str, list[int]] = {}
    with path.open("rb") as lines:
        for line in lines:
            item = orjson.loads(line)
            if item.get("type") == "request" and item.get("x_request_id"):
                by_id[item["x_request_id"]] = item["chunk_ns"]
    return by_id


def host_counters() -> dict[str, float]:
    """vCPU steal s and CPU-pressure stall s ("some" tasks waiting for a CPU) since boot
    (Linux; NaN where unavailable): how busy the machine was with other work."""
    counters = {"steal_s": math.nan, "stall_s": math.nan}
    try:
        cpu = Path("/proc/stat").read_text().splitlines()[0].split()
        counters["steal_s"] = int(cpu[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        counters["stall_s"] = int(some.rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        pass
    return counters


def measure_level(
    streams: int, ladder: Ladder, thresholds: Thresholds, live: LiveExporter | None = None
) -> Level:
    """Start a fresh simulator with its trace, run one level through the engine, compare.
    `live` publishes the level as a run (`calibrate-<streams>`) while it goes."""

    plans = level_plans(streams, ladder.tokens, ladder.ramp_s)
    tally, stats = LiveTally(), LiveStats()
    t0: list[int] = []
    if live is not None:
        labels = {"run_id": f"calibrate-{streams}", "workload": "calibrate", "workload_key": "",
                  "api": "openai-chat", "model": "sim", "version": __version__}  # fmt: skip
        live.begin(LiveRun(labels=labels, tally=tally.snapshot, planned={"calibrate": streams},
                           in_flight=lambda: dict(stats.in_flight_by_class),
                           t0_ns=lambda: t0[0] if t0 else None))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="loadgen-calibrate-") as tmp:
        trace_path = Path(tmp) / SIM_TRACE_FILE
        with running_sim(sim_args(streams, ladder.tokens_per_s), trace_file=trace_path) as sim:
            before = host_counters()
            observe = tally.observe if live is not None else None
            records, cpu_s, t0_ns = run_processes(plans, sim.url, ladder.processes,
                                                  observe=observe, stats=stats)  # fmt: skip
            after = host_counters()
        t0.append(t0_ns)
        if live is not None:
            live.end(tally)
        trace = read_trace(trace_path)  # complete once the simulator has exited
    return compare(streams, ladder, thresholds, records, cpu_s, t0_ns, trace,
                   steal_ms=(after["steal_s"] - before["steal_s"]) * 1e3,
                   cpu_stall_ms=(after["stall_s"] - before["stall_s"]) * 1e3)  # fmt: skip


def compare(
    streams: int,
    ladder: Ladder,
    thresholds: Thresholds,
    records: Sequence[Any],
    cpu_s: float,
    t0_ns: int,
    trace: Mapping[str, Sequence[int]],
    *,
    steal_ms: float = math.nan,
    cpu_stall_ms: float = math.nan,
) -> Level:
    """Every figure of one level: client records (relative to t0) against server writes."""
    errors: list[int] = []
    ttft_errors: list[int] = []
    lags: list[int] = []
    chunks = failed = 0
    for record in records:
        if record.outcome != "ok":
            failed += 1
        if record.dispatched_ns is not None:
            lags.append(record.dispatched_ns - record.intended_ns)
        written = trace.get(f"loadgen-{record.request_id}", ())
        chunks += len(record.chunk_ns)
        errors += [t0_ns + c - w for c, w in zip(record.chunk_ns, written, strict=False)]
        if record.first_token_ns is not None and written:
            ttft_errors.append(t0_ns + record.first_token_ns - written[0])
    err_ms = np.asarray(errors, dtype=np.float64) / 1e6
    figures = {
        "timestamp_err_p50_ms": _pct(err_ms, 50),
        "timestamp_err_p99_ms": _pct(err_ms, 99),
        "timestamp_err_max_ms": float(err_ms.max()) if err_ms.size else math.nan,
        "ttft_err_p99_ms": _pct(np.asarray(ttft_errors, dtype=np.float64) / 1e6, 99),
        "send_lag_p99_ms": _pct(np.asarray(lags, dtype=np.float64) / 1e6, 99),
    }
    expected = streams * ladder.tokens
    misses = [
        label
        for label, key, limit in (
            ("ts p99", "timestamp_err_p99_ms", thresholds.timestamp_p99_ms),
            ("TTFT p99", "ttft_err_p99_ms", thresholds.ttft_p99_ms),
            ("lag p99", "send_lag_p99_ms", thresholds.send_lag_p99_ms),
        )
        if not figures[key] <= limit  # NaN (nothing measured) misses too
    ]
    if failed:
        misses.append(f"{failed} failed")
    if chunks != expected:
        misses.append(f"{chunks} of {expected} chunks")
    return Level(
        streams=streams,
        tokens_per_s=ladder.tokens_per_s,
        processes=ladder.processes,
        chunks_per_s=streams * ladder.tokens_per_s,
        chunks=chunks,
        expected_chunks=expected,
        failed=failed,
        cpu_us_per_chunk=cpu_s / max(chunks, 1) * 1e6,
        steal_ms=steal_ms,
        cpu_stall_ms=cpu_stall_ms,
        load_avg_1m=os.getloadavg()[0],
        misses=tuple(misses),
        **figures,
    )


def _pct(values: np.ndarray, q: float) -> float:
    """The nearest-rank percentile (`loadgen.percentiles.nearest_rank`), as in every figure of
    loadgen; NaN when nothing was measured."""
    if not values.size:
        return math.nan
    rank = nearest_rank(q, values.size)
    return float(np.partition(values, rank - 1)[rank - 1])


# -- the ladder ------------------------------------------------------------------------


def calibrate(
    ladder: Ladder,
    thresholds: Thresholds,
    on_level: Callable[[Level], None] | None = None,
    measure: Callable[[int, Ladder, Thresholds], Level] = measure_level,
) -> dict[str, Any]:
    """Drive the ladder's levels in increasing order; the result as saved (JSON-able).

    The envelope is the highest level such that it and every level below it met every
    threshold (one miss ends it: a level that passes above a miss is luck, not capacity).
    Unless `ladder.all_levels`, the ladder stops at the first miss.
    """
    levels: list[Level] = []
    envelope: Level | None = None
    for streams in sorted(set(ladder.streams)):
        level = measure(streams, ladder, thresholds)
        levels.append(level)
        if on_level is not None:
            on_level(level)
        if level.met and all(lv.met for lv in levels):
            envelope = level
        elif not ladder.all_levels:
            break
    return result_json(ladder, thresholds, levels, envelope)


def result_json(
    ladder: Ladder, thresholds: Thresholds, levels: Sequence[Level], envelope: Level | None
) -> dict[str, Any]:
    """What calibrate saves and prints with --format json (NaN becomes null)."""
    return {
        "host": host_name(),
        "measured_at": now_iso(),
        "cpus": os.cpu_count(),
        "loadgen_version": __version__,
        "processes": ladder.processes,
        "tokens_per_s": ladder.tokens_per_s,
        "stream_s": ladder.stream_s,
        "quick": ladder.quick,
        "ladder": {
            "levels": sorted(set(ladder.streams)),
            "tokens_per_s": ladder.tokens_per_s,
            "stream_s": ladder.stream_s,
            "ramp_s": ladder.ramp_s,
            "processes": ladder.processes,
            "all_levels": ladder.all_levels,
        },
        "thresholds": asdict(thresholds),
        "levels": [_jsonable({**asdict(lv), "met": lv.met}) for lv in levels],
        "envelope": None if envelope is None else asdict(per_process(envelope)),
        "envelope_total": None
        if envelope is None
        else {"streams": envelope.streams, "chunks_per_s": envelope.chunks_per_s},
    }


def per_process(level: Level) -> Load:
    """The level's load on each engine process."""
    return Load(
        streams=level.streams // level.processes,
        chunks_per_s=level.chunks_per_s / level.processes,
    )


def _jsonable(item: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in item.items()
    }
