"""A capacity search's results, and the judging of one step from its records.

The types a search returns (`Step`, `Search`, `Verdict`), the verdict against a proposed
limit and the exit code, capacity.json, and `audit_step`: pure functions of a step's
records and spec, so `loadgen.render` draws them and `loadgen.studies.capacity`, which
runs the steps, judges each with them.

A step passes only when it reached a steady state at the offered load and met every SLO
there (`audit_step`, with the evidence from `loadgen.analysis.steady`):

1. the generator kept up, by the generator-health rule (`analysis.health`): no request
   failed in the client, its sends kept the schedule's rate within RATE_TOLERANCE, and its
   own time could not have changed the SLO verdict, unless the server failed the step on
   its own (3, 4); else the step is *invalid*: its numbers describe the client;
2. it is long enough: each class with a percentile SLO has its `min_requests` after the
   warm-up, and the judged part lasted at least `min_lifetimes` (20) mean lifetimes of its
   own requests (intended → end), so that a request's whole life repeats many times;
3. it completed (any outcome) within RATE_TOLERANCE (3 %) of the offered rate over the
   judged part, and below the server's measured capacity (the highest ok-completion rate
   of any over-saturated step, less the same tolerance);
4. neither the requests in flight nor the TTFT rose across the judged part beyond what
   the slices' scatter allows and beyond one request's worth of queue (both timed from
   each request's dispatch: a generator whose lag grows is judged by 1, not taken for a
   queue at the server);
5. every SLO was MET over the judged part, at its confidence (`analysis.slo`: the
   percentile's one-sided order-statistic bound meets the target), not merely its point
   estimate.

A step whose SLOs are neither MET nor MISSED (a target within its interval, or too few
requests to bound the percentile), and that is otherwise steady, is *inconclusive*: the
search runs it again longer (`studies.capacity`), and one still inconclusive at the bound
counts as not passing: it bounds the knee from above like a failure, since a pass must be
shown.

A step that fails 3 is *over-saturated*: its ok-completion rate is what the server served
overloaded, so no load at or above it (less RATE_TOLERANCE: the ceiling) is run again
(over-saturation stops the search early); unless more than RATE_TOLERANCE of its requests
failed: a server that spends its capacity on requests that time out serves fewer ok than
it can (goodput collapse), so that rate bounds nothing and the step is a failure like any
other. A step that passed at or above the ceiling
stands when its own ok completions served at least the ceiling (`Step.served`: the server
serves less overloaded than at its knee, and the steady step's own measure wins; the
ceiling then no longer bounds the knee); one that served less passed on a lull, and is
re-judged a failure, saying so (`studies.capacity`). A step that would pass but is too
short (2) is run once more, longer (planned from its own measured lifetime).

Closed-loop steps (`--param max_in_flight`, see `loadgen.studies.capacity`) are judged from
the send, on counts, lifetimes, a held cap and the SLOs; their rate and trends are shown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from loadgen import codec
from loadgen.analysis.audit import audit
from loadgen.analysis.confidence import INCONCLUSIVE, INTERVAL, MET, MISSED
from loadgen.analysis.health import RATE_TOLERANCE as RATE_TOLERANCE  # re-exported: the one figure
from loadgen.analysis.health import short_of_rate
from loadgen.analysis.objectives import Objective
from loadgen.analysis.steady import Steadiness, Trend, judged_window, steadiness
from loadgen.errors import EXIT_FELL_BEHIND, EXIT_INTERRUPTED, EXIT_OK, EXIT_SLO_MISSED, ConfigError
from loadgen.measures import TPOT, TTFT
from loadgen.results.summary import Check, ClassAudit, FailureRankedStats, SplitPoint, Summary
from loadgen.units import NS_PER_S
from loadgen.workload.spec import WorkloadSpec, offered_rate

PASS, FAIL, INVALID, INTERRUPTED = "pass", "fail", "invalid", "interrupted"
UNDECIDED = INCONCLUSIVE  # a steady step whose SLOs are neither met nor missed: run longer
SHORT = "short"  # internal: would pass but the step was too short; run again, longer
MIN_LIFETIMES = 20.0  # the judged part lasts at least this many mean request lifetimes
WARMUP_LIFETIMES = 2.0  # the warm-up lasts at least this many (the in-flight count settles)
MAX_WARMUP_SHARE = 1 / 3  # the default warm-up never takes more of a step than this


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassFigures:
    """One class at one step, judged after the warm-up."""

    requests: int  # judged (after the warm-up)
    required: int | None  # the min-requests rule for its percentile (None: no percentile SLO)
    percentile: float
    attainment: float | None
    met: bool
    ttft_ms: float | None  # at the SLO percentile, failures worst (None: falls on a failure)
    tpot_ms: float | None
    ttft_slo_ms: float | None
    tpot_slo_ms: float | None
    # The class's verdict at its confidence, and its TTFT/TPOT checks' one-sided bounds
    # (None: no such check, or the bound open or on a failure; `analysis.slo`): `_open`
    # says which (True: open, the sample too small to reach it).
    verdict: str = MET
    confidence: float | None = None
    ttft_low_ms: float | None = None
    ttft_high_ms: float | None = None
    tpot_low_ms: float | None = None
    tpot_high_ms: float | None = None
    ttft_low_open: bool = False
    ttft_high_open: bool = False
    tpot_low_open: bool = False
    tpot_high_open: bool = False
    why: str | None = None  # an inconclusive class: which check, and why
    # Where TTFT went at the TTFT target's percentile (else p90), by the server's account
    # (`analysis.split`; None: the server said no request's queue and prefill)
    ttft_split: SplitPoint | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One load step's verdict (`pass`, `fail`, `invalid`, `interrupted`), reason and figures."""

    load: float
    status: str
    note: str = ""  # the verdict's reason (and anything else the reader should know)
    requests: int = 0
    duration_s: float = 0.0
    attainment: float | None = None  # meeting / judged, over every class
    goodput_req_per_s: float | None = None
    goodput_tok_per_s: float | None = None
    throughput_tok_per_s: float | None = None  # every output token, late or not
    classes: Mapping[str, ClassFigures] = field(default_factory=dict)
    run_dir: str | None = None
    steady: Steadiness | None = None  # the steady-state evidence of the judged part
    warmup_s: float | None = None  # what was left out at the start
    min_lifetimes: float = MIN_LIFETIMES
    # over-saturated: the load the server served ok (None: not over-saturated, or more than
    # RATE_TOLERANCE of its requests failed, when what it served ok is no ceiling)
    capacity_load: float | None = None
    # The load its ok completions served (`served_load`: against the nominal rate, in load
    # units; None for a closed loop or a step with no judged part).
    served: float | None = None
    # Why it failed, in a few words each (`over-saturated`, `TTFT rising`, `missed: chat`,
    # ...): what knee.png labels a failing step with.
    reasons: tuple[str, ...] = ()
    attempts: int = 1  # runs of this load (too short, or inconclusive: run again, longer)
    closed_loop: bool = False  # a max_in_flight step: rate and trends shown, not judged
    extended: float = 1.0  # the judged run's length against the planned one (inconclusive)

    @property
    def over_saturated(self) -> bool:
        """True when the server completed less than the offered load (see `audit_step`)."""
        return self.capacity_load is not None or "over-saturated" in self.reasons


