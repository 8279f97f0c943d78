"""Compare: is CURRENT worse than BASELINE, per class and figure, beyond noise and tolerance?

Sits after the records, beside the reports. `load_sides` reads the two sides from run
folders (BASELINE one run, or every run of CURRENT's workload in a trailing window,
pooled); everything else is a pure function of records frames: `compare_sides` computes
each class's figures with confidence intervals and judges every change; `to_json` is the
machine form.

Checks per class (ms figures as in the summary; percentiles nearest rank):
`{ttft,tpot,itl,e2e}_p{50,90,99}` over ok requests (ITL over individual gaps);
`{ttft,e2e}_all_p{50,90,99}` with every failed request ranked worst (+inf);
`attainment` (requests meeting every threshold / all requests) and `error_rate` (non-ok /
all); `goodput_rps` and `goodput_tps` (requests and output tokens per second of requests
meeting every threshold, over the summed durations of the side's runs). CURRENT's SLOs
judge both sides, so attainment and goodput compare like with like.

Like with like also means one workload (`loadgen.workload.identity`: name + fingerprint of the
resolved spec): a baseline window pools only runs of CURRENT's workload, and two runs of
different workloads are not compared unless forced (and the comparison then says so). A
run that stopped before its end (interrupted, watchdog, killed and recovered), or whose
generator fell behind (`analysis.health`: its client's own time could have changed its
verdict), is no measure of the server: it is left out of a baseline window, and refused as
BASELINE or CURRENT with its reason, unless `include_incomplete`. A window with no valid
run of the workload is the first night of a series (`NoBaseline`).

Intervals (two-sided, at `confidence`):

- Percentiles: distribution-free order-statistic intervals [x_(l), x_(u)]. The count K of
  values below the true p-quantile is Binomial(n, p), so P(x_(l) <= xi_p <= x_(u)) =
  F(u-1) - F(l-1); l is the largest rank with F(l-1) <= alpha/2 and u the smallest with
  F(u-1) >= 1 - alpha/2. F is the exact binomial CDF (log-pmf from `math.lgamma`, summed
  over mean ± 12 sd + 10, outside which the mass is negligible), not the normal
  approximation. A rank below 1 or above n means the interval reaches beyond the sample:
  that side is *open* (shown clamped to the sample's min or max). The upper side closes
  once p^n <= alpha/2: n >= 6 for p50, 36 for p90, 368 for p99 at 95 %.
- Shares (attainment, error rate): Wilson score intervals.
- Goodput: the Poisson score interval of the count of requests meeting the SLOs, per
  second of duration (open-loop arrivals are random too: the span of n Poisson arrivals
  has ~1/sqrt(n) relative noise), times output tokens per such request for tokens/s.

The rule, with change = current - baseline signed so that positive is worse:

- REGRESSED when (1) the intervals do not overlap in the worse direction (current's low >
  baseline's high for latencies and error rate; current's high < baseline's low for
  attainment and goodput), both bounds used being closed, AND (2) the point change
  exceeds every limit of the check's tolerance (defaults: latency > +10 % of the baseline
  and > +2 ms; attainment < -1 pp; error rate > +1 pp; goodput < -10 %).
- improved: the same in the better direction.
- not enough data: no values on a side, or a bound the regression test needs is open.
- ok: otherwise.

Under no change, (1) needs one of two bounds to miss the common true value, each with
probability <= alpha/2: at most alpha per check, and ~0.3 % for roughly normal
estimators (two 95 % intervals apart). The intervals assume independent requests;
queueing correlates neighbours, so real uncertainty is wider: the tolerance guards that.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl

from loadgen.analysis import metrics
from loadgen.analysis.audit import recorded_price
from loadgen.analysis.confidence import (
    Estimate,
    Values,
    min_samples,
    percentile_estimate,
    poisson_rate,
    wilson,
)
from loadgen.analysis.cost import per_million as per_million_of
from loadgen.analysis.server import ServerDelta
from loadgen.analysis.slo import per_request
from loadgen.analysis.split import SplitChange, split_changes
from loadgen.codec import to_json as plain
from loadgen.errors import EXIT_OK, EXIT_SLO_MISSED, ConfigError, LoadgenError, OptionError
from loadgen.measures import GAP, SLO_MEASURES
from loadgen.results.records import Outcome
from loadgen.results.runfolder import (
    PARTS_DIR,
    RECORDS_FILE,
    RUN_FILE,
    has_records,
    read_records,
    read_run_info,
)
from loadgen.results.store import RunEntry, discover_runs, read_run_entry
from loadgen.workload.identity import SettingDifference, workload_differences
from loadgen.workload.spec import SloTargets


class Verdict(enum.StrEnum):
    """How one figure of one class changed."""

    OK = "ok"
    IMPROVED = "improved"
    REGRESSED = "REGRESSED"
    NO_DATA = "not enough data"


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One compared figure. `kind`: latency (ms), share (0..1) or rate (per second)."""

    name: str  # ttft_p99, ttft_all_p99, attainment, ...
    family: str  # what a family-wide --tolerance names: ttft, attainment, goodput, ...
    label: str
    kind: str
    higher_is_worse: bool
    percentile: float | None = None
    with_failures: bool = False


