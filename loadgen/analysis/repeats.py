"""Repeated runs: the between-run spread of each headline figure, with an interval.

`run --repeats K` runs a workload K times, each a normal run folder; this module turns
their summaries into the spread a regression must be told apart from. One run's
order-statistic bounds (`analysis.confidence`) say how well that run knows its own
percentile; they say nothing of how much the server varies from run to run (a different
batch mix, a warm or cold cache, a neighbour on the host). K runs do: per class and
figure, the K values, their mean and standard deviation, a two-sided Student-t interval
for the mean at `level` (mean ± t(1 − α/2, K − 1) · sd / √K: the runs are taken as
independent and their figure as roughly normal, which a percentile of many requests is),
and the min–max. A figure that falls on a failed request in any run has no mean.

Figures per class: the class's SLO checks at their percentile (failures ranked worst, as
judged), attainment and goodput (requests/s). `compare_repeats` compares two sets of
repeats figure by figure: the difference of means with Welch's t-interval, REGRESSED when
that interval lies wholly on the worse side and the change exceeds the tolerance (the
defaults of `analysis.compare`). Pure functions of summaries; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.analysis.compare import DEFAULT_TOLERANCES, Verdict
from loadgen.analysis.confidence import t_quantile
from loadgen.errors import EXIT_OK, EXIT_SLO_MISSED
from loadgen.results.summary import Summary

REPEATS_FILE = "repeats.json"  # in the repeats folder beside the K run folders
# a change's verdict in `compare`'s words
REGRESSED, IMPROVED, OK, NO_DATA = Verdict.REGRESSED, Verdict.IMPROVED, Verdict.OK, Verdict.NO_DATA


# --- the spread of one figure --------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """One figure over K runs: the values (None: on a failure in that run), and when every
    one is a number, mean, sd, the t-interval [low, high] for the mean at `level` (None for
    K = 1), min and max."""

    values: tuple[float | None, ...]
    level: float
    mean: float | None = None
    sd: float | None = None
    low: float | None = None
    high: float | None = None
    min: float | None = None
    max: float | None = None


def spread(values: Sequence[float | None], level: float) -> Spread:
    """The between-run spread of `values` (see the module doc)."""
    kept = tuple(values)
    numbers = [v for v in kept if v is not None and math.isfinite(v)]
    if not numbers or len(numbers) != len(kept):
        return Spread(values=kept, level=level)
    n, mean = len(numbers), sum(numbers) / len(numbers)
    if n == 1:
        return Spread(values=kept, level=level, mean=mean, min=mean, max=mean)
    sd = math.sqrt(sum((v - mean) ** 2 for v in numbers) / (n - 1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * sd / math.sqrt(n)
    return Spread(values=kept, level=level, mean=mean, sd=sd, low=mean - half,
                  high=mean + half, min=min(numbers), max=max(numbers))  # fmt: skip


# Each figure: (name, unit, worse when it is "higher" or "lower").
HIGHER, LOWER = "higher", "lower"


def headline(summary: Summary) -> dict[str, dict[str, tuple[float | None, str]]]:
    """Per class, its headline figures of one run: each SLO check's value at its percentile
    (`ttft_ms p90`, failures worst), attainment and goodput req/s, with the direction that
    is worse."""
    figures: dict[str, dict[str, tuple[float | None, str]]] = {}
    for name, block in summary.classes.items():
        mine: dict[str, tuple[float | None, str]] = {}
        for check in block.slo.checks:
            if check.percentile is None:
                continue
            mine[f"{check.metric} p{check.percentile:g}"] = (check.value_ms, HIGHER)
        mine["attainment"] = (block.slo.attainment, LOWER)
        mine["goodput_req_s"] = (block.goodput.requests_per_s, LOWER)
        figures[name] = mine
    return figures


@dataclass(frozen=True, slots=True, kw_only=True)
class Repeats:
    """K runs of one workload: their ids, verdicts, and per class and figure the spread."""

    run_ids: tuple[str, ...]
    statuses: tuple[str, ...]
    level: float
    figures: Mapping[str, Mapping[str, Spread]]
    worse: Mapping[str, str]  # figure name -> "higher" or "lower"


def repeats_of(summaries: Sequence[Summary], level: float = 0.95) -> Repeats:
    """The spread of every headline figure over `summaries` (one per run, in run order); a
    figure missing from a run (a class it lacked) counts as no value there."""
    per_run = [headline(s) for s in summaries]
    classes = list(dict.fromkeys(c for run in per_run for c in run))
    figures: dict[str, dict[str, Spread]] = {}
    worse: dict[str, str] = {}
    for name in classes:
        names = list(dict.fromkeys(f for run in per_run for f in run.get(name, {})))
        figures[name] = {}
        for figure in names:
            values = [run.get(name, {}).get(figure, (None, HIGHER))[0] for run in per_run]
            figures[name][figure] = spread(values, level)
            worse[figure] = next(run[name][figure][1] for run in per_run
                                 if figure in run.get(name, {}))  # fmt: skip
    return Repeats(run_ids=tuple(s.run_id for s in summaries),
                   statuses=tuple(s.verdict.status for s in summaries), level=level,
                   figures=figures, worse=worse)  # fmt: skip


def to_json(repeats: Repeats) -> dict[str, Any]:
    """repeats.json: the runs, their verdicts, and every figure's spread."""
    return {
        "runs": list(repeats.run_ids),
        "statuses": list(repeats.statuses),
        "level": repeats.level,
        "worse": dict(repeats.worse),
        "classes": {
            name: {figure: _spread_json(s) for figure, s in figures.items()}
            for name, figures in repeats.figures.items()
        },
    }