@dataclass(frozen=True, slots=True, kw_only=True)
class Search:
    """Every step in the order run, and what they bracket."""

    steps: tuple[Step, ...]
    highest_pass: float | None
    first_fail: float | None  # the lowest failing load that was run
    stopped_by: Step | None = None  # an invalid or interrupted step that ended the search
    capacity: float | None = None  # the highest load an over-saturated step served
    first_undecided: float | None = None  # the lowest load still inconclusive when extended

    @property
    def ceiling(self) -> float | None:
        """The measured capacity less RATE_TOLERANCE: no load at or above it is run, and a
        pass there stands only if its own ok completions served it (`studies.capacity`)."""
        return None if self.capacity is None else self.capacity * (1 - RATE_TOLERANCE)

    @property
    def ceiling_holds(self) -> bool:
        """The ceiling bounds the knee: no pass stands at or above it (one that does served
        more steadily than the over-saturated step did: the server serves less overloaded
        than at its knee, and its own measure wins)."""
        ceiling = self.ceiling
        return ceiling is not None and (self.highest_pass is None or self.highest_pass < ceiling)

    @property
    def upper(self) -> float | None:
        """The lowest load not shown to pass: the first fail, the first step inconclusive
        however long it ran, or the ceiling while it holds, whichever is lowest. The knee
        lies in [highest_pass, upper): the bracket it is known to."""
        ceiling = self.ceiling if self.ceiling_holds else None
        known = [v for v in (self.first_fail, self.first_undecided, ceiling) if v is not None]
        return min(known) if known else None

    @property
    def knee_found(self) -> bool:
        """A passing load with a failing one (or the capacity bound) above it."""
        return self.highest_pass is not None and self.upper is not None

    @property
    def margin(self) -> float | None:
        """How far the highest pass lies below the upper bound, as a share of it."""
        if self.highest_pass is None or self.upper is None:
            return None
        return (self.upper - self.highest_pass) / self.upper