def _latency_checks() -> list[Check]:
    """Each measure a target can be set on, over ok requests; and, for those a user waits
    for from the intended send (not a pace, which a failure does not have: TPOT, ITL), with
    every failure ranked worst (`_all`)."""
    pairs = [
        (m, all_)
        for m in SLO_MEASURES
        for all_ in ((False, True) if m.failures_worst and not m.paced else (False,))
    ]
    return [
        Check(name=f"{m.name}{'_all' if all_ else ''}_p{p:g}", family=m.name,
              label=f"{m.label}{'·all' if all_ else ''} p{p:g}", kind="latency",
              higher_is_worse=True, percentile=p, with_failures=all_)
        for m, all_ in pairs
        for p in (50.0, 90.0, 99.0)
    ]  # fmt: skip


_OTHER_CHECKS = (  # name, family, label, kind, higher_is_worse
    ("attainment", "attainment", "attainment", "share", False),
    ("error_rate", "error_rate", "error rate", "share", True),
    ("goodput_rps", "goodput", "goodput req/s", "rate", False),
    ("goodput_tps", "goodput", "goodput tok/s", "rate", False),
)
CHECKS: tuple[Check, ...] = (
    *_latency_checks(),
    *(Check(name=n, family=f, label=lb, kind=k, higher_is_worse=w)
      for n, f, lb, k, w in _OTHER_CHECKS),
)  # fmt: skip
CHECK_NAMES = {c.name for c in CHECKS}


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerance:
    """How much worse a figure may get and still be ok: a change counts only above EVERY
    limit set. `relative` is a fraction of the baseline (0.10 = 10 %); `absolute` is in the
    check's unit (ms, or a share: 0.01 = 1 pp). None: no such limit."""

    relative: float | None = None
    absolute: float | None = None

    def is_exceeded(self, baseline: float, change: float) -> bool:
        """Is `change` (positive = worse) beyond every limit?"""
        if not change > 0:
            return False
        if self.relative is not None and not change > self.relative * abs(baseline):
            return False
        return self.absolute is None or change > self.absolute


DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "latency": Tolerance(relative=0.10, absolute=2.0),
    "attainment": Tolerance(absolute=0.01),
    "error_rate": Tolerance(absolute=0.01),
    "goodput": Tolerance(relative=0.10),
}
_UNITS = {
    "%": ("relative", 0.01),
    "ms": ("absolute", 1.0),
    "s": ("absolute", 1000.0),
    "pp": ("absolute", 0.01),
}


def parse_tolerances(texts: Sequence[str]) -> dict[str, Tolerance]:
    """`ttft_p99=5%`, `ttft_p99=20ms`, `ttft=15%`, `latency=3ms`, `attainment=2pp`,
    `goodput=5%` as overrides by key (a check, a family, or `latency` for every latency).

    Two items for one key merge (`ttft_p99=5%` and `ttft_p99=20ms` set both limits). A sign
    is ignored: a tolerance is a magnitude in the worse direction.
    """
    families = {c.family for c in CHECKS} | {"latency"}
    overrides: dict[str, Tolerance] = {}
    for text in texts:
        key, sep, value = (s.strip() for s in text.partition("="))
        if not sep or key not in CHECK_NAMES | families:
            raise _tolerance_error(f"{text!r} is not CHECK=VALUE with a known check or family")
        unit = next((u for u in ("ms", "pp", "%", "s") if value.endswith(u)), None)
        kind = _kind_of(key)
        allowed = {"latency": ("%", "ms", "s"), "share": ("pp",), "rate": ("%",)}[kind]
        if unit not in allowed:
            raise _tolerance_error(f"{text!r}: {key} takes {' or '.join(allowed)}")
        try:
            number = abs(float(value.removesuffix(unit)))
        except ValueError:
            raise _tolerance_error(f"{text!r}: {value!r} is not a number") from None
        if not math.isfinite(number):
            raise _tolerance_error(f"{text!r}: must be finite")
        field, scale = _UNITS[unit]
        overrides[key] = replace(overrides.get(key, Tolerance()), **{field: number * scale})
    return overrides


