"""The host's calibrated envelope: what `loadgen calibrate` saved, and what a run expects.

`loadgen calibrate` (`loadgen.studies.calibrate`) measures how much load this machine's
client measures truthfully and saves the result here, per host and process count; `loadgen
run` reads it to warn when a workload's expected peak exceeds it and to choose `--workers`.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.results.write import write_json_atomic
from loadgen.workload.plans import RequestPlan
from loadgen.workload.spec import WorkloadSpec

CALIBRATION_ENV = "LOADGEN_CALIBRATION"  # overrides where calibrations are saved and read


DEFAULT_TPOT_MS = 20.0  # a stream's token gap when its class has no TPOT SLO (the sim's default)


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """A load level, as the client sees it."""

    streams: int  # concurrent streams (peak in flight)
    chunks_per_s: float  # total chunks (≈ tokens) per second arriving at the client

    def exceeds(self, other: Load) -> bool:
        """True when either figure is above `other`'s."""
        return self.streams > other.streams or self.chunks_per_s > other.chunks_per_s

    def __str__(self) -> str:
        return f"{self.streams:,} streams, {self.chunks_per_s:,.0f} chunks/s"


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """The highest calibrated level that met every threshold, per client process.

    `load` is per process: with `processes` = 2 each of two engine processes held it at
    once. Load(streams=0, chunks_per_s=0) when no level met the thresholds.
    """

    load: Load
    processes: int
    measured_at: str  # ISO UTC
    host: str
    quick: bool = False  # from `calibrate --quick` (a smoke check, saved only with --save)


def calibration_path(path: Path | None = None) -> Path:
    """Where calibrations live: `path`, else $LOADGEN_CALIBRATION, else
    ${XDG_CACHE_HOME:-~/.cache}/loadgen/calibration.json."""
    if path is not None:
        return path
    env = os.environ.get(CALIBRATION_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache) / "loadgen" / "calibration.json"


def host_name() -> str:
    """The key calibrations are saved under (a calibration holds for one machine)."""
    return socket.gethostname()


def read_calibrations(path: Path | None = None) -> dict[str, Any]:
    """The whole calibration file ({"hosts": {host: {processes: result}}}); empty when absent
    or unreadable (a broken cache is not worth failing a run for)."""
    try:
        data = json.loads(calibration_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"hosts": {}}
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict):
        return {"hosts": {}}
    return data


def save_calibration(result: Mapping[str, Any], path: Path | None = None) -> Path:
    """Store `result` (calibrate's JSON) under its host and process count; return the path."""
    target = calibration_path(path)
    data = read_calibrations(target)
    by_processes = data["hosts"].setdefault(str(result["host"]), {})
    by_processes[str(result["processes"])] = dict(result)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target, data)
    return target


def envelope_of(result: Mapping[str, Any]) -> Envelope | None:
    """The Envelope of one saved calibrate result; None when it has no valid envelope key
    (a figure that is no count, Infinity or NaN included: the file is a cache anyone can
    edit, and a bad entry is ignored, never the reason a run fails)."""
    try:
        load = result["envelope"] or {"streams": 0, "chunks_per_s": 0.0}
        streams, rate = float(load["streams"]), float(load["chunks_per_s"])
        processes = float(result["processes"])
        if not all(math.isfinite(v) and v >= 0 for v in (streams, rate, processes)):
            return None
        return Envelope(
            load=Load(streams=int(streams), chunks_per_s=rate),
            processes=int(processes),
            measured_at=str(result["measured_at"]),
            host=str(result["host"]),
            quick=bool(result.get("quick", False)),
        )
    except (KeyError, TypeError, ValueError):
        return None


def last_envelope(path: Path | None = None, *, processes: int | None = None) -> Envelope | None:
    """This host's most recent calibrated envelope (with `processes` engine processes, when
    given); None when this host was never calibrated."""
    entries = read_calibrations(path)["hosts"].get(host_name(), {})
    if not isinstance(entries, dict):
        return None
    found = [
        env
        for key, result in entries.items()
        if (processes is None or key == str(processes))
        and isinstance(result, dict)
        and (env := envelope_of(result)) is not None
    ]
    return max(found, key=lambda e: e.measured_at, default=None)


def expected_peak_load(spec: WorkloadSpec, plans: Sequence[RequestPlan]) -> Load:
    """The load a workload should put on the client at its busiest moment (an estimate).

    Each plan is taken as a stream open from its intended time for output_tokens × TPOT,
    delivering one chunk per TPOT, where TPOT is its class's SLO `tpot_ms` (a server that
    meets the SLO is at most that slow) or DEFAULT_TPOT_MS. Time to first token is left
    out: a stream waiting for its first token costs the client almost nothing. The peak is
    the maximum over time of open streams and of the summed chunk rates (an exact sweep
    over start and end events). A later turn of a session is placed at its earliest time.
    """
    if not plans:
        return Load(streams=0, chunks_per_s=0.0)
    tpot_ms = np.array(
        [_tpot_ms(spec, plan.class_name) for plan in plans], dtype=np.float64
    )  # per plan
    starts = np.array([plan.intended_ns for plan in plans], dtype=np.int64)
    tokens = np.array([max(plan.output_tokens, 1) for plan in plans], dtype=np.float64)
    ends = starts + (tokens * tpot_ms * 1e6).astype(np.int64)
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(len(plans)), -np.ones(len(plans))])
    rates = np.concatenate([1000.0 / tpot_ms, -1000.0 / tpot_ms])
    order = np.lexsort((steps, times))  # by time; at a tie, ends (-1) before starts (+1)
    peak_streams = int(np.cumsum(steps[order]).max())
    peak_rate = float(np.cumsum(rates[order]).max())
    return Load(streams=peak_streams, chunks_per_s=round(peak_rate, 3))


def _tpot_ms(spec: WorkloadSpec, class_name: str) -> float:
    cls = spec.classes.get(class_name)
    return (cls.slo.tpot_ms if cls is not None else None) or DEFAULT_TPOT_MS


def envelope_warning(
    spec: WorkloadSpec,
    plans: Sequence[RequestPlan],
    *,
    processes: int = 1,
    path: Path | None = None,
) -> str | None:
    """A one-line warning when the workload's expected peak exceeds what `processes` client
    processes held in this host's last calibration; None when it fits or there is none."""
    envelope = last_envelope(path)
    if envelope is None:
        return None
    peak = expected_peak_load(spec, plans)
    capacity = Load(
        streams=envelope.load.streams * processes,
        chunks_per_s=envelope.load.chunks_per_s * processes,
    )
    if not peak.exceeds(capacity):
        return None
    when = envelope.measured_at[:16].replace("T", " ")
    how = "loadgen calibrate --quick, a smoke check" if envelope.quick else "loadgen calibrate"
    return (
        f"warning: expected peak load ({peak}) exceeds this machine's calibrated envelope "
        f"for {processes} client process{'es' if processes > 1 else ''} ({capacity}; "
        f"{how}, {when} UTC): client timestamps may be late, so latencies "
        "would be over-reported"
    )