NOT_JUDGED = "not judged"


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A proposed limit against the search: pass only if limit <= highest pass × (1 − margin);
    `not judged` when it did not pass and a step the generator could not run (invalid) lay
    where a pass would have allowed it: the answer is the client's to give, not the server's."""

    proposed: float
    allowed: float | None  # the largest limit that would pass
    passed: bool
    reason: str
    status: str = FAIL  # pass, fail or not judged


def min_requests(percentile: float, min_tail: int = 10) -> int:
    """Requests so that `min_tail` lie beyond the nearest-rank percentile: ⌈tail/(1 − p/100)⌉."""
    if not 0 < percentile < 100:
        raise ValueError(
            f"a p{percentile:g} is decided by the worst request whatever the count: "
            "no step length makes it trustworthy"
        )
    # round() first: 10 / (1 - 0.99) is 1000.0000000000009 in floats, not 1000
    return math.ceil(round(min_tail * 100 / (100 - percentile), 6))


def judge(found: Search, proposed: float, *, safety_margin: float = 0.10) -> Verdict:
    """Pass only if `proposed` <= highest passing load × (1 − safety_margin); a limit not
    shown to pass is `not judged` when the search stopped at an invalid step and the load
    that would have allowed it (proposed / (1 − margin)) was never judged: below the knee's
    upper bound, or with none."""
    allowed = None if found.highest_pass is None else found.highest_pass * (1 - safety_margin)
    passed = allowed is not None and proposed <= allowed * (1 + 1e-9)
    if allowed is None:
        reason = "no load passed every SLO"
    else:
        relation = "<=" if passed else ">"
        reason = (
            f"{proposed:g} {relation} {allowed:g} (highest passing load "
            f"{found.highest_pass:g} less the {safety_margin:.0%} safety margin)"
        )
    status = PASS if passed else FAIL
    stopped = found.stopped_by
    needed = proposed / (1 - safety_margin)
    unjudged = found.upper is None or found.upper > needed  # a pass there: never ruled out
    if not passed and stopped is not None and stopped.status == INVALID and unjudged:
        status = NOT_JUDGED
        reason += (
            f"; a pass at {needed:.3g} would have allowed it, and the search stopped "
            f"at {stopped.load:.3g}, whose step the generator could not run"
        )
    return Verdict(proposed=proposed, allowed=allowed, passed=passed, reason=reason,
                   status=status)  # fmt: skip


EXIT_PASS, EXIT_FAIL = EXIT_OK, EXIT_SLO_MISSED  # the proposed limit passes, fails


def exit_code(found: Search, verdict: Verdict | None) -> int:
    """0 pass (or, without a proposed limit, a knee found); 2 fail or no knee in range;
    3 the generator fell behind before the answer was known (the limit `not judged`, or,
    without one, no load above the last pass judged); 130 interrupted."""
    stopped = found.stopped_by
    if stopped is not None and stopped.status == INTERRUPTED:
        return EXIT_INTERRUPTED
    if verdict is not None:
        if verdict.passed:
            return EXIT_PASS
        return EXIT_FELL_BEHIND if verdict.status == NOT_JUDGED else EXIT_FAIL
    if found.knee_found:
        return EXIT_PASS
    if stopped is not None and found.upper is None:
        return EXIT_FELL_BEHIND  # load above the last pass (or any load at all) never judged
    return EXIT_FAIL


def required_requests(spec: WorkloadSpec, min_tail: int) -> dict[str, int]:
    """The min-requests rule per class with a percentile SLO (batches are judged whole)."""
    required = {}
    for name, cls in spec.classes.items():
        if cls.kind == "summarization" or not cls.slo.thresholds_ms():
            continue
        try:
            required[name] = min_requests(cls.slo.percentile, min_tail)
        except ValueError as exc:
            raise ConfigError(
                spec.source, f"classes.{name}.slo.percentile", str(exc), "use e.g. 99 or 99.9"
            ) from None
    return required


def base_rate_per_s(spec: WorkloadSpec) -> float | None:
    """What load 1.0 means in rate mode: the file's open-loop arrivals per second
    (`workload.spec.offered_rate`, the one definition `--rate` uses too); None when a class
    replays a trace."""
    return offered_rate(spec).per_s


def audit_step(
    frame: pl.DataFrame,
    spec: WorkloadSpec,
    load: float,
    *,
    min_tail: int,
    warmup_s: float | None,
    from_send: bool,
    client_failed: bool,
    run_dir: str | None = None,
    min_lifetimes: float = MIN_LIFETIMES,
    steady_checks: bool = True,
    lag_bound_ms: float | None = None,
    rule: str = INTERVAL,
    joined: pl.DataFrame | None = None,
) -> Step:
    """Drop the warm-up, re-audit what is left, and give the step its status and reason.

    Warm-up: records intended before first intended + `warmup_s`; by default the larger of
    10 % of the sending period and WARMUP_LIFETIMES mean lifetimes of the step's requests.
    A closed-loop batch class is judged whole (a batch is one batch), warm-up included.
    `from_send` measures every latency from the send instead of the intended time
    (closed-loop cap steps). `client_failed`: requests of the whole run (warm-up included)
    failed in the client itself. `lag_bound_ms` is the run's: the re-audit judges the
    generator by the same rule (`analysis.health`) and bound; `rule` judges the SLOs
    (`interval` or `point`).
    `steady_checks=False` is the old rule (counts and SLOs only), kept so tests can show
    what the steady-state checks catch. `joined`: per record, the server's fields from its
    joined span (`analysis.audit.joined_fields`; the step's `--otlp-receiver`), which the
    classes' TTFT split prefers to the stream's.
    """
    if from_send:
        frame = frame.with_columns(pl.coalesce("sent_ns", "intended_ns").alias("intended_ns"))
    if frame.height == 0:
        return Step(load=load, status=INVALID, note="the step recorded no request")
    cut, end = judged_window(frame, warmup_s)
    if warmup_s is None and steady_checks:
        cut = max(cut, _lifetime_cut(frame, end))
    # A closed-loop batch is one batch, judged whole (its deadline is a fact of the step):
    # cut at the warm-up it could end before the judged part and be "missed" with no record.
    # (A summarization class with `concurrency`: --param max_in_flight makes every class a
    # closed loop, and those are cut at the warm-up like any stream of requests.)
    batches = [name for name, cls in spec.classes.items()
               if cls.kind == "summarization" and cls.concurrency is not None]  # fmt: skip
    kept = frame.filter((pl.col("intended_ns") >= cut) | pl.col("class").is_in(batches))
    objectives = {name: Objective.of(cls) for name, cls in spec.classes.items()}
    summary = audit(kept, run_id="step", objectives=objectives, planned=kept.height,
                    lag_bound_ms=lag_bound_ms, rule=rule,
                    path_buffers=spec.target.path_buffers, joined=joined)  # fmt: skip
    required = required_requests(spec, min_tail)
    classes = {
        name: class_figures(block, required.get(name))
        for name, block in summary.classes.items()
        if name in spec.classes
    }
    steady = steadiness(frame if from_send else _from_dispatch(frame), cut, end)
    served = None if from_send else served_load(frame, spec, load, cut, end)
    failed = None if from_send else failed_share(frame, spec, cut, end)
    status, note, capacity = _status(
        summary, classes, steady, client_failed, load=load, min_lifetimes=min_lifetimes,
        closed_loop=from_send, steady_checks=steady_checks, served_load=served,
        failed_share=failed,
    )  # fmt: skip
    step = _step_of(summary, classes, load, status, note, kept, run_dir)
    first = int(frame["intended_ns"].min())  # type: ignore[arg-type]  # non-empty ints
    return replace(
        step, steady=steady, warmup_s=(cut - first) / NS_PER_S, min_lifetimes=min_lifetimes,
        capacity_load=capacity, closed_loop=from_send, served=served,
        reasons=fail_reasons(note) if status == FAIL else (),
    )  # fmt: skip


_REASON_TAGS = (("over-saturated", "over-saturated"), ("in flight rising", "in flight rising"),
                ("TTFT from intended rising", "TTFT rising"), ("missed: ", "missed"),
                ("lifetime grew", "too short"), ("trace replay lasts", "too short"),
                ("re-judged", "re-judged"))  # fmt: skip


def fail_reasons(note: str) -> tuple[str, ...]:
    """A failing step's reasons in a few words each, in the order `_status` gives them
    (`missed: chat` keeps the classes)."""
    tags = []
    for part in note.split("; "):
        for key, tag in _REASON_TAGS:
            if key in part:
                tags.append(part.split(" (")[0] if tag == "missed" else tag)
                break
    return tuple(dict.fromkeys(tags))


def _from_dispatch(frame: pl.DataFrame) -> pl.DataFrame:
    """The records timed from each request's dispatch (the moment the generator started it):
    the steady-state evidence is the server's, and the generator's own lag (its growth is
    the rate its sends kept) is judged once, by `analysis.health`."""
    return frame.with_columns(pl.coalesce("dispatched_ns", "intended_ns").alias("intended_ns"))


def served_load(
    frame: pl.DataFrame, spec: WorkloadSpec, load: float, cut_ns: int, end_ns: int
) -> float | None:
    """The load (in search units) the server served in [cut, end]: the ok completions of
    the classes the load scales, over their nominal rate at this load, × the load. Against
    the nominal rate, not the offered count, so a Poisson lull does not inflate it."""
    scaled = [name for name, cls in spec.classes.items() if cls.concurrency is None]
    rates = [spec.classes[name].arrival.mean_rate_per_s for name in scaled]
    window_s = (end_ns - cut_ns) / NS_PER_S
    mine = frame.filter(pl.col("class").is_in(scaled))
    served = mine.filter(
        (pl.col("outcome") == "ok") & (pl.col("end_ns") > cut_ns) & (pl.col("end_ns") <= end_ns)
    ).height
    if None in rates:  # a trace replay: its own offered count is the nominal
        nominal = mine.filter(pl.col("intended_ns").is_between(cut_ns, end_ns)).height / window_s
    else:
        nominal = sum(r for r in rates if r is not None)
    if window_s <= 0 or nominal <= 0:
        return None
    return load * served / window_s / nominal


def failed_share(frame: pl.DataFrame, spec: WorkloadSpec, cut_ns: int, end_ns: int) -> float | None:
    """The share of the scaled classes' requests ending in [cut, end] that did not end ok
    (None: none ended). Above RATE_TOLERANCE an over-saturated step's ok completions are
    no measure of what the server can serve: it spent its capacity on requests that
    failed, so they set no ceiling."""
    scaled = [name for name, cls in spec.classes.items() if cls.concurrency is None]
    ended = frame.filter(pl.col("class").is_in(scaled) & (pl.col("end_ns") > cut_ns)
                         & (pl.col("end_ns") <= end_ns))  # fmt: skip
    if ended.height == 0:
        return None
    return float((ended.get_column("outcome") != "ok").sum()) / ended.height


def _lifetime_cut(frame: pl.DataFrame, end_ns: int) -> int:
    """First intended + WARMUP_LIFETIMES mean lifetimes (intended → end) of the step, at most
    MAX_WARMUP_SHARE of the sending period (an over-saturated step's lifetimes grow with it)."""
    lives = (frame["end_ns"] - frame["intended_ns"]).drop_nulls()
    first = int(frame["intended_ns"].min())  # type: ignore[arg-type]  # non-empty ints
    if lives.len() == 0:
        return first
    mean_ns = float(lives.mean())  # type: ignore[arg-type]  # non-empty ints
    longest = round((end_ns - first) * MAX_WARMUP_SHARE)
    return first + min(round(WARMUP_LIFETIMES * mean_ns), longest)


def class_figures(block: ClassAudit, required: int | None) -> ClassFigures:
    """A class of a step as the search keeps it: its SLO figures and where TTFT went."""
    targets = block.slo.targets
    checks = {c.metric: c for c in block.slo.checks}
    ttft, tpot = checks.get(TTFT.column), checks.get(TPOT.column)
    verdict = block.slo.judged or MISSED
    return ClassFigures(
        requests=block.requests,
        required=required,
        percentile=targets.percentile,
        attainment=block.slo.attainment,
        met=verdict == MET,
        ttft_ms=_at_percentile(block.ttft_ms_with_failures, targets.percentile),
        tpot_ms=_at_percentile(block.tpot_ms_with_failures, targets.percentile),
        ttft_slo_ms=targets.ttft_ms,
        tpot_slo_ms=targets.tpot_ms,
        verdict=verdict,
        confidence=targets.confidence,
        ttft_low_ms=ttft.low_ms if ttft else None,
        ttft_high_ms=ttft.high_ms if ttft else None,
        tpot_low_ms=tpot.low_ms if tpot else None,
        tpot_high_ms=tpot.high_ms if tpot else None,
        ttft_low_open=bool(ttft and ttft.low_open),
        ttft_high_open=bool(ttft and ttft.high_open),
        tpot_low_open=bool(tpot and tpot.low_open),
        tpot_high_open=bool(tpot and tpot.high_open),
        why=_undecided_why(block.slo.checks) if verdict == INCONCLUSIVE else None,
        ttft_split=block.ttft_split.at_target or block.ttft_split.p90,
    )


def _undecided_why(checks: Iterable[Check]) -> str:
    """`ttft p99: the target 1000 ms lies within [930, 1.08e+03] ms at 95% each side`."""
    return "; ".join(f"{c.metric.removesuffix('_ms')} p{c.percentile:g}: {c.note}"
                     for c in checks if c.judged == INCONCLUSIVE)  # fmt: skip


def _at_percentile(stats: FailureRankedStats, percentile: float) -> float | None:
    """The summary's figure at the SLO percentile (it holds p50/90/95/99; p99 otherwise)."""
    shown = {50.0: stats.p50, 90.0: stats.p90, 95.0: stats.p95, 99.0: stats.p99}
    return shown.get(percentile, stats.p99)


def _status(
    summary: Summary,
    classes: Mapping[str, ClassFigures],
    steady: Steadiness,
    client_failed: bool,
    *,
    load: float,
    min_lifetimes: float,
    closed_loop: bool,
    steady_checks: bool,
    served_load: float | None,
    failed_share: float | None = None,
) -> tuple[str, str, float | None]:
    """(status, reason, capacity load if over-saturated), the checks in the module's order.

    The generator's part (1) by `analysis.health`'s rule: a step is invalid when the client
    failed, offered less than the load asked (its sends short of the schedule's rate), or
    when its own time could have changed the SLO verdict and nothing the server did (its
    completions, its queue) fails the step on its own."""
    generator = summary.generator
    if client_failed or generator.client_errors or _over_bound(summary):
        return INVALID, f"the generator fell behind: {generator.reason or _CLIENT_FAILED}", None
    if not closed_loop and short_of_rate(generator):
        return INVALID, (
            f"the generator fell behind: it sent {generator.rate_shortfall:.1%} slower than "
            f"scheduled (at least {generator.rate_shortfall_low:.1%}, more than "
            f"{RATE_TOLERANCE:.0%}), so the load asked was not applied"
        ), None  # fmt: skip
    if closed_loop and steady_checks and steady.mean_in_flight < load * (1 - RATE_TOLERANCE):
        return INVALID, (
            f"the closed loop did not hold its cap: {steady.mean_in_flight:.3g} of {load:g} "
            "in flight on average over the judged part, so the load asked was not applied"
        ), None  # fmt: skip
    short = [
        f"{name} {c.requests}/{c.required} requests"
        for name, c in classes.items()
        if c.required is not None and c.requests < c.required
    ]
    if steady_checks and (steady.lifetimes or 0.0) < min_lifetimes:
        short.append(f"{steady.lifetimes or 0:.1f}/{min_lifetimes:g} lifetimes")
    reasons: list[str] = []
    capacity = None
    share = steady.completed_share
    if steady_checks and not closed_loop and is_over_saturated(steady):
        failing = failed_share is not None and failed_share > RATE_TOLERANCE
        capacity = None if failing else served_load or None
        reasons.append(
            f"over-saturated: completed {steady.completed_per_s:.3g} of "
            f"{steady.offered_per_s:.3g} req/s offered ({share:.0%}), short by "
            f"{shortfall_of(steady):.0f} requests (allowed {allowed_shortfall(steady):.0f})"
            + (f", {failed_share:.0%} of them failed, so what it served ok sets no ceiling"
               if failing else "")
        )  # fmt: skip
    if steady_checks and not closed_loop:  # a closed loop's queue is bounded by its cap
        reasons += [f"{_SERIES[t.series]} rising {_rise(t)}" for t in steady.rising()]
    moved = _client_moved(summary)
    missed = [name for name, c in classes.items() if c.verdict == MISSED]
    if missed and moved is None:
        reasons.append(f"missed: {', '.join(missed)}")
    if reasons:
        tail = [f"short: {', '.join(short)}"] if short else []
        if moved is not None:
            tail.append(f"its SLO verdict could be the client's: {moved}")
        return FAIL, "; ".join(reasons + tail), capacity
    if moved is not None:
        return INVALID, f"the generator fell behind: {generator.reason or moved}", None
    if short:
        return SHORT, f"shorter than the rule: {', '.join(short)}", None
    undecided = [f"{name} ({c.why})" for name, c in classes.items() if c.verdict == INCONCLUSIVE]
    if undecided:
        return UNDECIDED, f"SLO not shown met or missed: {'; '.join(undecided)}", None
    if closed_loop and steady_checks:
        return PASS, "closed loop, steady at its cap: every SLO met", None
    return PASS, "steady, every SLO met" if steady_checks else "every SLO met", None


_CLIENT_FAILED = "requests failed in the client itself (out of file descriptors or local ports)"


def _over_bound(summary: Summary) -> bool:
    """The judged part's send-lag p99 above a given --lag-bound-ms."""
    bound, p99 = summary.generator.lag_bound_ms, summary.generator.lag_ms.p99
    return bound is not None and p99 is not None and p99 > bound


def _client_moved(summary: Summary) -> str | None:
    """The checks whose verdict the client's own time could change, when that changes the
    judged part's verdict (`analysis.health`); None when it could not."""
    effect = summary.generator.client
    if effect is None:
        return None
    if effect.client_out == effect.as_measured and effect.stamps_worst == effect.as_measured:
        return None
    return "; ".join(effect.moved)


def shortfall_of(steady: Steadiness) -> int:
    """Requests offered over the judged part that it did not complete (its in-flight growth)."""
    return steady.offered - steady.completed


def allowed_shortfall(steady: Steadiness) -> float:
    """RATE_TOLERANCE of the offered requests, or the noise allowance, or one request (the
    in-flight count is whole: less is no queue at all), whichever is largest."""
    return max(RATE_TOLERANCE * steady.offered, steady.shortfall_allowance, 1.0)


def is_over_saturated(steady: Steadiness) -> bool:
    """Completed short of offered by more than `allowed_shortfall`."""
    return steady.offered_per_s > 0 and shortfall_of(steady) > allowed_shortfall(steady)


_SERIES = {"in_flight": "in flight", TTFT.column: "TTFT from intended"}


def _rise(trend: Trend) -> str:
    unit = " ms" if trend.series == TTFT.column else ""
    return f"{trend.rise:+.3g}{unit} (noise bound {trend.allowance:.2g}, floor {trend.floor:.2g})"


def _step_of(
    summary: Summary,
    classes: Mapping[str, ClassFigures],
    load: float,
    status: str,
    note: str,
    kept: pl.DataFrame,
    run_dir: str | None,
) -> Step:
    duration_s = summary.duration_s
    judged = sum(c.requests for c in classes.values())
    meeting = sum((c.attainment or 0.0) * c.requests for c in classes.values())
    goodput = [b.goodput for b in summary.classes.values()]
    tokens = int(kept["output_tokens"].fill_null(0).sum()) if kept.height else 0
    return Step(
        load=load, status=status, note=note, requests=judged, duration_s=duration_s,
        attainment=round(meeting / judged, 6) if judged else None,
        goodput_req_per_s=_total(g.requests_per_s for g in goodput),
        goodput_tok_per_s=_total(g.output_tokens_per_s for g in goodput),
        throughput_tok_per_s=round(tokens / duration_s, 3) if duration_s > 0 else None,
        classes=classes, run_dir=run_dir,
    )  # fmt: skip


def _total(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present), 3) if present else None


def planned_size(spec: WorkloadSpec) -> tuple[float, float]:
    """(seconds of sending, requests) a step spec plans, roughly: open-loop classes at their
    mean rate for their duration, closed loops their request counts (no duration)."""
    seconds, requests = 0.0, 0.0
    for cls in spec.classes.values():
        rate = cls.arrival.mean_rate_per_s
        if cls.duration_s is not None:
            seconds = max(seconds, cls.duration_s)
            requests += (rate or 0.0) * cls.duration_s
        elif cls.requests is not None:
            requests += cls.requests
    return seconds, requests


def highest_pass_req_s(found: Search, base_rate: float | None) -> float | None:
    """The knee in req/s: the highest pass × the file's total rate (rate mode), else the
    completed rate measured at the highest passing step (closed loop, trace replay)."""
    if found.highest_pass is None:
        return None
    if base_rate is not None:
        return found.highest_pass * base_rate
    step = next(s for s in found.steps if s.status == PASS and s.load == found.highest_pass)
    return step.steady.completed_per_s if step.steady else None


def to_json(
    found: Search,
    verdict: Verdict | None,
    settings: Mapping[str, Any],
    base_rate: float | None = None,
) -> dict[str, Any]:
    """capacity.json: the knee in req/s, the settings, every step's evidence, the verdict."""
    return {
        "highest_pass_req_s": highest_pass_req_s(found, base_rate),
        "highest_pass": found.highest_pass,
        "first_fail": found.first_fail,
        "first_inconclusive": found.first_undecided,
        "knee": knee_json(found, base_rate),
        "capacity": found.capacity,
        "ceiling": found.ceiling,
        "ceiling_holds": found.ceiling_holds,
        "margin": found.margin,
        "knee_found": found.knee_found,
        "settings": dict(settings),
        "steps": [step_json(s) for s in found.steps],
        "stopped_by": step_json(found.stopped_by) if found.stopped_by else None,
        "verdict": None
        if verdict is None
        else {
            "proposed": verdict.proposed,
            "allowed": verdict.allowed,
            "passed": verdict.passed,
            "status": verdict.status,
            "reason": verdict.reason,
        },
        "exit_code": exit_code(found, verdict),
    }


def knee_json(found: Search, base_rate: float | None) -> dict[str, Any]:
    """The interval the knee is known to: [highest pass, upper) in load units and, in rate
    mode, in req/s (null where a side is unknown)."""
    low, high = found.highest_pass, found.upper

    def req_s(load: float | None) -> float | None:
        return None if load is None or base_rate is None else round(load * base_rate, 6)

    return {"low": low, "high": high, "low_req_s": req_s(low), "high_req_s": req_s(high),
            "high_is": _upper_kind(found)}  # fmt: skip


def _upper_kind(found: Search) -> str | None:
    """What bounds the knee from above: `fail`, `inconclusive` or `capacity` (the ceiling)."""
    upper = found.upper
    if upper is None:
        return None
    if upper == found.first_fail:
        return "fail"
    return "inconclusive" if upper == found.first_undecided else "capacity"


def step_json(step: Step) -> dict[str, Any]:
    """One step as JSON: its figures, classes and steady-state evidence."""
    skip = ("classes", "steady")
    data = {k: getattr(step, k) for k in Step.__dataclass_fields__ if k not in skip}
    data["over_saturated"] = step.over_saturated
    data["classes"] = {name: codec.to_json(c) for name, c in step.classes.items()}
    data["steady"] = None if step.steady is None else steady_json(step.steady)
    return data


def steady_json(steady: Steadiness) -> dict[str, Any]:
    """The evidence with its derived figures (shares, lifetimes, which series rose)."""
    data: dict[str, Any] = {
        k: getattr(steady, k) for k in Steadiness.__dataclass_fields__ if k != "trends"
    }
    data["completed_share"] = steady.completed_share
    data["lifetimes"] = steady.lifetimes
    data["trends"] = {
        t.series: {**{k: getattr(t, k) for k in Trend.__dataclass_fields__}, "rising": t.rising}
        for t in steady.trends
    }
    return data


def settings_json(
    param: str, loads: list[float], resolution: float, min_tail: int, min_lifetimes: float,
    warmup_s: float | None, safety_margin: float, proposed: float | None,
    base_rate: float | None, max_extend: float = 4.0, rule: str = INTERVAL,
) -> dict[str, Any]:  # fmt: skip
    """The settings capacity.json records beside the steps."""
    return {
        "param": param, "loads": loads, "resolution": resolution, "min_tail": min_tail,
        "min_lifetimes": min_lifetimes, "rate_tolerance": RATE_TOLERANCE, "warmup_s": warmup_s,
        "safety_margin": safety_margin, "proposed_limit": proposed,
        "load_unit": "max_in_flight" if param == "max_in_flight" else "rate multiplier",
        "base_rate_per_s": base_rate, "max_extend": max_extend, "verdict": rule,
    }  # fmt: skip