def _kind_of(key: str) -> str:
    if key == "latency":
        return "latency"
    return next(c.kind for c in CHECKS if key in (c.name, c.family))


def _tolerance_error(problem: str) -> ConfigError:
    return OptionError(
        "--tolerance",
        problem,
        "e.g. --tolerance ttft_p99=5% --tolerance ttft_p99=20ms "
        "--tolerance attainment=2pp --tolerance goodput=5%",
    )


def tolerance_for(check: Check, overrides: Mapping[str, Tolerance]) -> Tolerance:
    """The default for the check's kind, then `latency`, family and check overrides."""
    default_key = "latency" if check.kind == "latency" else check.family
    tolerance = DEFAULT_TOLERANCES[default_key]
    for key in dict.fromkeys(
        ("latency" if check.kind == "latency" else "", check.family, check.name)
    ):
        if (override := overrides.get(key)) is not None:
            tolerance = Tolerance(
                relative=tolerance.relative if override.relative is None else override.relative,
                absolute=tolerance.absolute if override.absolute is None else override.absolute,
            )
    return tolerance


# --- samples and comparison ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Side:
    """One side of a comparison: the records of one run, or of every run of a window."""

    label: str
    run_ids: tuple[str, ...]
    frame: pl.DataFrame  # records.SCHEMA; runs concatenated
    duration_s: float  # the sum of each run's duration: goodput's denominator
    workload: str = ""  # its workload key (`name@fingerprint`)
    incomplete: tuple[str, ...] = ()  # its runs that stopped early (only when asked for)
    left_out: tuple[str, ...] = ()  # runs of the window it did not pool, each with why
    run_dirs: tuple[Path, ...] = ()  # its run folders (the server's side is read from them)
    cost: float | None = None  # Σ fleet price × duration of its runs; None: a run has no price
    # a forced BASELINE of another workload: each setting that differs from CURRENT's
    workload_differences: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassSample:
    """What one class of one side needs for every check. `values_ms`: sorted ok values of
    ttft, tpot (N > 1), itl (every gap) and e2e."""

    requests: int
    failures: int
    meeting: int
    good_output_tokens: int
    ok_output_tokens: int
    values_ms: Mapping[str, Values]


def class_samples(frame: pl.DataFrame, slos: Mapping[str, SloTargets]) -> dict[str, ClassSample]:
    """Every class of a records frame, judged by `slos` (`slo.per_request`)."""
    rows = per_request(frame, slos=slos)
    samples = {}
    for key, part in rows.partition_by("class", as_dict=True).items():
        name = str(key[0])
        ok = part.filter(pl.col("outcome") == Outcome.OK.value)
        good = part.filter(pl.col("meets_slo"))
        values = {
            m.name: metrics.itl_gaps_ms(frame, name).to_numpy()
            if m.per == GAP
            else ok.get_column(m.column).drop_nulls().sort().to_numpy()
            for m in SLO_MEASURES
        }
        samples[name] = ClassSample(
            requests=part.height,
            failures=part.height - ok.height,
            meeting=good.height,
            good_output_tokens=int(good.get_column("output_tokens").sum()),
            ok_output_tokens=int(ok.get_column("output_tokens").sum()),
            values_ms=values,
        )
    return samples


