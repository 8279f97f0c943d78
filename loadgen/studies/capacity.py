"""Capacity search: the highest load the server sustains while every SLO of every class holds.

Sits on top of a run (`run.execute`): each step is one run of the workload at one load,
judged after its warm-up, and the search decides the next load from the steps' verdicts.
The search is pure (`search` takes the function that runs one step), so it is tested with
fake step functions; `step_runner` is the real one.

A step is judged by `loadgen.analysis.capacity.audit_step` (pass, fail, invalid, too
short, or inconclusive); the verdicts, the search's result types and capacity.json live
there too. A step that would pass but is too short is run once more, longer (planned from
its own measured lifetime); after an over-saturated step no load above the capacity it
served is run. A steady step whose SLOs are neither MET nor MISSED at their confidence is
*extended*: run again at the same load for twice as long, then four times, up to
`max_extend` × its planned length, each run judged on its own (the judged part must be one
continuous steady stretch: the rate and trend checks read one timeline, so two runs are
not pooled). One that stays inconclusive is not a pass: it bounds the knee from above like
a failure, and the bisection goes on below it.

Search: run the loads in order (geometric steps, or the user's list) until a step fails,
then bisect between the highest pass and the lowest failing (or still inconclusive) load,
or the capacity bound when lower, until they are within `resolution` of each other (upper
<= lower × (1 + resolution)). The knee then lies in [highest pass, upper): the interval
capacity.json reports it to (`knee`), beside each step's SLO bounds.

Step length. Requests: a nearest-rank p-th percentile of n requests sits at rank
ceil(p/100 · n), so n − ceil(p n / 100) requests lie beyond it; requiring `min_tail` of
them gives n >= min_tail / (1 − p/100): 1,000 for p99 with 10 beyond, 200 for p95.
Duration: `min_lifetimes` × the lifetime measured at the highest passing step so far
(× LIFETIME_CUSHION, since lifetimes grow with load), after a warm-up of the larger of
10 % of the sending period and WARMUP_LIFETIMES lifetimes (unless `warmup_s`).

Loads: `--param rate` multiplies every class's arrival rate (1.0 = the file's rates);
`--param max_in_flight` caps concurrent requests, each class sending closed-loop (its next
request as soon as one ends), so the cap is always full; latencies are then judged from
the moment a request got its slot (sent), i.e. what the server does at that concurrency.
A closed loop is steady by construction, so there checks 3 and 4 are shown, not judged,
and the SLOs decide (after 1, 2 and the warm-up), once the loop is seen to hold its cap:
the time-averaged requests in flight over the judged part are at least the cap less
RATE_TOLERANCE (else the step is *invalid*: the load asked was not applied; the closed-loop
counterpart of "completed what was offered"). Its next request is sent when one ends,
so the requests in flight are the cap at every instant and no queue can grow without
bound, at the client or the server (at most cap − slots wait there, a fixed amount that
the TTFT from the send includes). Completed and offered then differ only by the change
in requests in flight between the judged part's two edges (at most the cap), and a
TTFT that rises with a fixed population is the server changing over the step (cache,
memory), not load it cannot carry: its SLOs over the judged part say whether that matters.
The known answers: for B batch slots, a knee at B when the TTFT SLO lies between the
unqueued TTFT and the wait for a slot; with whole-prompt prefill of P tokens at R tok/s
and C ≤ B clients in lockstep, TTFT = C·P/R, so the knee is ⌊SLO·R/P⌋.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from loadgen.analysis.audit import run_joined_fields
from loadgen.analysis.capacity import (
    FAIL,
    INTERRUPTED,
    MIN_LIFETIMES,
    PASS,
    RATE_TOLERANCE,
    SHORT,
    UNDECIDED,
    WARMUP_LIFETIMES,
    Search,
    Step,
    audit_step,
    required_requests,
)
from loadgen.analysis.confidence import INTERVAL
from loadgen.errors import ConfigError
from loadgen.results.runfolder import read_records
from loadgen.run.execute import RunOptions, execute
from loadgen.run.live import LiveExporter
from loadgen.run.scale.cluster import RayOptions
from loadgen.workload.spec import ClassSpec, WorkloadSpec

PARAMS = ("rate", "max_in_flight")
COUNT_SIGMAS = 3.0  # plan n + 3√n requests for n: a Poisson count falls short 1 time in ~700
LIFETIME_CUSHION = 1.25  # plan for lifetimes this much longer than last measured
MAX_EXTEND = 4.0  # an inconclusive step runs at most this many times its planned length
EXTEND_FACTOR = 2.0  # each extension doubles the step's length
JUDGED = (PASS, FAIL, UNDECIDED)  # a verdict on the server (the search goes on)


RunStep = Callable[[float], Step]


def geometric_loads(
    start: float, maximum: float, factor: float = 2.0, *, integer: bool = False
) -> list[float]:
    """start, start·factor, start·factor², … while <= maximum, then maximum itself."""
    if not (0 < start <= maximum and factor > 1):
        raise ValueError(f"need 0 < start <= max and factor > 1 (got {start}, {maximum}, {factor})")
    loads: list[float] = []
    load = start
    while load <= maximum * (1 + 1e-9):
        loads.append(float(round(load)) if integer else load)
        load *= factor
    if loads[-1] < maximum:
        loads.append(maximum)
    return sorted(set(loads))


def search(
    run_step: RunStep,
    loads: Sequence[float],
    *,
    resolution: float = 0.05,
    integer: bool = False,
    on_step: Callable[[Step], None] | None = None,
) -> Search:
    """Step up through `loads` until one fails, then bisect to `resolution` (see the module).

    After an over-saturated step, a passing step at or above the capacity it revealed is
    re-judged a failure (`on_step` sees the re-judged step again), and no load at or above
    that ceiling is run.
    """
    steps: list[Step] = []
    stopped: Step | None = None

    def run(load: float) -> Step:
        step = run_step(load)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        for index, demoted in _rejudged(steps):
            steps[index] = demoted
            if on_step is not None:
                on_step(demoted)
        return steps[-1]

    for load in loads:
        step = run(load)
        if step.status != PASS:
            stopped = None if step.status in JUDGED else step
            break
    while stopped is None:
        found = _bracket(steps)
        if found.highest_pass is None or found.upper is None:
            break
        mid = _midpoint(found.highest_pass, found.upper, resolution, integer)
        if mid is None:
            break
        step = run(mid)
        if step.status not in JUDGED:
            stopped = step
    return replace(_bracket(steps), stopped_by=stopped)


def _bracket(steps: Sequence[Step]) -> Search:
    """What the steps so far bracket."""
    passes = [s.load for s in steps if s.status == PASS]
    fails = [s.load for s in steps if s.status == FAIL]
    undecided = [s.load for s in steps if s.status == UNDECIDED]
    served = [s.capacity_load for s in steps if s.capacity_load is not None]
    return Search(
        steps=tuple(steps),
        highest_pass=max(passes, default=None),
        first_fail=min(fails, default=None),
        capacity=max(served, default=None),
        first_undecided=min(undecided, default=None),
    )


def _rejudged(steps: Sequence[Step]) -> list[tuple[int, Step]]:
    """Passing steps at or above the measured capacity's ceiling whose own ok completions
    served less than it (a lull: the load was not really offered), re-judged failures with
    the evidence. A pass that served the ceiling or more stands: it is a direct measure
    that the server sustains its load, where the over-saturated step only shows what the
    server serves overloaded."""
    found = _bracket(steps)
    ceiling = found.ceiling
    if ceiling is None:
        return []
    over = next(s for s in steps if s.capacity_load == found.capacity)
    why = (
        f"re-judged by the over-saturated step at {over.load:.3g}x, which served "
        f"{found.capacity:.3g}x: this step's ok completions served only"
    )
    return [
        (index, replace(step, status=FAIL, reasons=("re-judged",), note=(
            f"{why} {_served_text(step)}, under {1 - RATE_TOLERANCE:.0%} of that "
            f"({ceiling:.3g}x), so it passed on a lull (it had passed: {step.note})")))
        for index, step in enumerate(steps)
        if step.status == PASS and step.load >= ceiling
        and (step.served is None or step.served < ceiling)
    ]  # fmt: skip


def _served_text(step: Step) -> str:
    return "an unmeasured load" if step.served is None else f"{step.served:.3g}x"


def _midpoint(lo: float, hi: float, resolution: float, integer: bool) -> float | None:
    """The next load to try, or None when the bracket is already fine enough."""
    if hi <= lo * (1 + resolution):
        return None
    if integer:
        mid = float((int(lo) + int(hi)) // 2)
        return mid if lo < mid < hi else None
    return (lo + hi) / 2


# -- one step: the workload at one load ---------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class StepPlan:
    """How long one step runs: its judged part, its warm-up (s), and the lifetime assumed."""

    judged_s: float
    warmup_s: float
    lifetime_s: float | None  # None: not yet measured (the first step plans by counts)

    @property
    def duration_s(self) -> float:
        """The whole sending period."""
        return self.judged_s + self.warmup_s


def planned_count(required: int) -> float:
    """n + COUNT_SIGMAS·√n: what to plan so that a Poisson count rarely falls below n."""
    return required + COUNT_SIGMAS * math.sqrt(required)


def plan_step(
    counts_s: float, lifetime_s: float | None, *, min_lifetimes: float, warmup_s: float | None,
    extend: float = 1.0,
) -> StepPlan:  # fmt: skip
    """The judged part lasts the longer of what the counts need and `min_lifetimes` lifetimes,
    times `extend` (an inconclusive step run again); the warm-up is `warmup_s`, else the
    larger of 1/9 of that (10 % of the whole) and WARMUP_LIFETIMES lifetimes."""
    judged = counts_s
    if lifetime_s is not None:
        judged = max(judged, min_lifetimes * lifetime_s)
    judged *= extend
    if warmup_s is None:
        warmup_s = max(judged / 9, WARMUP_LIFETIMES * (lifetime_s or 0.0))
    return StepPlan(judged_s=judged, warmup_s=warmup_s, lifetime_s=lifetime_s)


def step_spec(
    spec: WorkloadSpec,
    load: float,
    *,
    param: str,
    min_tail: int,
    warmup_s: float | None,
    lifetime_s: float | None = None,
    min_lifetimes: float = MIN_LIFETIMES,
    count_scale: float = 1.0,
    extend: float = 1.0,
) -> tuple[WorkloadSpec, int | None]:
    """The workload for one step, and its `max_in_flight` (None in rate mode). `extend`
    multiplies the whole step's length (an inconclusive step run again).

    rate: every open-loop class's rate × load, all sending for one duration (so the mix
    holds throughout), long enough that each class has its required requests after the
    warm-up and the judged part lasts `min_lifetimes` × `lifetime_s` (`plan_step`).
    Closed-loop batches are sent as written.
    max_in_flight: every class of single requests becomes a closed loop of `load` workers
    sending its required requests, or `load` per lifetime for the lifetimes the rule asks
    (plus the warm-up's share); the cap is the load.
    """
    required = required_requests(spec, min_tail)
    if param == "max_in_flight":
        cap = int(load)
        per_lifetime = cap * (min_lifetimes + WARMUP_LIFETIMES) if lifetime_s else 0
        return _closed_loop_spec(spec, cap, required, per_lifetime, count_scale, extend), cap
    counts_s = 0.0
    for name, count in required.items():
        rate = spec.classes[name].arrival.mean_rate_per_s
        if rate is not None and spec.classes[name].concurrency is None:
            counts_s = max(counts_s, planned_count(count) * count_scale / (rate * load))
    plan = plan_step(counts_s, lifetime_s, min_lifetimes=min_lifetimes, warmup_s=warmup_s,
                     extend=extend)  # fmt: skip
    classes = {}
    for name, cls in spec.classes.items():
        if cls.concurrency is not None:
            classes[name] = cls
            continue
        scaled = replace(cls, arrival=cls.arrival.scaled(load))
        if cls.arrival.process != "trace" and plan.duration_s > 0:
            scaled = replace(scaled, requests=None, duration_s=plan.duration_s)
        classes[name] = scaled
    return replace(spec, classes=classes), None


def _closed_loop_spec(
    spec: WorkloadSpec,
    cap: int,
    required: Mapping[str, int],
    per_lifetime: float,
    count_scale: float,
    extend: float = 1.0,
) -> WorkloadSpec:
    classes: dict[str, ClassSpec] = {}
    for name, cls in spec.classes.items():
        if cls.turns is not None or cls.kind == "agent":
            raise ConfigError(
                spec.source, f"classes.{name}",
                "--param max_in_flight sends single requests in a closed loop; this class has "
                "sessions or hops", "use --param rate for this workload",
            )  # fmt: skip
        if cls.kind == "summarization":
            classes[name] = replace(cls, concurrency=cap)
            continue
        counted = planned_count(required.get(name, cls.requests or 100)) * count_scale / 0.9
        count = math.ceil(max(counted, per_lifetime * LIFETIME_CUSHION) * extend)
        classes[name] = replace(cls, concurrency=cap, requests=count, duration_s=None)
    return replace(spec, classes=classes)


RunOne = Callable[[WorkloadSpec, int | None, str], tuple[pl.DataFrame, bool, bool, Path]]


def step_runner(
    spec: WorkloadSpec,
    run_one: RunOne,
    *,
    param: str,
    min_tail: int = 10,
    warmup_s: float | None = None,
    min_lifetimes: float = MIN_LIFETIMES,
    lag_bound_ms: float | None = None,
    on_start: Callable[[float, WorkloadSpec], None] | None = None,
    max_extend: float = MAX_EXTEND,
    rule: str = INTERVAL,
) -> RunStep:
    """The real step function: plan the step, run it with `run_one`, audit it.

    `run_one(step_spec, max_in_flight, run_id)` runs the load and returns the records,
    whether requests failed in the client itself, whether the run was interrupted, and its
    folder (whether the generator kept up is judged on the step's judged part).
    Each step is planned on the lifetime measured at the highest passing step so far (×
    LIFETIME_CUSHION); one that comes out too short is run once more on its own lifetime.
    `on_start(load, step_spec)` is told before each run (to say how long it will take).
    An inconclusive step is run again EXTEND_FACTOR times as long, while that stays within
    `max_extend` times its planned length (`extend_undecided`); `rule` judges the SLOs.
    """
    count = 0
    passed: dict[float, float] = {}  # load -> mean lifetime of a passing step
    replays_trace = any(c.arrival.process == "trace" for c in spec.classes.values())

    def attempt(
        load: float, lifetime_s: float | None, count_scale: float = 1.0, extend: float = 1.0
    ) -> Step:
        nonlocal count
        count += 1
        spec_at, cap = step_spec(
            spec, load, param=param, min_tail=min_tail, warmup_s=warmup_s,
            lifetime_s=lifetime_s, min_lifetimes=min_lifetimes, count_scale=count_scale,
            extend=extend,
        )  # fmt: skip
        if on_start is not None:
            on_start(load, spec_at)
        frame, client_failed, interrupted, run_dir = run_one(spec_at, cap, f"step-{count:02d}")
        if interrupted:
            return Step(load=load, status=INTERRUPTED, note="interrupted", run_dir=str(run_dir))
        step = audit_step(
            frame, spec_at, load, min_tail=min_tail, warmup_s=warmup_s,
            from_send=param == "max_in_flight", client_failed=client_failed, run_dir=str(run_dir),
            min_lifetimes=min_lifetimes, lag_bound_ms=lag_bound_ms, rule=rule,
            joined=run_joined_fields(run_dir, frame),  # the step's spans, when it kept some
        )  # fmt: skip
        return replace(step, extended=extend)

    def run_step(load: float) -> Step:
        below = [life for at, life in passed.items() if at <= load]
        known = max(below or passed.values(), default=None)
        lifetime = None if known is None else known * LIFETIME_CUSHION
        scale = 1.0
        step = attempt(load, lifetime)
        if step.status == SHORT and replays_trace:
            why = "a trace replay lasts as long as its trace (replay a longer one)"
            return replace(step, status=FAIL, note=f"{step.note}: {why}")
        if step.status == SHORT:
            measured = step.steady.lifetime_s if step.steady else None
            first = step.note
            lifetime = None if measured is None else measured * LIFETIME_CUSHION
            scale = _short_by(step)
            step = attempt(load, lifetime, scale)
            step = replace(step, attempts=2, note=f"{step.note} (first run {first})")
            if step.status == SHORT:
                step = replace(step, status=FAIL, note=f"lifetime grew with the step: {step.note}")
        if step.status == UNDECIDED:
            step = extend_undecided(
                step, lambda extend: attempt(load, lifetime, scale, extend),
                max_extend=max_extend, replays_trace=replays_trace,
            )  # fmt: skip
        if step.status == PASS and step.steady and step.steady.lifetime_s:
            passed[load] = step.steady.lifetime_s
        return step

    return run_step


def extend_undecided(
    step: Step, rerun: Callable[[float], Step], *, max_extend: float, replays_trace: bool
) -> Step:
    """An inconclusive step run again EXTEND_FACTOR times as long (×2, ×4, ...) while within
    `max_extend` × its planned length, until a run decides it; the last run's verdict,
    with how it got there. A trace replay lasts as long as its trace: it is not extended."""
    if replays_trace:
        return replace(step, note=f"{step.note}; a trace replay cannot run longer (replay a "
                                  "longer one)")  # fmt: skip
    history = [f"×1 {step.note}"]
    extend, attempts = 1.0, step.attempts
    while step.status == UNDECIDED and extend * EXTEND_FACTOR <= max_extend * (1 + 1e-9):
        extend *= EXTEND_FACTOR
        attempts += 1
        step = rerun(extend)
        if step.status == UNDECIDED:
            history.append(f"×{extend:g} {step.note}")
    if step.status == UNDECIDED:
        note = (f"still not shown met or missed at ×{extend:g} the planned length "
                f"(--max-extend {max_extend:g}): it bounds the knee from above; "
                + " / ".join(history))  # fmt: skip
    else:
        note = f"{step.note} (extended to ×{extend:g}: inconclusive before, {' / '.join(history)})"
    return replace(step, attempts=attempts, note=note)


def run_one_against(
    url: str, *, out: Path, options: RunOptions | None = None, seed: int | None = None,
    lag_bound_ms: float | None = None, quiet: bool = False, live: LiveExporter | None = None,
    price_per_hour: float | None = None, replicas: int = 1, ray: RayOptions | None = None,
) -> RunOne:  # fmt: skip
    """The real `run_one`: each step is one `loadgen run` (`run.execute`) against `url`,
    its folder in `out`, with `options` (every option `capacity` shares with `run`; else
    the few keywords); only the first step checks the target (preflight, unless the options
    skip it). `live` publishes every step on one endpoint (its counters go on rising). Each
    step is a run of its own to the cache too: a cold step draws its own nonce
    (`nonce.step-NN` when `--nonce` is given), a reset step resets. `ray`: each step is a
    run sharded over the Ray cluster (`run.scale.raycluster`), its merged folder the step's."""
    base = options or RunOptions(
        seed=seed, lag_bound_ms=lag_bound_ms, quiet=quiet, price_per_hour=price_per_hour,
        replicas=replicas,
    )  # fmt: skip
    preflight = [base.check_target]

    def run_one(
        spec: WorkloadSpec, cap: int | None, run_id: str
    ) -> tuple[pl.DataFrame, bool, bool, Path]:
        nonce = f"{base.nonce}.{run_id}" if base.nonce is not None else None
        step = replace(base, url=url, out_dir=out, run_id=run_id, max_in_flight=cap,
                       check_target=preflight[0], nonce=nonce)  # fmt: skip
        preflight[0] = False
        # extended when inconclusive: not warned of its size
        result = execute(spec, step, ray=ray, live=live, warn_size=False)
        client_failed = result.summary.generator.client_errors > 0
        return read_records(result.run_dir), client_failed, result.interrupted, result.run_dir

    return run_one


def _short_by(step: Step) -> float:
    """How much longer a short step's counts must be: the worst required / judged ratio."""
    ratios = [
        c.required / max(c.requests, 1)
        for c in step.classes.values()
        if c.required is not None and c.requests < c.required
    ]
    return max(ratios, default=1.0)
