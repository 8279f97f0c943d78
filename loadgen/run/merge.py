"""`loadgen merge`: the run folders of N shards (`run --shard i/N --start-at T`) as one run.

After the runs, before the reports: the merged folder is an ordinary run folder
(records.parquet, run.json, summary.json, histograms.parquet), so `loadgen report`,
`compare` and the results store's rolling windows read it like any other.

Alignment. Each shard measured on its own monotonic clock, from its own t0; its run.json
keeps the wall-clock time of that t0 (`t0.measured_unix_ns`, read when the clock reached
t0). The merged run's t0 is the agreed start T. Every time column of shard i
(`records.TIME_COLUMNS`: intended, dispatched, sent, headers, first token, first content,
first reasoning, last token, end, every chunk) is shifted by its offset, anchor_i − T, so a
request keeps every latency it measured (both ends move together) and lands on the common
timeline where its host's wall clock put it.
The offsets are the shards' skew; on one host they are µs, across hosts they include the
hosts' clock disagreement, which no client can see: alignment is as good as NTP/PTP. A
shard whose host's clock offset was measured (`run --ray` measures each node's against the
driver before T: run.json `shard.clock_offset_ns`) has it taken out: its anchor on the
driver's clock is anchor_i − clock offset_i, and the shift is that minus T.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from loadgen.analysis.audit import reaudit
from loadgen.errors import LoadgenError
from loadgen.results.records import TIME_COLUMNS
from loadgen.results.runfolder import (
    RECORDS_FILE,
    SCHEMA_VERSION,
    SERVER_METRICS_FILE,
    SUMMARY_FILE,
    T0,
    RayInfo,
    RunInfo,
    ShardInfo,
    ShardRow,
    ShardTable,
    WorkersInfo,
    new_run_id,
    read_records,
    read_run_info,
    read_server_metrics,
    read_summary,
)
from loadgen.results.write import (
    make_run_folder,
    write_audit,
    write_records,
    write_run_info,
    write_server_metrics,
)
from loadgen.run.record import RunResult
from loadgen.workload.shards import utc_text


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardRun:
    """One shard's run folder, read."""

    run_dir: Path
    info: RunInfo
    frame: pl.DataFrame
    fell_behind: bool

    @property
    def shard(self) -> ShardInfo:
        """run.json's `shard` block (`problems` refuses a folder without one)."""
        if self.info.shard is None:
            raise LoadgenError(f"{self.run_dir}: not a shard")
        return self.info.shard

    @property
    def anchor_unix_ns(self) -> int:
        """The wall-clock time of this shard's t0 (measured at t0 when it was)."""
        if self.info.t0 is None:
            raise LoadgenError(f"{self.run_dir}: run.json has no t0")
        return int(self.info.t0.measured_unix_ns or self.info.t0.unix_ns)

    @property
    def clock_offset_ns(self) -> int:
        """Its host's wall clock minus the agreed start's (0: not measured)."""
        return self.shard.clock_offset_ns or 0

    @property
    def aligned_anchor_ns(self) -> int:
        """Its t0 anchor on the clock the start was agreed on."""
        return self.anchor_unix_ns - self.clock_offset_ns

    @property
    def planned(self) -> int:
        """Requests its run.json says it planned (its records, for a run.json without)."""
        return self.frame.height if self.info.planned is None else self.info.planned


def spec_hash(info: RunInfo) -> str:
    """A short hash of the resolved workload as run (without its file path)."""
    spec = dict(info.workload.spec if info.workload else {})
    spec.pop("source", None)
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_shard(run_dir: Path) -> ShardRun:
    """A shard folder's run.json, records and verdict (LoadgenError if it is not a run)."""

    info = read_run_info(run_dir)
    if not (run_dir / RECORDS_FILE).exists():
        raise LoadgenError(
            f"{run_dir} has no {RECORDS_FILE}: if that shard was killed, run "
            f"`loadgen report --recover {run_dir}` first"
        )
    fell_behind = (run_dir / SUMMARY_FILE).exists() and read_summary(run_dir).verdict.fell_behind
    return ShardRun(run_dir=run_dir, info=info, frame=read_records(run_dir),
                    fell_behind=fell_behind)  # fmt: skip


def uncovered(shard: ShardRun) -> str | None:
    """What is wrong when a shard's records are not one per request it planned, or None.

    A run writes records.parquet only once every plan has its record (a killed one has
    none until `report --recover` gives each unrecorded plan one), so a records file with
    fewer (or repeated) request ids than run.json's `planned` is not what the shard wrote:
    damaged, cut, or another run's. The merge refuses it rather than filling the gap with
    `not_sent`: whether those requests were sent, and what they measured, is unknown.
    """
    planned, ids = shard.info.planned, shard.frame.get_column("request_id")
    if planned is None or (ids.len() == planned and ids.n_unique() == planned):
        return None
    return (f"{shard.run_dir}: its {RECORDS_FILE} holds {ids.n_unique():,} distinct request "
            f"ids in {ids.len():,} rows for the {planned:,} requests its run.json planned, so "
            "it does not cover its plan (damaged, cut, or another run's); rerun that shard, or "
            "restore its folder")  # fmt: skip