def estimate(check: Check, sample: ClassSample, duration_s: float, confidence: float) -> Estimate:
    """One figure of one class with its interval (see the module docstring)."""
    if check.percentile is not None:
        failures = sample.failures if check.with_failures else 0
        values = sample.values_ms[check.family]
        return percentile_estimate(values, check.percentile, confidence, failures=failures)
    if check.name == "attainment":
        return wilson(sample.meeting, sample.requests, confidence)
    if check.name == "error_rate":
        return wilson(sample.failures, sample.requests, confidence)
    if check.name == "goodput_rps":
        return poisson_rate(sample.meeting, duration_s, confidence)
    ok = sample.requests - sample.failures
    per_request_tokens = (
        sample.good_output_tokens / sample.meeting
        if sample.meeting
        else sample.ok_output_tokens / ok
        if ok
        else 0.0
    )
    return poisson_rate(sample.meeting, duration_s, confidence, scale=per_request_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """One check of one class: both estimates, the tolerance and the verdict with why."""

    class_name: str
    check: Check
    baseline: Estimate
    current: Estimate
    tolerance: Tolerance
    verdict: Verdict
    reason: str

    @property
    def change(self) -> float | None:
        """current - baseline (0 when both fall on failures); None without both values."""
        base, cur = self.baseline.value, self.current.value
        if base is None or cur is None:
            return None
        return 0.0 if base == cur else cur - base

    @property
    def change_relative(self) -> float | None:
        """change / baseline; None when the baseline is 0, missing or a failure."""
        change, base = self.change, self.baseline.value
        if change is None or base is None or base == 0 or not math.isfinite(base):
            return None
        return change / base


def judge(
    check: Check, base: Estimate, cur: Estimate, tolerance: Tolerance, confidence: float
) -> tuple[Verdict, str]:
    """The verdict of one check and a one-line reason (the rule: the module docstring)."""
    if base.value is None or cur.value is None:
        side = "baseline" if base.value is None else "current"
        return Verdict.NO_DATA, f"no values on the {side} side"
    sign = 1.0 if check.higher_is_worse else -1.0
    worse = 0.0 if base.value == cur.value else sign * (cur.value - base.value)  # inf - inf
    regressed = _is_beyond(cur, base, sign)
    if regressed and tolerance.is_exceeded(base.value, worse):
        return Verdict.REGRESSED, "intervals apart and the change exceeds the tolerance"
    if _is_beyond(base, cur, sign) and tolerance.is_exceeded(base.value, -worse):
        return Verdict.IMPROVED, "intervals apart and the change exceeds the tolerance"
    if regressed is None:
        return Verdict.NO_DATA, _open_reason(check, base, cur, confidence)
    if regressed:
        return Verdict.OK, "intervals apart but the change is within the tolerance"
    if tolerance.is_exceeded(base.value, worse):
        return Verdict.OK, "the change exceeds the tolerance but is within the noise"
    return Verdict.OK, "within the tolerance and the noise"


def _is_beyond(worse: Estimate, other: Estimate, sign: float) -> bool | None:
    """Does `worse`'s interval lie entirely on the worse side of `other`'s (sign +1: higher
    is worse)? None when a bound this needs is open."""
    near, near_open = (worse.low, worse.low_open) if sign > 0 else (worse.high, worse.high_open)
    far, far_open = (other.high, other.high_open) if sign > 0 else (other.low, other.low_open)
    if near_open or far_open or near is None or far is None:
        return None
    return sign * (near - far) > 0


def _open_reason(check: Check, base: Estimate, cur: Estimate, confidence: float) -> str:
    """Why a percentile's regression test cannot be made: how many values it needs."""
    p = check.percentile or 50.0
    below, above = min_samples(p / 100.0, confidence)
    need_base, need_cur = (above, below) if check.higher_is_worse else (below, above)
    return (
        f"a p{p:g} interval inside the sample needs n >= {need_base} (baseline) and "
        f">= {need_cur} (current); have {base.n} and {cur.n}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CostChange:
    """Cost per million (good) output tokens of one class (or `all`) on both sides.

    Informational, never a verdict: at one price it is price / goodput, and goodput has its
    own check with its interval. A side's cost is Σ fleet price × duration of its runs,
    shared by its classes in proportion to their ok output tokens (`analysis.cost`).
    """

    class_name: str
    baseline_per_million: float | None
    current_per_million: float | None
    baseline_per_million_good: float | None
    current_per_million_good: float | None

    @property
    def change_relative(self) -> float | None:
        """current / baseline - 1 of the cost per million good output tokens."""
        base, cur = self.baseline_per_million_good, self.current_per_million_good
        return None if base is None or cur is None or base == 0 else cur / base - 1


def cost_changes(
    base: Mapping[str, ClassSample], cur: Mapping[str, ClassSample], shared: Sequence[str],
    base_cost: float | None, cur_cost: float | None,
) -> tuple[CostChange, ...]:  # fmt: skip
    """Per shared class and over all of them, when both sides have a cost."""
    if base_cost is None or cur_cost is None:
        return ()

    def per_million(cost: float, samples: Mapping[str, ClassSample], names: Sequence[str]
                    ) -> tuple[float | None, float | None]:  # fmt: skip
        total = sum(s.ok_output_tokens for s in samples.values())
        tokens = sum(samples[n].ok_output_tokens for n in names)
        good = sum(samples[n].good_output_tokens for n in names)
        charged = cost * tokens / total if total else 0.0
        return (per_million_of(charged, tokens), per_million_of(charged, good))

    rows = []
    for label, names in [*((n, [n]) for n in shared), ("all", list(shared))]:
        (bm, bg), (cm, cg) = per_million(base_cost, base, names), per_million(cur_cost, cur, names)
        rows.append(CostChange(class_name=label, baseline_per_million=bm, current_per_million=cm,
                               baseline_per_million_good=bg,
                               current_per_million_good=cg))  # fmt: skip
    return tuple(rows)


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Every check of every class both sides have, and the classes only one side has."""

    baseline: str
    current: str
    baseline_runs: tuple[str, ...]
    current_runs: tuple[str, ...]
    confidence: float
    results: tuple[CheckResult, ...]
    only_in_baseline: tuple[str, ...] = ()
    only_in_current: tuple[str, ...] = ()
    baseline_workload: str = ""
    current_workload: str = ""
    incomplete: tuple[str, ...] = ()  # runs on either side that stopped early (asked for)
    left_out: tuple[str, ...] = ()  # runs of the baseline window not pooled, each with why
    cost: tuple[CostChange, ...] = ()  # when both sides' runs have a price
    workload_differences: tuple[str, ...] = ()  # forced: the settings that differ
    splits: tuple[SplitChange, ...] = ()  # where TTFT went on each side, when a server said

    @property
    def forced(self) -> bool:
        """The sides are runs of different workloads, compared because --force asked."""
        return self.baseline_workload != self.current_workload

    @property
    def regressions(self) -> tuple[CheckResult, ...]:
        """The checks that REGRESSED."""
        return tuple(r for r in self.results if r.verdict is Verdict.REGRESSED)

    @property
    def exit_code(self) -> int:
        """The checks' exit: EXIT_SLO_MISSED (2, regressed) when one REGRESSED, else 0."""
        return EXIT_SLO_MISSED if self.regressions else EXIT_OK


def compare_sides(
    baseline: Side,
    current: Side,
    *,
    slos: Mapping[str, SloTargets],
    tolerances: Mapping[str, Tolerance] | None = None,
    confidence: float = 0.95,
    classes: Sequence[str] = (),
) -> Comparison:
    """Judge every check of every class both sides share (or of `classes`).

    Raises ConfigError when no class is shared, or a named class is on neither side.
    """
    if not 0.5 <= confidence < 1.0:
        raise OptionError("--confidence", f"must be in [0.5, 1) (got {confidence})")
    base_samples = class_samples(baseline.frame, slos)
    cur_samples = class_samples(current.frame, slos)
    names = _chosen_classes(base_samples, cur_samples, classes)
    shared = [n for n in names if n in base_samples and n in cur_samples]
    if not shared:
        raise OptionError(
            "BASELINE/CURRENT",
            f"no class to compare: baseline has {_names(base_samples)}, current has "
            f"{_names(cur_samples)}",
            "compare runs of the same workload, or pick --class",
        )
    results = []
    for name in shared:
        for check in CHECKS:
            base = estimate(check, base_samples[name], baseline.duration_s, confidence)
            cur = estimate(check, cur_samples[name], current.duration_s, confidence)
            tolerance = tolerance_for(check, tolerances or {})
            verdict, reason = judge(check, base, cur, tolerance, confidence)
            results.append(
                CheckResult(
                    class_name=name,
                    check=check,
                    baseline=base,
                    current=cur,
                    tolerance=tolerance,
                    verdict=verdict,
                    reason=reason,
                )
            )
    return Comparison(
        baseline=baseline.label,
        current=current.label,
        baseline_runs=baseline.run_ids,
        current_runs=current.run_ids,
        confidence=confidence,
        results=tuple(results),
        only_in_baseline=tuple(n for n in names if n not in cur_samples),
        only_in_current=tuple(n for n in names if n not in base_samples),
        baseline_workload=baseline.workload,
        current_workload=current.workload,
        incomplete=(*baseline.incomplete, *current.incomplete),
        left_out=baseline.left_out,
        cost=cost_changes(base_samples, cur_samples, shared, baseline.cost, current.cost),
        workload_differences=baseline.workload_differences,
        splits=split_changes(
            per_request(baseline.frame, slos=slos),
            per_request(current.frame, slos=slos),
            shared,
            slos,
        ),
    )


def _chosen_classes(
    base: Mapping[str, ClassSample], cur: Mapping[str, ClassSample], classes: Sequence[str]
) -> list[str]:
    found = sorted(set(base) | set(cur))
    unknown = [c for c in classes if c not in found]
    if unknown:
        raise OptionError(
            "--class",
            f"no class {', '.join(map(repr, unknown))} on either side",
            f"classes found: {', '.join(found) or 'none'}",
        )
    return [c for c in found if c in classes] if classes else found


def _names(samples: Mapping[str, ClassSample]) -> str:
    return ", ".join(sorted(samples)) or "no requests"


# --- reading run folders: the only I/O ----------------------------------------------------


def load_sides(
    current_dir: Path,
    *,
    baseline_dir: Path | None = None,
    window: timedelta | None = None,
    store: Path | None = None,
    force: bool = False,
    include_incomplete: bool = False,
) -> tuple[Side, Side, dict[str, SloTargets]]:
    """(baseline, current, CURRENT's SLOs) read from run folders.

    The baseline is BASELINE's run folder, or every run of CURRENT's workload in `store`
    (default: CURRENT's parent folder) whose t0 lies in [CURRENT's t0 - window, CURRENT's
    t0), CURRENT itself excluded, their records pooled. Runs that stopped early are left
    out of the window, and refused as a side (`RefusedSide`), unless `include_incomplete`;
    so are runs whose generator fell behind. A BASELINE of another workload is refused
    unless `force`. NoBaseline when the window holds no valid run of CURRENT's workload;
    LoadgenError when a folder is not a run.
    """
    current_entry = _run_entry(current_dir)
    _check_complete(current_entry, "CURRENT", include_incomplete)
    current = _read_side([current_entry], current_entry.run_id)
    if baseline_dir is not None:
        entries = [_run_entry(baseline_dir)]
        _check_complete(entries[0], "BASELINE", include_incomplete)
        differences = _check_same_workload(entries[0], current_entry, force)
        side = replace(_read_side(entries, entries[0].run_id), workload_differences=differences)
        return side, current, dict(current_entry.slos)
    if window is not None:
        folder = current_dir.parent if store is None else store
        entries, left_out = _window_runs(folder, current_entry, window, include_incomplete)
        frames, damaged = _readable_records(entries)
        entries = [e for e in entries if e.run_id in frames]
        if not entries:
            raise LoadgenError(f"{folder}: every run of the baseline window is damaged: "
                               + "; ".join(damaged))  # fmt: skip
        label = (
            f"{len(entries)} run{'s' if len(entries) > 1 else ''} "
            f"{entries[0].started:%Y-%m-%d %H:%M}–{entries[-1].started:%Y-%m-%d %H:%M} UTC"
        )
        side = _read_side(entries, label, [frames[e.run_id] for e in entries])
        return replace(side, left_out=(*left_out, *damaged)), current, dict(current_entry.slos)
    raise ValueError("give baseline_dir or window")


class NoBaseline(LoadgenError):
    """The baseline window holds no valid run of CURRENT's workload: the first night of a
    nightly series (`loadgen compare` says "no baseline yet" and exits 0)."""

    exit_code = EXIT_OK


class RefusedSide(LoadgenError):
    """BASELINE or CURRENT is no measure of the server (it stopped before its end, or its
    generator fell behind): nothing is compared (exit 1), and the message says why."""


def compare_exit(comparison: Comparison, server: Sequence[ServerDelta] = ()) -> int:
    """`loadgen compare`'s exit: EXIT_SLO_MISSED (2, regressed) when a check REGRESSED or a
    server figure passed its threshold, else EXIT_OK."""
    regressed = comparison.regressions or any(delta.regressed for delta in server)
    return EXIT_SLO_MISSED if regressed else EXIT_OK


def duration_text(window: timedelta) -> str:
    """`30 days`, `12 hours`, `90 minutes`, `45 seconds`: a window in words, not `0:00:00`."""
    seconds = window.total_seconds()
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} seconds"


def _window_runs(
    folder: Path, current: RunEntry, window: timedelta, include_incomplete: bool
) -> tuple[list[RunEntry], tuple[str, ...]]:
    """The runs of CURRENT's workload that started in the window before it, and the window's
    other runs, each with why it was left out (its workload, or why it is no measure of the
    server). NoBaseline when none is left: the first night of a series."""
    if not folder.is_dir():
        raise LoadgenError(f"--store {folder}: no such folder (give the results store that "
                           "`loadgen run --out` writes to)")  # fmt: skip
    end = current.started_unix_ns
    start = end - (window // timedelta(microseconds=1)) * 1000
    this = current.run_dir.resolve()
    unreadable: list[str] = []
    in_window = [
        e
        for e in discover_runs(folder, unreadable)
        if start <= e.started_unix_ns < end and e.run_dir.resolve() != this
    ]
    entries = [e for e in in_window if e.workload_key == current.workload_key
               and (include_incomplete or e.is_complete)]  # fmt: skip
    if not entries:
        others = [_versus(e, current) for e in _latest_per_workload(in_window, current)]
        invalid = [f"{e.run_id} ({e.invalid})" for e in in_window
                   if e.workload_key == current.workload_key and not e.is_complete]  # fmt: skip
        held = (f"; it holds {len(in_window)} other run{'s' if len(in_window) != 1 else ''} "
                "in that window" + (f", of workloads {', '.join(others)}" if others else "")
                + (f", and of this workload only runs that are no measure of the server: "
                   f"{'; '.join(invalid)} (--include-incomplete pools them)" if invalid else "")
                ) if in_window else ""  # fmt: skip
        raise NoBaseline(
            f"no baseline yet: {folder} holds no valid run of workload {current.workload_key} "
            f"started in the {duration_text(window)} before {current.run_id} "
            f"({current.started:%Y-%m-%d %H:%M} UTC){held}. Tonight's run is the first of the "
            "series: later nights compare with it"
        )
    pooled = {e.run_id for e in entries}
    left_out = tuple(
        f"{e.run_id} ({e.workload_key if e.workload_key != current.workload_key else e.invalid})"
        for e in in_window
        if e.run_id not in pooled
    )
    return entries, (*left_out, *unreadable)


def _readable_records(entries: Sequence[RunEntry]) -> tuple[dict[str, pl.DataFrame], list[str]]:
    """Each entry's records by run id, and each run whose records are damaged, with why
    (left out of a pooled baseline, not a reason to refuse the whole window)."""
    frames: dict[str, pl.DataFrame] = {}
    damaged: list[str] = []
    for entry in entries:
        try:
            frames[entry.run_id] = read_records(entry.run_dir)
        except LoadgenError as exc:
            damaged.append(f"{entry.run_id} ({exc})")
    return frames, damaged


SHOWN_DIFFERENCES = 5  # settings named in a refusal; the rest are counted


def _latest_per_workload(entries: Sequence[RunEntry], current: RunEntry) -> list[RunEntry]:
    """The latest run of each workload other than CURRENT's, by workload key."""
    latest = {e.workload_key: e for e in entries if e.workload_key != current.workload_key}
    return [latest[key] for key in sorted(latest)]


def _versus(entry: RunEntry, current: RunEntry) -> str:
    """`chat@1a2b3c4d (classes.chat.arrival.rate_per_s: 12 vs 4)`: a workload key and, up
    to `SHOWN_DIFFERENCES`, how its latest run's settings differ from CURRENT's."""
    differences = workload_differences(plain(read_run_info(entry.run_dir)),
                                       plain(read_run_info(current.run_dir)))  # fmt: skip
    if not differences:
        return entry.workload_key
    return f"{entry.workload_key} (it vs CURRENT: {_named(differences)})"


def _named(differences: Sequence[SettingDifference]) -> str:
    """The first `SHOWN_DIFFERENCES` differences described, and how many more."""
    named = "; ".join(d.describe() for d in differences[:SHOWN_DIFFERENCES])
    more = len(differences) - SHOWN_DIFFERENCES
    return named + (f"; and {more} more" if more > 0 else "")


def _check_complete(entry: RunEntry, side: str, include_incomplete: bool) -> None:
    """RefusedSide when the run is no measure of the server, unless `include_incomplete`."""
    if include_incomplete or entry.is_complete:
        return
    why = ("its unsent and cancelled requests are not the server's" if entry.stopped
           else "its latencies cannot tell the server's part from the client's")  # fmt: skip
    raise RefusedSide(
        f"{side} {entry.run_id} is not compared: {entry.invalid}; {why}, so it is no measure "
        "to compare. Rerun it, or add --include-incomplete to compare its figures anyway"
    )


def _check_same_workload(baseline: RunEntry, current: RunEntry, force: bool) -> tuple[str, ...]:
    """Nothing for runs of one workload; else what differs between them (BASELINE's value
    first), when `force`; else LoadgenError naming each setting and how to align it."""
    if baseline.workload_key == current.workload_key:
        return ()
    differences = workload_differences(plain(read_run_info(baseline.run_dir)),
                                       plain(read_run_info(current.run_dir)))  # fmt: skip
    if force:
        return tuple(d.describe() for d in differences) or (_NO_SETTING,)
    head = (f"BASELINE {baseline.run_id} and CURRENT {current.run_id} are runs of different "
            f"workloads ({baseline.workload_key} vs {current.workload_key}), so a change "
            "between them is not a regression")  # fmt: skip
    if not differences:
        raise LoadgenError(f"{head}: {_NO_SETTING}; rerun BASELINE with this loadgen, or add "
                           "--force to compare them anyway (the output says so)")  # fmt: skip
    remedies = "; ".join(dict.fromkeys(d.remedy() for d in differences[:SHOWN_DIFFERENCES]))
    raise LoadgenError(
        f"{head}. They differ in (BASELINE vs CURRENT) {_named(differences)}. To compare "
        f"them: {remedies}; or add --force to compare them anyway (the output says so)"
    )


# Two runs whose recorded keys differ while every setting this loadgen hashes is alike.
_NO_SETTING = ("no setting this loadgen hashes differs: their keys were recorded under "
               "another fingerprint rule (an older or newer loadgen)")  # fmt: skip


def _run_entry(run_dir: Path) -> RunEntry:
    if not (run_dir / RUN_FILE).is_file():
        raise LoadgenError(
            f"{run_dir} is not a run folder: it has no {RUN_FILE} "
            "(give a folder `loadgen run` wrote, e.g. reports/<run-id>)"
        )
    if not has_records(run_dir):
        raise LoadgenError(f"{run_dir} has no {RECORDS_FILE} (nor {PARTS_DIR})")
    return read_run_entry(run_dir)


def _read_side(
    entries: Sequence[RunEntry], label: str, frames: Sequence[pl.DataFrame] | None = None
) -> Side:
    frames = [read_records(e.run_dir) for e in entries] if frames is None else frames
    return Side(
        label=label,
        run_ids=tuple(e.run_id for e in entries),
        frame=pl.concat(frames, how="diagonal_relaxed"),
        duration_s=sum(metrics.run_duration_s(f) for f in frames),
        workload=entries[0].workload_key,
        incomplete=tuple(e.run_id for e in entries if not e.is_complete),
        run_dirs=tuple(e.run_dir for e in entries),
        cost=_side_cost(entries, frames),
    )


def _side_cost(entries: Sequence[RunEntry], frames: Sequence[pl.DataFrame]) -> float | None:
    """Σ fleet price per hour × duration of the runs; None when any run has no price."""
    total = 0.0
    for entry, frame in zip(entries, frames, strict=True):
        price = recorded_price(read_run_info(entry.run_dir))
        if price is None:
            return None
        total += price.fleet_per_hour * metrics.run_duration_s(frame) / 3600
    return total


# --- JSON ---------------------------------------------------------------------------------


def unit_of(check: Check) -> str:
    """The unit of a check's values: ms, share (0..1), req/s or tokens/s."""
    if check.kind == "rate":
        return "req/s" if check.name == "goodput_rps" else "tokens/s"
    return "ms" if check.kind == "latency" else "share"


def to_json(comparison: Comparison) -> dict[str, Any]:
    """The comparison for machines: per class and check, both estimates (null where a
    value falls on a failure or there is none; `n` tells which), change, tolerance, verdict."""
    classes: dict[str, dict[str, Any]] = {}
    for r in comparison.results:
        classes.setdefault(r.class_name, {})[r.check.name] = {
            "label": r.check.label,
            "unit": unit_of(r.check),
            "baseline": _estimate_json(r.baseline),
            "current": _estimate_json(r.current),
            "change": _number(r.change),
            "change_relative": _number(r.change_relative),
            "tolerance": {"relative": r.tolerance.relative, "absolute": r.tolerance.absolute},
            "verdict": str(r.verdict),
            "reason": r.reason,
        }
    return {
        "baseline": {
            "label": comparison.baseline,
            "runs": list(comparison.baseline_runs),
            "workload": comparison.baseline_workload,
            "left_out": list(comparison.left_out),
        },
        "current": {
            "label": comparison.current,
            "runs": list(comparison.current_runs),
            "workload": comparison.current_workload,
        },
        "forced": comparison.forced,  # different workloads, compared because --force asked
        "workload_differences": list(comparison.workload_differences),  # what differs, forced
        "incomplete_runs": list(comparison.incomplete),
        "confidence": comparison.confidence,
        "classes": classes,
        "only_in_baseline": list(comparison.only_in_baseline),
        "only_in_current": list(comparison.only_in_current),
        "regressions": [f"{r.class_name}.{r.check.name}" for r in comparison.regressions],
        "exit_code": comparison.exit_code,
        "cost": {
            c.class_name: {
                "baseline_per_million_output_tokens": _number(c.baseline_per_million),
                "current_per_million_output_tokens": _number(c.current_per_million),
                "baseline_per_million_good_output_tokens": _number(c.baseline_per_million_good),
                "current_per_million_good_output_tokens": _number(c.current_per_million_good),
                "change_relative": _number(c.change_relative),
            }
            for c in comparison.cost
        }
        or None,
        "ttft_split": {
            c.class_name: {
                "percentile": c.percentile,
                "baseline": None if c.baseline is None else plain(c.baseline),
                "current": None if c.current is None else plain(c.current),
                "baseline_requests": c.baseline_requests,
                "current_requests": c.current_requests,
            }
            for c in comparison.splits
        }
        or None,
    }


def _estimate_json(e: Estimate) -> dict[str, Any]:
    return {
        "value": _number(e.value),
        "low": _number(e.low),
        "high": _number(e.high),
        "low_open": e.low_open,
        "high_open": e.high_open,
        "n": e.n,
        "ranks": list(e.ranks) if e.ranks is not None else None,
    }


def _number(value: float | None) -> float | None:
    return round(value, 6) if value is not None and math.isfinite(value) else None
