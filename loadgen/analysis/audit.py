"""The audit of one run: its records and objectives → the summary, with its schema stamp.

`audit` is the one audit every command judges a run by (the end of `loadgen run`, a
capacity step, `loadgen report` and `loadgen merge`): the SLO audit (`slo.summarize`), the
class objectives on top (`objectives.apply_objectives`), the schema version. `audit_run`
re-audits a run folder from its records and run.json; the SLOs come from run.json unless
`--slo` replaces them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl

from loadgen import __version__
from loadgen.analysis.objectives import Objective, apply_objectives
from loadgen.analysis.slo import summarize
from loadgen.errors import ConfigError, LoadgenError
from loadgen.results.records import read_records
from loadgen.results.runfolder import SCHEMA_VERSION, read_run_info, run_stop
from loadgen.workload.spec import METRICS_MS, SloTargets

SLO_FIELDS = (*METRICS_MS, "percentile")


def run_slos(run_info: Mapping[str, Any]) -> dict[str, SloTargets]:
    """Each class's SloTargets as recorded in run.json (workload.spec.classes.<name>.slo)."""
    classes = run_info.get("workload", {}).get("spec", {}).get("classes", {})
    slos = {}
    for name, cls in classes.items():
        raw = cls.get("slo") or {}
        slos[str(name)] = SloTargets(**{k: raw[k] for k in SLO_FIELDS if raw.get(k) is not None})
    return slos


def parse_slo_override(text: str) -> dict[str, float | None]:
    """`ttft_ms=800,tpot_ms=40,percentile=95` as fields of SloTargets (`none` clears one).

    The result is applied to every class with `apply_slo_override`: given fields replace
    the class's own, the others are kept.
    """
    fields: dict[str, float | None] = {}
    for item in (part.strip() for part in text.split(",")):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or key not in SLO_FIELDS:
            raise _slo_error(f"{item!r} is not one of {'/'.join(SLO_FIELDS)}=<number>")
        if key in fields:
            raise _slo_error(f"{key} is given twice")
        fields[key] = _slo_value(key, value)
    try:
        SloTargets(**{k: v for k, v in fields.items() if v is not None})
    except ValueError as exc:
        raise _slo_error(str(exc)) from None
    return fields


def _slo_value(key: str, value: str) -> float | None:
    if value.lower() == "none" and key != "percentile":
        return None
    try:
        number = float(value)
    except ValueError:
        raise _slo_error(f"{key}={value!r} is not a number") from None
    if not (math.isfinite(number) and number > 0):
        raise _slo_error(f"{key} must be a finite number > 0 (got {value})")
    return number


def _slo_error(problem: str) -> ConfigError:
    return ConfigError(
        "command line", "--slo", problem, "e.g. --slo ttft_ms=800,tpot_ms=40,percentile=95"
    )


def apply_slo_override(
    slos: Mapping[str, SloTargets], fields: Mapping[str, float | None]
) -> dict[str, SloTargets]:
    """Every class's targets with `fields` (from `parse_slo_override`) replacing its own."""
    merged = {}
    for name, targets in slos.items():
        current: dict[str, Any] = {k: getattr(targets, k) for k in SLO_FIELDS}
        current.update(fields)
        merged[name] = SloTargets(**{k: v for k, v in current.items() if v is not None})
    return merged


def audit(
    frame: pl.DataFrame,
    *,
    run_id: str,
    objectives: Mapping[str, Objective],
    planned: int,
    lag_bound_ms: float = 5.0,
    stopped: str | None = None,
) -> dict[str, Any]:
    """The run's summary: `slo.summarize` over each objective's SLO targets, the objectives
    applied, stamped with the schema and loadgen versions (what summary.json holds).

    `stopped` (a key of `runfolder.STOPS`) withholds the verdict: see `slo.verdict`.
    """
    slos = {name: objective.slo for name, objective in objectives.items()}
    summary = summarize(
        frame, run_id=run_id, slos=slos, planned=planned, stopped=stopped, lag_bound_ms=lag_bound_ms
    )
    summary = apply_objectives(summary, frame, objectives)
    return {"schema_version": SCHEMA_VERSION, "loadgen_version": __version__, **summary}


def audit_run(
    run_dir: Path, *, slos: Mapping[str, SloTargets] | None = None
) -> tuple[dict[str, Any], pl.DataFrame, dict[str, SloTargets]]:
    """Re-audit one run: (summary, records frame, the SLOs used), without figures.

    The SLOs are run.json's, with `slos` replacing whole classes' targets. planned, how the
    run stopped (`runfolder.run_stop`) and the lag bound come from run.json, so without `slos`
    the summary equals the one the run wrote. Raises LoadgenError when the folder has no
    run.json or records.
    """
    info = read_run_info(run_dir)
    if not (run_dir / "records.parquet").exists() and not (run_dir / "records.parts").is_dir():
        raise LoadgenError(f"{run_dir} has no records.parquet (nor records.parts)")
    frame = read_records(run_dir)
    effective = {**run_slos(info), **(slos or {})}
    recorded = Objective.from_run_info(info, effective)
    objectives = {
        name: recorded.get(name, Objective(name=name, slo=targets))
        for name, targets in effective.items()
    }
    summary = audit(
        frame,
        run_id=str(info.get("run_id", run_dir.name)),
        objectives=objectives,
        planned=int(info.get("planned", frame.height)),
        stopped=run_stop(info),
        lag_bound_ms=float(info.get("options", {}).get("lag_bound_ms", 5.0)),
    )
    return summary, frame, effective