def problems(shards: Sequence[ShardRun]) -> list[str]:
    """Everything that keeps these folders from being the N shards of one run."""
    found: list[str] = []
    not_shards = [s for s in shards if s.info.shard is None]
    for s in not_shards:
        found.append(f"{s.run_dir}: not a shard (run.json has no shard; run with --shard i/N)")
    found.extend(problem for s in shards if (problem := uncovered(s)) is not None)
    shards = [s for s in shards if s.info.shard is not None]
    if not shards:
        return found

    def differ(what: str, key: Callable[[ShardRun], object]) -> None:
        values: dict[str, list[str]] = {}
        for s in shards:
            values.setdefault(str(key(s)), []).append(s.run_dir.name)
        if len(values) > 1:
            found.append(f"different {what}: " + "; ".join(
                f"{value} in {', '.join(names)}" for value, names in values.items()
            ))  # fmt: skip

    differ("workloads (spec hash)", lambda s: spec_hash(s.info))
    differ("seeds", lambda s: s.info.seed)
    differ("shard counts N", lambda s: s.shard.count)
    differ("agreed starts (--start-at)", lambda s: s.shard.start_at_unix_ns)
    count = shards[0].shard.count
    seen: dict[int, list[str]] = {}
    for s in shards:
        seen.setdefault(s.shard.index, []).append(s.run_dir.name)
    for index, names in sorted(seen.items()):
        if len(names) > 1:
            found.append(f"shard {index}/{count} given {len(names)} times: {', '.join(names)}")
    missing = [str(i) for i in range(count) if i not in seen]
    if missing:
        found.append(f"missing shard(s) {', '.join(missing)} of {count}")
    return found


def rebase(frame: pl.DataFrame, offset_ns: int) -> pl.DataFrame:
    """Every time on the run clock (`records.TIME_COLUMNS`: each element of a list of
    them) shifted by `offset_ns`; durations and counts stay as they are."""
    if offset_ns == 0:
        return frame
    return frame.with_columns(
        (pl.col(c.name).list.eval(pl.element() + offset_ns) if c.is_list
         else pl.col(c.name) + offset_ns).alias(c.name)
        for c in TIME_COLUMNS
    )  # fmt: skip


def merge_shards(
    dirs: Sequence[Path], out_dir: Path, run_id: str | None, *, ray: RayInfo | None = None
) -> RunResult:
    """Validate the shards, write the merged run folder, audit it (see the module docstring).
    `ray`: the placement of a `run --ray`, kept in run.json (and each shard row's node)."""

    read = [read_shard(d) for d in dirs]
    shards = sorted(read, key=lambda s: s.info.shard.index if s.info.shard else -1)
    wrong = problems(shards)
    if wrong:
        raise LoadgenError("cannot merge these run folders:\n  " + "\n  ".join(wrong))
    start_ns = shards[0].shard.start_at_unix_ns
    if start_ns is None:
        raise LoadgenError(f"cannot merge: {shards[0].run_dir} has no agreed start (--start-at)")
    frames = [rebase(s.frame, s.aligned_anchor_ns - start_ns) for s in shards]
    frame = pl.concat(frames).sort("request_id")
    if frame.get_column("request_id").n_unique() != frame.height:
        raise LoadgenError("cannot merge: the shards' request ids overlap (not one schedule)")
    info = merged_info(shards, run_id, start_ns)
    if ray is not None:
        info = with_ray(info, ray)
    run_dir = out_dir / info.run_id
    if run_dir.exists():
        raise LoadgenError(f"{run_dir} already exists: runs are never overwritten")
    make_run_folder(run_dir)
    write_records(run_dir, frame)
    write_run_info(run_dir, info)
    _keep_server_metrics(shards, run_dir, start_ns)
    summary = write_audit(run_dir, *reaudit(run_dir))
    # The merged run is judged by the generator-health rule on every shard's records (a
    # shard's own exit 3 judged its share alone): its exit is the merged verdict's.
    return RunResult(run_dir=run_dir, summary=summary, interrupted=info.interrupted,
                     run_info=info)  # fmt: skip


def scraping_shard(shards: Sequence[ShardRun]) -> ShardRun | None:
    """The shard whose scrape the merged run keeps, rows and run.json block together:
    shards scrape one server, so one shard's scrape is the server's (theirs would repeat
    it). Of those whose scrape kept rows, the one whose scrapes span the longest stretch of
    the run (shards end at different times: the first shard's may stop while another's
    streams still ran, and its counters would miss their tokens), the first of equals; else
    the first that scraped at all, so that its failures and their note (a 401, ...) stay
    with the run; None: no shard scraped."""
    tried = [s for s in shards if s.info.server_metrics is not None]
    spans = [(_scrape_span_ns(s), -i, s) for i, s in enumerate(tried)]
    kept = [item for item in spans if item[0] is not None]
    if kept:
        return max(kept, key=lambda item: (item[0], item[1]))[2]
    return tried[0] if tried else None


