"""Results store: the run folders under one folder, each as its `run.json` describes it.

Sits after the run (which leaves `run.json` and `records.parquet` in `<store>/<run-id>/`)
and before the reports over many runs (`loadgen.analysis.rolling`, `loadgen.analysis.compare`),
which pool runs of one workload (`RunEntry.workload_key`) and leave out, unless asked, the
runs that are no measure of the server (`RunEntry.invalid`: stopped before their end, or
their generator fell behind). The per-minute histograms beside each run's records are
`loadgen.analysis.minutes`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadgen.errors import LoadgenError
from loadgen.results.runfolder import RUN_FILE, SUMMARY_FILE, RunInfo, read_run_info
from loadgen.workload.spec import SloTargets


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEntry:
    """One run folder of the store, as its `run.json` describes it."""

    run_dir: Path
    run_id: str
    started_unix_ns: int  # t0 on the wall clock
    workload: str  # its name
    slos: Mapping[str, SloTargets] = field(default_factory=dict)
    workload_key: str = ""  # `name@fingerprint`: what the store pools by (workload.identity)
    offered_rate_per_s: float | None = None
    stopped: str | None = None  # `RunInfo.stop`: interrupted, watchdog, incomplete, or None
    # Why the generator fell behind (summary.json's `generator.reason`; a run judged before
    # that sentence: its verdict's words), or None: its figures are the server's.
    fell_behind: str | None = None

    @property
    def is_complete(self) -> bool:
        """A measure of the server: it ran to its end and its generator did not fall behind.
        Any other run is left out of windows and baselines unless asked (`invalid`)."""
        return self.stopped is None and self.fell_behind is None

    @property
    def invalid(self) -> str | None:
        """Why the run is no measure of the server, in words (None: it is one)."""
        if self.stopped is not None:
            return f"stopped before its end ({self.stopped})"
        if self.fell_behind is not None:
            return f"the generator fell behind: {self.fell_behind}"
        return None

    @property
    def started(self) -> datetime:
        """t0 as an aware UTC datetime."""
        return datetime.fromtimestamp(self.started_unix_ns / 1e9, UTC)


def discover_runs(store_dir: Path, skipped: list[str] | None = None) -> list[RunEntry]:
    """Every run folder directly under `store_dir` that has a `run.json`, oldest t0 first.

    A folder whose run.json is damaged (not JSON, a t0 no clock can hold) is a LoadgenError,
    or, when `skipped` is given, left out with why appended to it: one damaged night does
    not cost a store's every other run.
    """
    entries = []
    for path in sorted(store_dir.glob(f"*/{RUN_FILE}")):
        try:
            entries.append(read_run_entry(path.parent))
        except LoadgenError as exc:
            if skipped is None:
                raise
            skipped.append(f"{path.parent.name} ({exc})")
    return sorted(entries, key=lambda e: (e.started_unix_ns, e.run_id))


def select_runs(
    runs: Sequence[RunEntry], *, workload: str | None = None, include_incomplete: bool = False
) -> list[RunEntry]:
    """The runs a pooled report may use: valid ones (unless `include_incomplete`), of the
    workload `workload` names (a name, which may cover several fingerprints, each still its
    own workload, or one `name@fingerprint` key) when given."""
    chosen = [r for r in runs if include_incomplete or r.is_complete]
    if workload is not None:
        chosen = [r for r in chosen if workload in (r.workload, r.workload_key)
                  or (("@" in workload) and r.workload_key.startswith(workload))]  # fmt: skip
    return chosen


def read_run_entry(run_dir: Path) -> RunEntry:
    """A run's `run.json` as a `RunEntry` (LoadgenError if it is unreadable or has no t0)."""
    info = read_run_info(run_dir)
    try:
        if info.t0 is None or info.workload is None:
            raise ValueError("no t0 or no workload")
        started = int(info.t0.unix_ns)
        slos = info.slos()
    except (TypeError, ValueError) as exc:
        raise LoadgenError(f"{run_dir / RUN_FILE}: not a loadgen run.json ({exc!r})") from None
    ident = _identity(info)
    return RunEntry(
        run_dir=run_dir,
        run_id=info.run_id,
        started_unix_ns=started,
        workload=info.workload.name,
        slos=slos,
        workload_key=str(ident.get("key") or f"{info.workload.name}@unknown"),
        offered_rate_per_s=ident.get("offered_rate_per_s"),
        stopped=info.stop,
        fell_behind=None if info.stop is not None else _fell_behind(run_dir),
    )


def _fell_behind(run_dir: Path) -> str | None:
    """The reason summary.json gives for a run whose generator fell behind (None: it did not,
    or the run has no summary yet)."""
    try:
        data = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    verdict = data.get("verdict") or {}
    if verdict.get("status") != "fell_behind":
        return None
    reason = (data.get("generator") or {}).get("reason")
    return str(reason) if reason else "its figures are the client's (exit 3)"


def _identity(info: RunInfo) -> dict[str, Any]:
    """The run's workload identity; for a run whose stored spec this loadgen cannot rebuild,
    none (its key is then `name@unknown`: a workload of its own)."""

    try:
        return info.identity()
    except LoadgenError:
        return {}
