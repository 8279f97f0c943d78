"""The run folder: the one owner of its file names, its layout, its reads and the schema version.

A run folder (`<store>/<run-id>/`) holds `run.json` (what was run: the resolved spec, seed,
target, t0 anchor, how it stopped), `records.parquet` (or `records.parts/` while it runs,
with one heartbeat file per engine process), `summary.json`, `histograms.parquet`,
`server_metrics.parquet` (or `server_metrics.parts/`), `loadgen.log`, `run.lock` while a
run or a recovery writes it, `sim-trace.jsonl` under `--sim-trace`, and
`server-spans.parquet` (or `server-spans.parts/`) under `--otlp-receiver` or
`report --spans`. Everything the
reports show is recomputable from records plus run.json. The stop statuses live here, with
their exit codes (defined in `loadgen.errors`), because summary.json's `verdict` carries them.

Every file name of a run folder (and of the folders `report` and `capacity` write) is
defined here and nowhere else. This module reads; `loadgen.results.write` is the only code
that writes, each write to a temp name renamed into place. The two are apart so that
`analysis/` and `render/` can read a folder but cannot write one: an import-linter contract
forbids them `loadgen.results.write` (pyproject.toml), and a test scans their sources for
file-writing calls (tests/project/test_quality.py).

run.json and summary.json are typed in memory (`RunInfo` below, `results.summary.Summary`)
and JSON only at the folder's edge, through `loadgen.codec`: `read_run_info` /
`read_summary` here and `results.write`'s `write_run_info` / `write_summary` are the only
code that reads or writes them.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from loadgen.codec import OMIT_NONE, from_json, to_json
from loadgen.errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_WATCHDOG, LoadgenError
from loadgen.measures import SLO_MEASURES
from loadgen.results.records import OUTCOMES, SCHEMA, Outcome, empty_frame, with_all_columns
from loadgen.results.summary import AskedLoad, CacheWarmth, ScrapeAccess, Summary
from loadgen.workload.identity import identity_of_run
from loadgen.workload.spec import METRICS_MS, ArrivalSpec, SloTargets

# --- the names --------------------------------------------------------------------------
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
RECORDS_FILE = "records.parquet"
PARTS_DIR = "records.parts"  # while the run lasts: parts, heartbeats
DAMAGED_DIR = "records.damaged"  # parts `report --recover` could not read, kept aside
HEARTBEAT = "heartbeat"  # in PARTS_DIR, one per engine process: `heartbeat`, `heartbeat-w000`
PART_GLOB = "part-*.parquet"  # a parts folder's complete parts (temp names start with a dot)
WARM_UP_FILE = ".warm-up.parquet"  # written and removed at once, to start polars' I/O
HISTOGRAMS_FILE = "histograms.parquet"
SERVER_METRICS_FILE = "server_metrics.parquet"
SERVER_PARTS_DIR = "server_metrics.parts"  # while the run lasts: the scraper's spilled rows
RUN_LOG = "loadgen.log"
LOCK_FILE = "run.lock"
SIM_TRACE_FILE = "sim-trace.jsonl"  # the built-in simulator's trace (`--sim-trace`)
SPANS_FILE = "server-spans.parquet"  # the server's spans, one row each (`results.spans`)
SPANS_PARTS_DIR = "server-spans.parts"  # while the run lasts: each OTLP body as it came
SHARDS_DIR = "shards"  # `run --ray`: each shard's own run folder, `shards/<index>/`
# What a run has measured once it exists: a folder without any of these is an unstarted run.
MEASURED = (RUN_FILE, PARTS_DIR, SERVER_PARTS_DIR, RECORDS_FILE)
# `loadgen report`'s folder (`<run>/report/` unless --out) and `report <store>`'s
REPORT_DIR = "report"
REPORT_HTML = "report.html"
REPORT_MD = "report.md"
ROLLING_REPORT_DIR = "rolling-report"  # in the current folder, never in the store
ROLLING_FILE = "rolling.json"
ROLLING_HTML = "rolling.html"
ROLLING_MD = "rolling.md"
# `loadgen capacity`'s folder
CAPACITY_FILE = "capacity.json"
KNEE_PLOT = "knee.png"


def part_name(index: int) -> str:
    """A one-process run's `index`-th records part (from 1)."""
    return f"part-{index:06d}.parquet"