def _scrape_span_ns(shard: ShardRun) -> int | None:
    """Last − first scrape time of a shard's kept rows; None when it kept none."""
    if not (shard.run_dir / SERVER_METRICS_FILE).exists():
        return None
    rows = read_server_metrics(shard.run_dir)
    if rows is None or rows.height == 0:
        return None
    return int(rows["t_ns"].max()) - int(rows["t_ns"].min())  # type: ignore[arg-type]


def _keep_server_metrics(shards: Sequence[ShardRun], run_dir: Path, start_ns: int) -> None:
    """The scraping shard's server metrics (`scraping_shard`), on the merged timeline."""
    shard = scraping_shard(shards)
    server = read_server_metrics(shard.run_dir) if shard is not None else None
    if shard is not None and server is not None:
        offset = shard.aligned_anchor_ns - start_ns
        write_server_metrics(run_dir, server.with_columns(pl.col("t_ns") + offset))


def merged_info(shards: Sequence[ShardRun], run_id: str | None, start_ns: int) -> RunInfo:
    """The merged run's run.json: the first shard's, with the merged t0 (the agreed start,
    on no one monotonic clock), processes, shard table and stop, and every plan counted."""
    base = shards[0].info
    scraped = scraping_shard(shards)  # its server_metrics block, with the rows kept
    name = run_id or new_run_id(base.workload.name if base.workload else "merged")
    return replace(
        merged_stop(base, shards),
        schema_version=SCHEMA_VERSION,
        run_id=name,
        planned=sum(s.planned for s in shards),
        t0=T0(perf_counter_ns=None, unix_ns=start_ns, utc=utc_text(start_ns)),
        server_metrics=scraped.info.server_metrics if scraped is not None else None,
        shard=None,
        workers=merged_workers(shards),
        shards=shard_table(shards, start_ns),
        finished=True,
    )


def merged_stop(base: RunInfo, shards: Sequence[ShardRun]) -> RunInfo:
    """`base` stopped as the most broken shard did (incomplete, then watchdog, then
    interrupted), so that one stopped shard makes the whole run no verdict."""

    stops = [s.info.stop for s in shards]
    stopped = next((k for k in ("incomplete", "watchdog", "interrupted") if k in stops), None)
    watchdog = next((s.info.watchdog for s in shards if s.info.watchdog), None)
    return replace(
        base,
        interrupted=stopped is not None,
        stopped=stopped,
        recovered=any(bool(s.info.recovered) for s in shards),
        watchdog=watchdog,
    )


def merged_workers(shards: Sequence[ShardRun]) -> WorkersInfo:
    """Every shard's engine processes, each labelled with its shard."""
    processes = [
        replace(p, shard=s.shard.index)
        for s in shards
        for p in (s.info.workers.processes if s.info.workers else ())
    ]
    return WorkersInfo(count=len(processes), chosen=f"{len(shards)} shards merged",
                       processes=tuple(processes))  # fmt: skip


def shard_table(shards: Sequence[ShardRun], start_ns: int) -> ShardTable:
    """Per shard: where it ran and its skew (its t0 anchor − the agreed start); and the
    spread of the anchors (largest − smallest: how far apart the shards started)."""
    rows = [
        ShardRow(
            index=s.shard.index,
            run_id=s.info.run_id,
            host=s.info.host.hostname if s.info.host else None,
            planned=s.planned,
            records=s.frame.height,
            t0_unix_ns=s.anchor_unix_ns,
            skew_ms=round((s.aligned_anchor_ns - start_ns) / 1e6, 6),
            reached_late_ms=s.info.t0.reached_late_ms if s.info.t0 else None,
            interrupted=s.info.interrupted,
            fell_behind=s.fell_behind,
            clock_offset_ms=_ms(s.shard.clock_offset_ns),
        )
        for s in shards
    ]
    anchors = [s.aligned_anchor_ns for s in shards]
    return ShardTable(
        count=len(shards),
        start_at_unix_ns=start_ns,
        spread_ms=round((max(anchors) - min(anchors)) / 1e6, 6),
        max_abs_skew_ms=round(max(abs(a - start_ns) for a in anchors) / 1e6, 6),
        shards=tuple(rows),
    )


def with_ray(info: RunInfo, ray: RayInfo) -> RunInfo:
    """run.json with the Ray placement, and each shard row with its node."""
    nodes = {s.index: f"{s.node_ip} {(s.node_id or '?')[:12]}" for s in ray.shards}
    table = info.shards
    if table is not None:
        rows = tuple(replace(row, node=nodes.get(row.index)) for row in table.shards)
        table = replace(table, shards=rows)
    return replace(info, ray=ray, shards=table)


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 6)