def _spread_json(s: Spread) -> dict[str, Any]:
    def rounded(v: float | None) -> float | None:
        return None if v is None or not math.isfinite(v) else round(v, 6)

    return {"values": [rounded(v) for v in s.values], "mean": rounded(s.mean),
            "sd": rounded(s.sd), "low": rounded(s.low), "high": rounded(s.high),
            "min": rounded(s.min), "max": rounded(s.max)}  # fmt: skip


def from_json(data: Mapping[str, Any]) -> Repeats:
    """A repeats.json read back (ValueError when it is not one)."""
    try:
        level = float(data["level"])
        figures = {
            str(name): {str(f): Spread(values=tuple(v["values"]), level=level, mean=v["mean"],
                                      sd=v["sd"], low=v["low"], high=v["high"], min=v["min"],
                                      max=v["max"])
                        for f, v in block.items()}
            for name, block in data["classes"].items()
        }  # fmt: skip
        return Repeats(run_ids=tuple(data["runs"]), statuses=tuple(data["statuses"]),
                       level=level, figures=figures, worse=dict(data["worse"]))  # fmt: skip
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a repeats.json ({exc})") from None


# --- two sets of repeats compared ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One figure of one class, BASELINE repeats against CURRENT repeats."""

    class_name: str
    figure: str
    baseline: Spread
    current: Spread
    change: float | None  # current mean − baseline mean
    low: float | None  # Welch t-interval of the change at the level
    high: float | None
    status: Verdict


def welch(a: Spread, b: Spread, level: float) -> tuple[float, float] | None:
    """Welch's t-interval for mean(b) − mean(a) (None without two runs a side)."""
    if a.mean is None or b.mean is None or a.sd is None or b.sd is None:
        return None
    na, nb = len(a.values), len(b.values)
    va, vb = a.sd**2 / na, b.sd**2 / nb
    diff = b.mean - a.mean
    if va + vb == 0:
        return diff, diff
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, df) * math.sqrt(va + vb)
    return diff - half, diff + half


def _beyond_tolerance(figure: str, change: float, baseline: float) -> bool:
    """Is `change` beyond `analysis.compare`'s default tolerance (latencies +10 % of the
    baseline and +2 ms; attainment −1 pp; goodput −10 %), lower being worse for those two?"""
    if figure == "attainment":
        return DEFAULT_TOLERANCES["attainment"].is_exceeded(baseline, -change)
    if figure == "goodput_req_s":
        return DEFAULT_TOLERANCES["goodput"].is_exceeded(baseline, -change)
    return DEFAULT_TOLERANCES["latency"].is_exceeded(baseline, change)


def compare_repeats(baseline: Repeats, current: Repeats) -> list[Change]:
    """Every figure both sides have, judged: REGRESSED when the Welch interval of the change
    lies wholly on the worse side and the change exceeds the tolerance; improved the same
    on the better side; not enough data without two numbers a side; else ok."""
    level = min(baseline.level, current.level)
    changes = []
    for name, figures in current.figures.items():
        for figure, now in figures.items():
            before = baseline.figures.get(name, {}).get(figure)
            if before is None:
                continue
            interval = welch(before, now, level)
            if interval is None or before.mean is None or now.mean is None:
                changes.append(Change(class_name=name, figure=figure, baseline=before,
                                      current=now, change=None, low=None, high=None,
                                      status=NO_DATA))  # fmt: skip
                continue
            change = now.mean - before.mean
            sign = 1.0 if current.worse.get(figure, HIGHER) == HIGHER else -1.0
            worse_low, worse_high = sorted((sign * interval[0], sign * interval[1]))
            status = OK
            if worse_low > 0 and _beyond_tolerance(figure, change, before.mean):
                status = REGRESSED
            elif worse_high < 0 and _beyond_tolerance(figure, -change, before.mean):
                status = IMPROVED
            changes.append(Change(class_name=name, figure=figure, baseline=before,
                                  current=now, change=change, low=interval[0],
                                  high=interval[1], status=status))  # fmt: skip
    return changes


def repeats_exit(changes: Sequence[Change]) -> int:
    """`loadgen compare` of two repeats folders: EXIT_SLO_MISSED (2) when a figure
    REGRESSED, else EXIT_OK."""
    return EXIT_SLO_MISSED if any(c.status == REGRESSED for c in changes) else EXIT_OK


def change_json(change: Change) -> dict[str, Any]:
    """One compared figure as JSON."""

    def rounded(v: float | None) -> float | None:
        return None if v is None or not math.isfinite(v) else round(v, 6)

    return {"class": change.class_name, "figure": change.figure,
            "baseline": _spread_json(change.baseline), "current": _spread_json(change.current),
            "change": rounded(change.change), "low": rounded(change.low),
            "high": rounded(change.high), "status": change.status}  # fmt: skip