def worker_part_name(worker: int, index: int) -> str:
    """Worker `worker`'s `index`-th records part: workers never collide in one folder."""
    return f"part-w{worker:03d}-{index:06d}.parquet"


def worker_heartbeat(worker: int) -> str:
    """Worker `worker`'s heartbeat file in PARTS_DIR."""
    return f"{HEARTBEAT}-w{worker:03d}"


def worker_scratch_dir(worker: int) -> str:
    """The folder a worker's writer warms up in, beside the parts (removed at once)."""
    return f".worker-{worker}"


def server_part_name(index: int) -> str:
    """The `index`-th part (from 0) the scraper spilled to SERVER_PARTS_DIR."""
    return f"part-{index:06d}.parquet"


def failed_log_path(run_dir: Path) -> Path:
    """Where an unstarted run's log is kept once its folder is removed: beside it."""
    return run_dir.parent / f"{run_dir.name}.failed.log"


def figure_file(name: str) -> str:
    """A report's figure, one PNG per figure beside report.md."""
    return f"{name}.png"


def rolling_plot_file(metric: str) -> str:
    """`report <store>`'s plot of one metric over the windows."""
    return f"rolling-{metric}.png"


def pack_run_folder(run_dir: Path) -> bytes:
    """A run folder as one tar (uncompressed: parquet is compressed already), to carry it
    between hosts (`run --ray` brings each shard's folder back this way); its lock and
    heartbeats are left out (they belong to the live run on its host)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(run_dir.rglob("*")):
            if path.is_file() and path.name != LOCK_FILE and not path.name.startswith(HEARTBEAT):
                tar.add(path, arcname=str(path.relative_to(run_dir)), recursive=False)
    return buffer.getvalue()


def is_run_folder(path: Path) -> bool:
    """A folder with a run.json (else, for `report`, a results store)."""
    return (path / RUN_FILE).exists()


def has_records(run_dir: Path) -> bool:
    """Records joined, or the parts of a run that never finished."""
    return (run_dir / RECORDS_FILE).exists() or (run_dir / PARTS_DIR).is_dir()


SLO_FIELDS = (*METRICS_MS, "percentile", "confidence")  # SloTargets' fields, as run.json keys


LAG_RULE_SCHEMA = 20  # run.json's lag_bound_ms is a strict bound from this schema on
SCHEMA_VERSION = 24  # 24: summary.json classes.*.ttft_split (additive): where TTFT went by
# the server's account (send lag, outside the engine, intake, queue, prefill; analysis.split)
# (23: the server's spans (additive): summary.json server_spans (the
# join's source, counts, rate, what was left, clocks); server-spans.parquet in the run folder)
# (22: trace context (additive): run.json workload.spec.target traceparent, tracestate)
# (21: the server's account (additive): records traceparent; the
# server_timings struct and summary.json classes.*.server_timings_ms gain ttft_ms and itl_ms)
# (20: the generator-health rule (additive): summary.json generator.client
# {stamp_error_ms, as_measured, client_out, stamps_worst, moved}, generator.rate_shortfall,
# rate_shortfall_low and reason; run.json options.lag_bound_ms null unless given (a strict bound))
# (19: delivery (additive): records output_events, output_reads;
# summary.json classes.*.delivery, checks[].coalesced; run.json workload.spec.target
# accept_encoding, path_buffers)
# (18: summary.json classes.*.stream_ends.usage_not_taken (additive):
# usage above what the stream could carry, N counted from the stream)
# (17: bounds on hostile input (additive): records unstamped_chunks,
# unstamped_max_gap_ns (chunks past the stamp cap); summary classes.*.stream_ends
# itl_summarised; run.json server_metrics.dropped_lines (scrape lines past the parse cap))
# (16: runs placed by Ray (additive): run.json shard.clock_offset_ns
# (the shard host's wall clock minus the driver's, measured before t0), shards.shards.*
# clock_offset_ms and node, and a merged run's `ray` block (placement, offsets, lost shards))
# (15: the verdict's confidence (additive): summary.json checks:
# verdict, confidence, low_ms, high_ms, low_open, high_open, needed; slo.verdict,
# attainment_low/_high, targets.confidence; trajectory verdict, attainment_low/_high,
# needed; models.*.verdict; verdict.rule and status `inconclusive` (exit 7); run.json
# options.verdict and workload.spec.classes.*.slo.confidence (`passed` and `met` still
# mean met)
# (14: run.json cache and workload.spec.cache, summary.json cache;
# records usage_output_tokens, counted_output_tokens, usage_problem (chunk_tokens Int64);
# summary classes.*.stream_ends usage_disagrees, usage_over_counted, usage_problems; run.json
# workload.spec.target allow_early_stops, request_id_body)
# (13: run.json server_metrics.access and summary.json server.access
# (how the metrics endpoint was asked: header names and their source, failures by kind, the
# classified problem), run.json workload.spec.target.server_metrics_headers (names only)
# (12: summary generator.asked (per class, the load asked in its unit))
# (11: run.json workload.identity.scheme (2: agent classes hash their
# context mode; older agent identities are re-derived from the stored spec))
# (10: records cached_prompt_tokens, server_request_id; summary.json
# server and classes.*.prefix_cache; run.json server_metrics; server_metrics.parquet)
# (9: records' model column; summary classes.*.models (a model mix) and
# trajectory.per_hop; run.json spec classes' dataset, prompt sets, models and agent context)
# (8: summary.json cost, run.json options.price_per_hour/replicas (with a price))
# (7: records connection, run.json connections, summary connections)
# (6: summary classes.*.stream_ends, generator.requested_rate_per_s; records
# request_id_sent, finish_reason, stopped_early; run.json target request_id_header/_format)
# (5: run.json workload.spec.classes.*.limits (max_event_bytes))
# 4: verdict.status (a stopped run is no verdict), not_sent outcome,
# run.json stopped/watchdog/workload.identity
# 3: adapters (visible-token TTFT, server timings), workers/shards
# (run.json workers, shard, t0.measured_unix_ns)
# 2: client_error outcome, generator.client_errors, host.open_files_limit


def new_run_id(name: str) -> str:
    """`20261129T101500Z-chat-smoke-1a2b`: sortable, unique, readable."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "run"
    return f"{stamp}-{slug}-{secrets.token_hex(2)}"


