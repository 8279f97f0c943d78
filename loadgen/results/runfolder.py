"""The run folder: the one owner of its files, their names and the schema version.

A run folder (`<store>/<run-id>/`) holds `run.json` (what was run: the resolved spec, seed,
target, t0 anchor, how it stopped), `records.parquet` (or `records.parts/` while it runs),
`summary.json`, `histograms.parquet` and `loadgen.log`. Everything the reports show is
recomputable from records plus run.json. Exit codes and stop statuses live here because
summary.json's `verdict` carries them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loadgen.errors import LoadgenError

RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"


SCHEMA_VERSION = 5  # 5: run.json workload.spec.classes.*.limits (max_event_bytes)
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


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON to a temp name and rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> None:
    """The run's `summary.json` (the audit's, or a report's re-audit in its own folder)."""
    write_json_atomic(run_dir / SUMMARY_FILE, summary)


def read_run_info(run_dir: Path) -> dict[str, Any]:
    """`run.json` of a run folder; a LoadgenError when the folder is not a run."""
    path = run_dir / RUN_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LoadgenError(f"{run_dir} is not a run folder: it has no run.json") from None
    except (OSError, ValueError) as exc:
        raise LoadgenError(f"cannot read {path}: {exc}") from None
    if not isinstance(info, dict):
        raise LoadgenError(f"{path} does not hold a JSON object")
    return info


def run_stop(info: Mapping[str, Any]) -> str | None:
    """How a run stopped before its end, from its run.json (a key of `STOPS`), or None.

    `incomplete`: killed outright (`finished: false`: it never wrote its end) or recovered
    from its parts; `watchdog`: stopped by it; `interrupted`: Ctrl-C or SIGTERM. Runs
    written before `stopped` was recorded are read from `interrupted` and `finished`.
    """
    if info.get("recovered") or not info.get("finished", True):
        return "incomplete"
    stopped = info.get("stopped")
    if stopped in STOPS:
        return str(stopped)
    if info.get("watchdog"):
        return "watchdog"
    return "interrupted" if info.get("interrupted") else None


EXIT_OK, EXIT_SLO_MISSED, EXIT_FELL_BEHIND = 0, 2, 3


EXIT_WATCHDOG, EXIT_INCOMPLETE, EXIT_INTERRUPTED = 4, 5, 130


# How a run can stop before its end, and the exit code that says so (`verdict.status`).
STOPS: Mapping[str, int] = {
    "interrupted": EXIT_INTERRUPTED,  # Ctrl-C or SIGTERM: sending stopped, the rest recorded
    "watchdog": EXIT_WATCHDOG,  # nothing progressed for --watchdog seconds
    "incomplete": EXIT_INCOMPLETE,  # killed outright (SIGKILL, OOM); `report --recover`
}
