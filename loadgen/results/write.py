"""Every write into a run folder (and into the folders `report` and `capacity` fill).

`results.runfolder` names the files and reads them; this module is the only code that writes
them. Each file is written whole to a temp name beside it (a dot, the name, `.tmp`), flushed
to disk and renamed into place, so a reader (or a run killed mid-write) never sees half a
file; the exceptions are said where they are: the run log (`engine.logs`, a stream), the lock
(`results.liveness`), the heartbeats (touched) and the scraper's parts (renamed whole, not
synced). `analysis/` and `render/` compute and return (frames, a `Summary`, bytes); the
commands and the run write what they return through here (import-linter forbids
`analysis/` and `render/` this module, see pyproject.toml).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from loadgen.codec import to_json
from loadgen.errors import TRANSIENT_ERRNOS
from loadgen.results.records import RequestRecord, empty_frame, to_frame
from loadgen.results.recover import Recovery, recovered_records
from loadgen.results.runfolder import (
    DAMAGED_DIR,
    HEARTBEAT,
    HISTOGRAMS_FILE,
    MEASURED,
    PART_GLOB,
    PARTS_DIR,
    RECORDS_FILE,
    RUN_FILE,
    RUN_LOG,
    SERVER_METRICS_FILE,
    SERVER_METRICS_SCHEMA,
    SERVER_PARTS_DIR,
    SHARDS_DIR,
    SPANS_FILE,
    SPANS_PARTS_DIR,
    SUMMARY_FILE,
    WARM_UP_FILE,
    RunInfo,
    failed_log_path,
    part_name,
    read_parts,
    read_run_info,
    read_server_metrics,
    server_part_name,
    server_rows_frame,
    worker_heartbeat,
    worker_part_name,
    worker_scratch_dir,
)
from loadgen.results.summary import Summary

# --- atomic files -------------------------------------------------------------------------


def write_parquet_atomic(frame: pl.DataFrame, path: Path) -> None:
    """Write to a temp name in the same folder, fsync, rename: readers never see half a file.

    polars encodes into memory and Python writes the bytes, so a failing write raises the
    kernel's own `OSError` (ENOSPC, EACCES, EFBIG, EMFILE with `filename` = `path`), where
    polars writing to the path would say only "Invalid thrift: transport error". A temp
    file left by a failed write is removed (it would hold disk space and look like a part).
    """
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    write_file_atomic(path, buffer.getbuffer())


def write_file_atomic(path: Path, data: bytes | memoryview) -> None:
    """`data` to a temp name beside `path`, fsync, rename; an `OSError` names `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON to a temp name and rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_files(folder: Path, files: Mapping[str, bytes]) -> list[Path]:
    """Each of `files` (name: bytes, as `render/` returns them) atomically in `folder`
    (made if missing), in order; the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files.items():
        path = folder / name
        write_file_atomic(path, data)
        written.append(path)
    return written


# --- the run folder -----------------------------------------------------------------------


def make_run_folder(run_dir: Path) -> None:
    """Create a new run folder (its parents too); FileExistsError if it exists."""
    run_dir.mkdir(parents=True)


def unpack_run_folder(run_dir: Path, data: bytes) -> None:
    """A run folder carried as a tar (`runfolder.pack_run_folder`) made at `run_dir`: unpacked
    into a temp folder beside it, then renamed into place (a reader never sees half of it).
    Only regular files and folders under it are taken (no links, no paths outside)."""
    tmp = run_dir.with_name(f".{run_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(tmp, filter="data")
    os.replace(tmp, run_dir)


def keep_shards(run_dir: Path, shards: Path) -> Path:
    """The folder of shard run folders moved into the merged run (`run_dir/shards/`)."""
    kept = run_dir / SHARDS_DIR
    os.replace(shards, kept)
    return kept


def discard_unstarted(run_dir: Path) -> Path | None:
    """A run that ended before t0 (a failed or interrupted preflight, a simulator that did
    not start) leaves no half-made folder, so the same --run-id can be given again: its log
    is moved beside it to `<run-id>.failed.log`, the folder removed. Returns the log's new
    path; None (the folder kept) once the run has begun (run.json) or measured anything."""
    if not run_dir.is_dir() or any((run_dir / name).exists() for name in MEASURED):
        return None
    kept = failed_log_path(run_dir)
    try:
        if (run_dir / RUN_LOG).exists():
            os.replace(run_dir / RUN_LOG, kept)
        shutil.rmtree(run_dir)
    except OSError:
        return None  # a read-only or vanished folder: left as it is
    return kept if kept.exists() else None


def write_run_info(run_dir: Path, info: RunInfo) -> None:
    """The run's `run.json`: at t0, when the client fails, and at the end of a run, a merge
    or a recovery (the typed record, JSON only here)."""
    write_json_atomic(run_dir / RUN_FILE, to_json(info))


def write_summary(run_dir: Path, summary: Summary) -> None:
    """The run's `summary.json` (the audit's, or a report's re-audit in its own folder)."""
    write_json_atomic(run_dir / SUMMARY_FILE, to_json(summary))


def write_histograms(run_dir: Path, minutes: pl.DataFrame) -> Path:
    """`histograms.parquet` (`analysis.minutes.run_histograms` builds the frame)."""
    path = run_dir / HISTOGRAMS_FILE
    write_parquet_atomic(minutes, path)
    return path


def write_audit(run_dir: Path, summary: Summary, minutes: pl.DataFrame) -> Summary:
    """A re-audited folder's summary.json and histograms.parquet (`analysis.audit.reaudit`
    computes both): how a merged or recovered run folder is finished."""
    write_summary(run_dir, summary)
    write_histograms(run_dir, minutes)
    return summary


def write_report(folder: Path, files: Mapping[str, bytes], summary: Summary) -> list[Path]:
    """`loadgen report`'s folder: `files` (`render.report.folder.report_files`: the PNGs,
    report.md, report.html), then summary.json; the paths written, in that order."""
    written = write_files(folder, files)
    write_summary(folder, summary)
    written.append(folder / SUMMARY_FILE)
    return written


# --- records ------------------------------------------------------------------------------


def write_records(run_dir: Path, frame: pl.DataFrame) -> None:
    """`records.parquet`: the run's records, joined."""
    write_parquet_atomic(frame, run_dir / RECORDS_FILE)


class RecordWriter:
    """Collects records during a run and spills them to Parquet parts.

    The engine calls `add` (cheap, in the event loop). About once a second the run takes
    the due batch (`take_due`: every `flush_every` records or `flush_interval_s` seconds)
    and writes it with `write_part`, in a worker thread so the loop keeps stamping chunks.
    `close()` joins the parts into `records.parquet`. A run killed mid-way keeps every part
    already renamed into place.

    Each `take_due` also touches the process's heartbeat file in the parts folder: its
    modification time is the last moment the run was seen alive, which is how `loadgen
    report --recover` tells a plan that was due (sent) before a kill from one that never
    came (`loadgen.results.recover`).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        flush_every: int = 1000,
        flush_interval_s: float = 1.0,
        heartbeat: str = HEARTBEAT,
    ) -> None:
        self.run_dir = run_dir
        self.parts_dir = run_dir / PARTS_DIR
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self.heartbeat = self.parts_dir / heartbeat
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self._pending: list[RequestRecord] = []
        self._part_count = 0
        self._part_lock = threading.Lock()
        self._last_take = time.monotonic()
        self.count = 0  # records taken
        self.written = 0  # records in parts on disk
        # Start polars' I/O runtime now, while file descriptors are plentiful: started
        # mid-run it needs some, and a run short of them must still be able to write.
        warm = self.parts_dir / WARM_UP_FILE
        write_parquet_atomic(empty_frame(), warm)
        warm.unlink()

    def add(self, record: RequestRecord) -> None:
        """Take one record (no I/O)."""
        self._pending.append(record)
        self.count += 1

    def beat(self) -> None:
        """Touch the heartbeat file (a failure to is not worth a lost record: ignored)."""
        try:
            os.utime(self.heartbeat)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                self.heartbeat.touch()
        except OSError:
            pass

    def take_due(self) -> list[RequestRecord]:
        """The pending records if a batch is full or the interval has passed, else [].
        Touches the heartbeat (see the class docstring)."""
        self.beat()
        now = time.monotonic()
        if len(self._pending) >= self.flush_every or (
            self._pending and now - self._last_take >= self.flush_interval_s
        ):
            self._last_take = now
            batch, self._pending = self._pending, []
            return batch
        return []

    def write_part(self, batch: list[RequestRecord]) -> None:
        """Write one batch as the next part (safe to call from a worker thread)."""
        if not batch:
            return
        with self._part_lock:
            self._part_count += 1
            part = self.parts_dir / part_name(self._part_count)
        write_parquet_atomic(to_frame(batch), part)
        self.written += len(batch)

    @property
    def pending(self) -> int:
        """Records taken but not yet in a part on disk."""
        return len(self._pending)

    def requeue(self, batch: list[RequestRecord]) -> None:
        """Put back a batch whose write failed (e.g. out of file descriptors); it goes out
        with the next one. Records are never dropped."""
        self._pending[:0] = batch

    def flush(self) -> None:
        """Write every pending record now (a failed write keeps them pending)."""
        batch, self._pending = self._pending, []
        try:
            self.write_part(batch)
        except BaseException:
            self.requeue(batch)
            raise

    def close(self) -> pl.DataFrame:
        """Flush, join every part into `records.parquet`, remove the parts; return the frame.

        Out of file descriptors is retried for a few seconds (the run's sockets are closing);
        any other failed write raises its `OSError`, and the parts stay for `--recover`.
        """
        retry_transient(self.flush)
        frame = read_parts(self.parts_dir)
        retry_transient(lambda: write_records(self.run_dir, frame))
        remove_parts(self.parts_dir)
        return frame


def remove_parts(parts_dir: Path) -> None:
    """Remove a parts folder once its records are joined: parts, heartbeats, and the temp
    file of a part being written when a process was killed."""
    for name in (PART_GLOB, f"{HEARTBEAT}*", ".*"):
        for path in parts_dir.glob(name):
            path.unlink()
    parts_dir.rmdir()


def retry_transient(
    write: Callable[[], None], *, attempts: int = 20, pause_s: float = 0.25
) -> None:
    """Call `write`, again after `pause_s` while it fails with a transient error (EMFILE,
    ENFILE, EAGAIN, EINTR), at most `attempts` times; any other `OSError` at once."""
    for attempt in range(attempts):
        try:
            write()
            return
        except OSError as exc:
            if exc.errno not in TRANSIENT_ERRNOS or attempt == attempts - 1:
                raise
        time.sleep(pause_s)


class ShareWriter(RecordWriter):
    """A worker's `RecordWriter`: its parts go to the run's one parts folder, named
    `part-w<index>-<n>.parquet` so workers never collide and `read_parts` joins them all."""

    def __init__(self, run_dir: Path, index: int) -> None:
        private = run_dir / worker_scratch_dir(index)
        super().__init__(private)  # its warm-up write happens in a folder of its own
        (private / PARTS_DIR).rmdir()
        private.rmdir()
        self.parts_dir = run_dir / PARTS_DIR
        self.parts_dir.mkdir(exist_ok=True)
        self.heartbeat = self.parts_dir / worker_heartbeat(index)
        self.index = index
        self._written = 0

    def write_part(self, batch: list[RequestRecord]) -> None:
        """Write one batch as this worker's next part (called from one thread at a time)."""
        if not batch:
            return
        self._written += 1
        name = worker_part_name(self.index, self._written)
        write_parquet_atomic(to_frame(batch), self.parts_dir / name)


def join_parts(run_dir: Path) -> pl.DataFrame:
    """Every part in the run's parts folder as `records.parquet`; the parts are removed."""
    parts = run_dir / PARTS_DIR
    frame = read_parts(parts)
    write_records(run_dir, frame)
    remove_parts(parts)
    return frame


def recover(run_dir: Path) -> Recovery:
    """`loadgen report --recover`: finish a run that never wrote its end (`results.recover`):
    one record per plan, the scraper's parts joined, run.json marked `recovered` and
    `stopped: incomplete` (killed), or kept `stopped: interrupted` when the user stopped it
    (a second Ctrl-C: exit 130, never "killed"). A finished run is left as it is."""
    info = read_run_info(run_dir)
    found = recovered_records(run_dir, info)
    if found is None:
        planned = info.planned or 0
        return Recovery(planned=planned, kept=planned, cancelled=0, not_sent=0,
                        nothing_to_do=True)  # fmt: skip
    joined, done = found
    write_records(run_dir, joined)
    if done.skipped:  # the damaged parts are evidence: kept aside, out of a rerun's way
        damaged = run_dir / DAMAGED_DIR
        damaged.mkdir(exist_ok=True)
        for name in done.skipped:
            (run_dir / PARTS_DIR / name).rename(damaged / name)
    remove_parts(run_dir / PARTS_DIR)
    if info.t0 is not None and info.t0.perf_counter_ns is not None:
        join_server_metrics(run_dir, info.t0.perf_counter_ns)  # what the scraper spilled

    stopped = "interrupted" if info.stopped == "interrupted" else "incomplete"
    write_run_info(run_dir, replace(info, interrupted=True, recovered=True, stopped=stopped))
    return done


# --- server_metrics.parquet ---------------------------------------------------------------


def write_server_part(
    run_dir: Path, rows: Sequence[tuple[int, str, Sequence[tuple[str, str]], float]]
) -> None:
    """Spill scraped rows to a new part file (temp name, then renamed)."""
    if not rows:
        return
    parts = run_dir / SERVER_PARTS_DIR
    parts.mkdir(exist_ok=True)
    index = len(list(parts.glob(PART_GLOB)))
    path = parts / server_part_name(index)
    tmp = parts / f".{path.name}.tmp"
    server_rows_frame(rows).write_parquet(tmp)
    os.replace(tmp, path)


def join_server_metrics(run_dir: Path, t0_mono_ns: int) -> pl.DataFrame | None:
    """Join the spilled parts into `server_metrics.parquet` (t_ns since t0), remove them.

    None when the run scraped nothing; an existing file is kept when there are no parts.
    """
    parts = run_dir / SERVER_PARTS_DIR
    files = sorted(parts.glob(PART_GLOB)) if parts.exists() else []
    if not files:
        return read_server_metrics(run_dir)
    frame = pl.concat([pl.read_parquet(f, glob=False) for f in files], how="vertical")
    frame = frame.select(
        (pl.col("mono_ns") - t0_mono_ns).alias("t_ns"), "name", "labels", "value"
    ).sort("t_ns", maintain_order=True)
    write_server_metrics(run_dir, frame)
    for f in files:
        f.unlink()
    parts.rmdir()
    return frame


def write_server_metrics(run_dir: Path, frame: pl.DataFrame) -> None:
    """`server_metrics.parquet` (temp name, then renamed)."""
    path = run_dir / SERVER_METRICS_FILE
    tmp = run_dir / f".{SERVER_METRICS_FILE}.tmp"
    frame.cast(SERVER_METRICS_SCHEMA).write_parquet(tmp)  # type: ignore[arg-type]  # dtypes
    os.replace(tmp, path)


# --- server-spans.parquet ----------------------------------------------------------------


def write_span_part(run_dir: Path, index: int, body: bytes, kind: str) -> Path:
    """One OTLP body as it came (`kind`: `pb` or `json`, decompressed), the `index`-th
    part of `server-spans.parts/` (made if missing); its path."""
    parts = run_dir / SPANS_PARTS_DIR
    parts.mkdir(exist_ok=True)
    path = parts / f"part-{index:06d}.{kind}"
    write_file_atomic(path, body)
    return path


def write_spans(run_dir: Path, frame: pl.DataFrame) -> None:
    """`server-spans.parquet` (atomic), and the parts it was read from removed."""
    write_parquet_atomic(frame, run_dir / SPANS_FILE)
    parts = run_dir / SPANS_PARTS_DIR
    if parts.is_dir():
        for path in parts.iterdir():
            path.unlink()
        parts.rmdir()