def read_summary(run_dir: Path) -> Summary:
    """`summary.json` of a run folder; a LoadgenError when it is missing or malformed."""
    path = run_dir / SUMMARY_FILE
    try:
        return from_json(Summary, json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise LoadgenError(f"{run_dir} has no {SUMMARY_FILE}") from None
    except (OSError, ValueError, TypeError) as exc:
        raise LoadgenError(f"cannot read {path}: {exc}") from None


def read_run_info(run_dir: Path) -> RunInfo:
    """`run.json` of a run folder; a LoadgenError when the folder is not a run.

    A run.json without `run_id` takes the folder's name.
    """
    path = run_dir / RUN_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LoadgenError(f"{run_dir} is not a run folder: it has no run.json") from None
    except (OSError, ValueError) as exc:
        raise LoadgenError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise LoadgenError(f"{path} does not hold a JSON object")
    try:
        return from_json(RunInfo, {"run_id": run_dir.name, **data})
    except (ValueError, TypeError) as exc:
        raise LoadgenError(f"{path}: not a loadgen run.json ({exc})") from None


# How a run can stop before its end, and the exit code that says so (`verdict.status`).
STOPS: Mapping[str, int] = {
    "interrupted": EXIT_INTERRUPTED,  # Ctrl-C or SIGTERM: sending stopped, the rest recorded
    "watchdog": EXIT_WATCHDOG,  # nothing progressed for --watchdog seconds
    "incomplete": EXIT_INCOMPLETE,  # killed outright (SIGKILL, OOM); `report --recover`
}


# --- run.json ----------------------------------------------------------------------------
# Blocks written since schema 1 may be absent from older files: they read as None and are
# left out again when such a file is rewritten (`OMIT_NONE`). `shard`, `stopped` and
# `watchdog` are written as null when they do not apply.


@dataclass(frozen=True, slots=True, kw_only=True)
class T0:
    """The run's t0 on both clocks: the monotonic `perf_counter_ns` every record's times
    count from (None for a merged run: its shards had a clock each), and the wall clock."""

    perf_counter_ns: int | None = None
    unix_ns: int
    utc: str = ""
    measured_unix_ns: int | None = field(default=None, metadata=OMIT_NONE)  # read at t0
    reached_late_ms: float | None = field(default=None, metadata=OMIT_NONE)  # woke this late


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadInfo:
    """The workload as run: its name, file, resolved spec (`dataclasses.asdict` of the
    WorkloadSpec, header values left out) and identity (`workload.identity`)."""

    name: str = ""
    source: str | None = None
    spec: Mapping[str, Any] = field(default_factory=dict)
    identity: Mapping[str, Any] | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsInfo:
    """How the run verified the target and proved itself (run.json's `target.tls`)."""

    verify: bool = True  # False: --insecure, no certificate was verified
    trust: str = ""  # the CAs trusted: `the system store`, `--cacert FILE`, SSL_CERT_FILE=...
    client_certificate: str | None = None  # --cert's file (mutual TLS), or None


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetInfo:
    """Where the requests went (the URL redacted of credentials) and with which API; for
    an https target (or any TLS flag) its TLS, and the forward proxy on the way, if any."""

    url: str | None = None
    api: str | None = None
    model: str | None = None
    builtin_sim: bool = False
    sim_args: tuple[str, ...] | None = None
    tls: TlsInfo | None = field(default=None, metadata=OMIT_NONE)
    proxy: str | None = field(default=None, metadata=OMIT_NONE)  # `http://host:port (SOURCE)`


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """The command line's options that shaped the run (run.json's `options`)."""

    max_in_flight: int | None = None
    # `--lag-bound-ms`: a strict bound on the send-lag p99 when given (schema 19; before, a
    # 5 ms default of the older rule, which a re-audit no longer applies: `RunInfo`)
    lag_bound_ms: float | None = None
    grace_s: float = 5.0
    # `--price-per-hour` (one replica's, or the fleet's) and `--replicas`: the summary's cost
    price_per_hour: float | None = field(default=None, metadata=OMIT_NONE)
    replicas: int | None = field(default=None, metadata=OMIT_NONE)
    # `--verdict`: how the checks were judged (`interval`, `point`); None: a run written
    # before, judged by its point estimates (`RunInfo.verdict_rule`)
    verdict: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardInfo:
    """The share of the schedule this run sent (`--shard i/N`), its agreed start, and (at
    its end) its t0 anchor and that anchor's skew from the agreed start."""

    index: int
    count: int
    start_at_unix_ns: int | None = None
    start_at_utc: str | None = None
    t0_unix_ns: int | None = field(default=None, metadata=OMIT_NONE)
    t0_skew_ms: float | None = field(default=None, metadata=OMIT_NONE)
    # This host's wall clock minus the clock the start was agreed on (a Ray run's driver),
    # measured before t0: the shard waits for start + offset on its own clock, and `merge`
    # subtracts it from the anchor. None: not measured (the hosts' clocks taken as one).
    clock_offset_ns: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostInfo:
    """The machine the client ran on."""

    hostname: str | None = None
    platform: str | None = None
    python: str | None = None
    cpus: int | None = None
    open_files_limit: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionCounts:
    """Connections of one engine process (or all of them, summed): warmed before t0
    (`--warm-connections`), and opened during the run (each one's setup is inside the
    latency of the request that opened it; the records' `connection` column says which)."""

    warm_requested: int = 0
    warm_opened: int = 0  # connected and checked usable before t0
    warm_failed: int = 0
    warm_s: float = 0.0  # how long warming took (the slowest process)
    opened_during_run: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessInfo:
    """One engine process's share of the run: its records, send lag and t0 skew."""

    index: int
    pid: int | None = None
    exit_code: int | None = None
    records: int = 0
    lag_ms_p99: float | None = None
    late_share: float | None = None
    fell_behind: bool = False
    t0_skew_us: float | None = None
    reached_late_ms: float | None = None
    shard: int | None = field(default=None, metadata=OMIT_NONE)  # a merged run's shard
    connections: ConnectionCounts | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkersInfo:
    """How many engine processes ran, why, and each one's share."""

    count: int = 1
    chosen: str = ""
    processes: tuple[ProcessInfo, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRow:
    """One shard of a merged run: where it ran and how far its t0 was from the agreed start."""

    index: int
    run_id: str
    host: str | None
    planned: int
    records: int
    t0_unix_ns: int
    skew_ms: float
    reached_late_ms: float | None
    interrupted: bool
    fell_behind: bool
    clock_offset_ms: float | None = field(default=None, metadata=OMIT_NONE)  # measured
    node: str | None = field(default=None, metadata=OMIT_NONE)  # where Ray placed it


@dataclass(frozen=True, slots=True, kw_only=True)
class RayShard:
    """One shard of a run placed by Ray: its node, its clock, how it ended."""

    index: int
    node_id: str | None = None
    node_ip: str | None = None
    clock_offset_ms: float | None = None  # the node's wall clock minus the driver's
    clock_rtt_ms: float | None = None  # the round trip of the sample the offset came from
    outcome: str = "ok"  # ok, interrupted, killed (its process), lost (its node), refused
    reason: str | None = None  # what happened, when not ok
    exit_code: int | None = None  # its `loadgen run` process's, when it ended


@dataclass(frozen=True, slots=True, kw_only=True)
class RayInfo:
    """run.json's `ray` (`run --ray`): the cluster, how the shards were placed and
    timed, and each shard's node, clock offset and end."""

    address: str
    started_local: bool
    strategy: str  # STRICT_SPREAD (one shard per node) or SPREAD (fewer nodes than shards)
    nodes_alive: int
    max_clock_skew_ms: float
    before_t0_s: float | None = None  # connect, place, spawn, ready, clocks: until t0
    after_run_s: float | None = None  # the last shard's end to the merged folder
    shards: tuple[RayShard, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardTable:
    """A merged run's shards, and the spread of their t0 anchors (`loadgen merge`)."""

    count: int
    start_at_unix_ns: int
    spread_ms: float
    max_abs_skew_ms: float
    shards: tuple[ShardRow, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedClass:
    """A class of the workload as run.json's resolved spec records it: what the re-audit
    judges it by."""

    name: str
    kind: str = "chat"
    slo: SloTargets = field(default_factory=SloTargets)
    has_turns: bool = False  # multi-turn sessions
    batch_deadline_s: float | None = None
    concurrency: int | None = None
    trajectory_budget_s: float | None = None
    requested_rate_per_s: float | None = None  # single open-loop requests' asked rate
    asked: AskedLoad | None = None  # what was asked, in the class's unit (None: unknown)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerMetricsInfo:
    """run.json's `server_metrics`: the endpoint scraped and how the scraping went (counts
    are None until the run's end writes them: a killed run's are recomputed from the file)."""

    url: str
    interval_s: float
    scrapes: int | None = None
    failures: int | None = None
    malformed_lines: int | None = None
    last_error: str | None = None
    # Lines past the scraper's parse cap, not parsed (a known server's metrics are kept).
    dropped_lines: int | None = None
    # How the scraper asked and why it was refused (schema 12; None: written before).
    access: ScrapeAccess | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """run.json: what was run (the resolved spec, seed, target, options, host), its t0
    anchor, its processes, and how it ended. Enough, with the records, to recompute every
    figure, and to rebuild the run's plan (`results.recover`)."""

    run_id: str
    schema_version: int | None = field(default=None, metadata=OMIT_NONE)
    loadgen_version: str | None = field(default=None, metadata=OMIT_NONE)
    seed: int | None = field(default=None, metadata=OMIT_NONE)
    planned: int | None = field(default=None, metadata=OMIT_NONE)
    workload: WorkloadInfo | None = field(default=None, metadata=OMIT_NONE)
    target: TargetInfo | None = field(default=None, metadata=OMIT_NONE)
    options: RunSettings | None = field(default=None, metadata=OMIT_NONE)
    shard: ShardInfo | None = None
    host: HostInfo | None = field(default=None, metadata=OMIT_NONE)
    workers: WorkersInfo | None = field(default=None, metadata=OMIT_NONE)
    t0: T0 | None = field(default=None, metadata=OMIT_NONE)
    interrupted: bool = False
    finished: bool = True  # False: the run never wrote its end (killed, or still running)
    stopped: str | None = None  # a key of `STOPS`, or None: it ran to its end
    watchdog: str | None = None  # what the run waited for when the watchdog stopped it
    shards: ShardTable | None = field(default=None, metadata=OMIT_NONE)  # a merged run
    recovered: bool | None = field(default=None, metadata=OMIT_NONE)  # `report --recover`
    client_failure: str | None = field(default=None, metadata=OMIT_NONE)
    connections: ConnectionCounts | None = field(default=None, metadata=OMIT_NONE)
    server_metrics: ServerMetricsInfo | None = field(default=None, metadata=OMIT_NONE)
    cache: CacheWarmth | None = field(default=None, metadata=OMIT_NONE)  # mode, nonce, reset
    ray: RayInfo | None = field(default=None, metadata=OMIT_NONE)  # placed by Ray (`--ray`)

    @property
    def stop(self) -> str | None:
        """How the run stopped before its end (a key of `STOPS`), or None.

        `interrupted`: Ctrl-C or SIGTERM (a second one exits before the run writes its end,
        and `report --recover` keeps it interrupted); `incomplete`: killed outright
        (`finished: false`: it never wrote its end) or recovered from its parts; `watchdog`:
        stopped by it. Runs written before `stopped` was recorded are read from
        `interrupted` and `finished`.
        """
        if self.stopped == "interrupted":
            return "interrupted"
        if self.recovered or not self.finished:
            return "incomplete"
        if self.stopped in STOPS:
            return self.stopped
        if self.watchdog:
            return "watchdog"
        return "interrupted" if self.interrupted else None

    @property
    def verdict_rule(self) -> str:
        """How the run's checks are judged (`--verdict`): as recorded, else `point`, the
        rule every run was judged by before the verdict had a confidence (schema 14 and
        older), so a re-audit of such a run says what the run said."""
        recorded = self.options.verdict if self.options is not None else None
        return recorded or "point"

    @property
    def path_buffers(self) -> bool:
        """The workload said its path buffers (`target.path_buffers`, `--path-buffers`):
        streams that arrived coalesced are judged as observed (`analysis.delivery`)."""
        spec = self.workload.spec if self.workload else {}
        return bool((spec.get("target") or {}).get("path_buffers", False))

    @property
    def lag_bound_ms(self) -> float | None:
        """`--lag-bound-ms` as the run was given it (None: no strict bound). A run written
        before schema 20 recorded the older rule's 5 ms default whether given or not: it is
        re-audited by the generator-health rule alone (`analysis.health`)."""
        if (self.schema_version or 0) < LAG_RULE_SCHEMA:
            return None
        return (self.options or RunSettings()).lag_bound_ms

    def classes(self) -> dict[str, RecordedClass]:
        """Each class of the resolved spec, in order (ValueError for an impossible SLO)."""
        spec = self.workload.spec if self.workload else {}
        return {str(name): _recorded_class(str(name), raw)
                for name, raw in (spec.get("classes") or {}).items()}  # fmt: skip

    def slos(self) -> dict[str, SloTargets]:
        """Each class's SloTargets as run.json recorded them."""
        return {name: cls.slo for name, cls in self.classes().items()}

    def identity(self) -> dict[str, Any]:
        """The run's workload identity (`workload.identity.identity_of_run`): what the
        results store pools by. LoadgenError for a spec this loadgen cannot rebuild."""
        return identity_of_run(to_json(self))


def _recorded_class(name: str, raw: Mapping[str, Any]) -> RecordedClass:
    slo = raw.get("slo") or {}
    return RecordedClass(
        name=name,
        kind=str(raw.get("kind", "chat")),
        slo=SloTargets(**{k: slo[k] for k in SLO_FIELDS if slo.get(k) is not None}),
        has_turns=raw.get("turns") is not None,
        batch_deadline_s=raw.get("batch_deadline_s"),
        concurrency=raw.get("concurrency"),
        trajectory_budget_s=raw.get("trajectory_budget_s"),
        requested_rate_per_s=_requested_rate(raw),
        asked=_asked(raw),
    )


def _requested_rate(raw: Mapping[str, Any]) -> float | None:
    """The rate a recorded class of single open-loop requests asked for (see ArrivalSpec):
    chat or summarization, not sessions (turns, or a dataset's conversations replayed
    whole), trajectories, a closed loop or a trace (`AskedLoad.of`)."""
    asked = _asked(raw)
    if asked is None or asked.unit != "requests":
        return None
    return _mean_rate(raw)


def _asked(raw: Mapping[str, Any]) -> AskedLoad | None:
    """What a recorded class asked for (`AskedLoad.of`); None when run.json cannot say."""
    arrival = raw.get("arrival")
    if not isinstance(arrival, Mapping) or not isinstance(arrival.get("process"), str):
        return None
    dataset = raw.get("dataset")
    replayed = isinstance(dataset, Mapping) and dataset.get("turns") == "all"
    concurrency = raw.get("concurrency")
    return AskedLoad.of(
        kind=str(raw.get("kind", "chat")), sessions=raw.get("turns") is not None or replayed,
        concurrency=concurrency if isinstance(concurrency, int) else None,
        process=arrival["process"], mean_rate_per_s=_mean_rate(raw),
    )  # fmt: skip


def _mean_rate(raw: Mapping[str, Any]) -> float | None:
    """A recorded class's arrival process's long-run mean rate (see ArrivalSpec)."""
    arrival = raw.get("arrival")
    if not isinstance(arrival, Mapping) or not isinstance(arrival.get("process"), str):
        return None
    try:
        spec = ArrivalSpec(
            process=arrival["process"],
            rate_per_s=float(arrival.get("rate_per_s") or 0.0),
            on_rate_per_s=float(arrival.get("on_rate_per_s") or 0.0),
            off_rate_per_s=float(arrival.get("off_rate_per_s") or 0.0),
            on_mean_s=float(arrival.get("on_mean_s") or 0.0),
            off_mean_s=float(arrival.get("off_mean_s") or 0.0),
            steps=tuple((float(r), float(d)) for r, d in arrival.get("steps") or ()),
        )
        return spec.mean_rate_per_s
    except (TypeError, ValueError, ZeroDivisionError):
        return None


# --- server_metrics.parquet ----------------------------------------------------------------
# What the server's /metrics said during the run (`loadgen run --server-metrics-url`): one row
# per sample per scrape. `t_ns` is the scrape's start, ns since t0 on the records' clock;
# `labels` a list of {name, value} (Parquet's map layout); histograms and summaries are kept
# as their `_bucket`/`_sum`/`_count` series. While the run lasts the rows are spilled to
# `server_metrics.parts/` with `mono_ns` (the monotonic clock; t0 may not be chosen yet).

LABELS_DTYPE = pl.List(pl.Struct({"name": pl.String(), "value": pl.String()}))
SERVER_METRICS_SCHEMA: dict[str, pl.DataType] = {
    "t_ns": pl.Int64(),
    "name": pl.String(),
    "labels": LABELS_DTYPE,
    "value": pl.Float64(),
}
SERVER_PART_SCHEMA = {
    "mono_ns": pl.Int64(),
    **{k: v for k, v in SERVER_METRICS_SCHEMA.items() if k != "t_ns"},
}


def server_rows_frame(
    rows: Sequence[tuple[int, str, Sequence[tuple[str, str]], float]],
) -> pl.DataFrame:
    """Scraped rows `(mono_ns, name, labels, value)` as a part frame.

    The labels are built from flat columns (the row each belongs to, names, values), not a
    dict per label: 500,000 rows of 8 labels as dicts took gigabytes at the spill."""
    lengths = pl.Series([len(r[2]) for r in rows], dtype=pl.Int64)
    owners = pl.select(pl.int_range(len(rows), dtype=pl.UInt32).repeat_by(lengths).explode())
    flat = {
        "row": owners.to_series().drop_nulls(),  # a row without labels explodes to a null
        "name": [k for r in rows for k, _ in r[2]],
        "value": [v for r in rows for _, v in r[2]],
    }
    labels = (
        pl.DataFrame(flat, schema={"row": pl.UInt32(), "name": pl.String(), "value": pl.String()})
        .group_by("row", maintain_order=True)
        .agg(pl.struct("name", "value").alias("labels"))
    )
    columns = {"mono_ns": [r[0] for r in rows], "name": [r[1] for r in rows],
               "value": [r[3] for r in rows]}  # fmt: skip
    frame = pl.DataFrame(columns, schema={k: SERVER_PART_SCHEMA[k] for k in columns})
    return (
        frame.with_row_index("row")
        .join(labels, on="row", how="left")
        .select("mono_ns", "name", pl.col("labels").fill_null(pl.lit([], LABELS_DTYPE)), "value")
    )


def read_server_metrics(run_dir: Path) -> pl.DataFrame | None:
    """A run's scraped server metrics, or None when it has none."""
    path = run_dir / SERVER_METRICS_FILE
    if not path.exists():
        return None
    return read_parquet(path)


# --- records and histograms -------------------------------------------------------------


def read_parquet(path: Path) -> pl.DataFrame:
    """One Parquet file, read as that file: never as a pattern (polars reads a path as a glob
    by default, so `runs[prod]/…` would match nothing and `runs*/…` every run of that name),
    and a LoadgenError naming it when it is not a readable Parquet file (truncated, garbage).
    Records, histograms and server metrics are read here; every other read passes
    `glob=False` itself (tests/project/test_quality.py finds one that does not)."""
    try:
        return pl.read_parquet(path, glob=False)
    except (OSError, pl.exceptions.PolarsError) as exc:
        reason = str(exc).split("\n", 1)[0]
        raise LoadgenError(f"cannot read {path}: not a readable Parquet file ({reason})") from None


# Records columns without which a frame is no records at all (`conform_records`).
REQUIRED_COLUMNS = ("request_id", "class", "intended_ns", "outcome")


def conform_records(frame: pl.DataFrame, path: Path) -> pl.DataFrame:
    """`frame`, read from `path`, as records: the `SCHEMA` columns in order (those an older run
    lacks as nulls), each of its dtype; a LoadgenError naming the file and the column when it
    is no records file (a column missing or of another type, an outcome loadgen never wrote)."""
    missing = [name for name in REQUIRED_COLUMNS if name not in frame.columns]
    if missing:
        raise LoadgenError(f"{path} is not a records file: it has no {', '.join(missing)} column"
                           f" (its columns: {', '.join(frame.columns)[:200]})")  # fmt: skip
    casts = []
    for name, dtype in SCHEMA.items():
        have = frame.schema.get(name)
        if have is None or have == dtype:
            continue
        if name == "server_timings" and isinstance(have, pl.Struct):
            continue  # an older run's timings have fewer fields: read as they are
        try:
            casts.append(frame.get_column(name).cast(dtype, strict=True))
        except (pl.exceptions.PolarsError, TypeError):
            raise LoadgenError(
                f"{path} is not a records file: its column {name} holds {have}, not {dtype}"
            ) from None
    frame = with_all_columns(frame.with_columns(casts) if casts else frame)
    unknown = set(frame.get_column("outcome").unique().drop_nulls()) - set(OUTCOMES)
    if unknown or frame.get_column("outcome").null_count():
        shown = ", ".join(sorted(map(repr, unknown))[:5]) or "null"
        raise LoadgenError(f"{path} is not a records file: outcome {shown} is none of loadgen's")
    return frame.select(list(SCHEMA))


def read_parts(parts_dir: Path) -> pl.DataFrame:
    """Every complete part in a parts folder as one frame (what an interrupted run kept); a
    LoadgenError naming a damaged part (`readable_parts` skips them instead)."""
    frames = [conform_records(read_parquet(p), p) for p in sorted(parts_dir.glob(PART_GLOB))]
    return pl.concat(frames).sort("request_id") if frames else empty_frame()


def readable_parts(parts_dir: Path) -> tuple[pl.DataFrame, dict[str, str]]:
    """Every readable part in a parts folder as one frame, and each other part's name with
    why it was skipped (unreadable, or no records: a damaged part costs its own records)."""
    frames, skipped = [], {}
    for part in sorted(parts_dir.glob(PART_GLOB)):
        try:
            frames.append(conform_records(read_parquet(part), part))
        except LoadgenError as exc:
            skipped[part.name] = str(exc)
    return (pl.concat(frames).sort("request_id") if frames else empty_frame()), skipped


def read_records(run_dir: Path) -> pl.DataFrame:
    """A run's records: `records.parquet`, or the parts of a run that never finished; a
    LoadgenError naming the file when it is damaged."""
    path = run_dir / RECORDS_FILE
    if path.exists():
        return conform_records(read_parquet(path), path)
    return read_parts(run_dir / PARTS_DIR)


# histograms.parquet's columns: one per measure a target can be set on (`analysis.minutes`)
HISTOGRAM_METRICS: tuple[str, ...] = tuple(m.name for m in SLO_MEASURES)


def load_histograms(run_dir: Path, counts: Sequence[str]) -> pl.DataFrame | None:
    """A run's per-minute histograms (`analysis.minutes`), or None when it has no readable
    file with the columns. A count of `counts` absent from the file (an outcome added to
    `records.OUTCOMES` since) reads as 0."""
    path = run_dir / HISTOGRAMS_FILE
    if not path.exists():
        return None
    try:
        minutes = read_parquet(path)
    except LoadgenError:
        return None
    required = ("class", "minute_start_unix_ns", "requests", Outcome.OK.value, "meets_slo")
    if any(name not in minutes.columns for name in (*required, *HISTOGRAM_METRICS)):
        return None
    absent = [name for name in counts if name not in minutes.columns]
    return minutes.with_columns(pl.lit(0, pl.Int64).alias(name) for name in absent)
