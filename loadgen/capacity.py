"""Capacity search: the highest load at which every SLO of every class still holds.

Sits on top of a run (`run.execute`): each step is one run of the workload at one load,
re-audited after its warm-up, and the search decides the next load from the step's status
alone. The search is pure (`search` takes the function that runs one step), so it is
tested with a fake step function; `step_runner` is the real one.

Search: run the loads in order (geometric steps, or the user's list) until a step fails,
then bisect between the last passing and the first failing load until they are within
`resolution` of each other (upper <= lower * (1 + resolution)). The true knee then lies in
[highest pass, first fail). A step whose generator fell behind is *invalid*, not failed:
its numbers describe the client, so the search stops raising load there.

Step length: a nearest-rank p-th percentile of n requests sits at rank ceil(p/100 * n), so
n - ceil(p n / 100) requests lie beyond it. Requiring `min_tail` of them gives
n >= min_tail / (1 - p/100): 1,000 for p99 with 10 beyond, 200 for p95. Each step plans
that many (after its warm-up) for the most demanding class.

Loads: `--param rate` multiplies every class's arrival rate (1.0 = the file's rates);
`--param max_in_flight` caps concurrent requests, each class sending closed-loop (its next
request as soon as one ends), so the cap is always full; latencies are then judged from
the moment a request got its slot (sent), i.e. what the server does at that concurrency.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from loadgen.errors import ConfigError
from loadgen.objectives import Objective, apply_objectives
from loadgen.slo import summarize
from loadgen.spec import ClassSpec, WorkloadSpec

PASS, FAIL, INVALID, INTERRUPTED = "pass", "fail", "invalid", "interrupted"
PARAMS = ("rate", "max_in_flight")
NS_PER_S = 1_000_000_000
PLAN_CUSHION = 1.05  # Poisson counts vary: plan 5 % more than the rule needs


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One load step's verdict (`pass`, `fail`, `invalid`, `interrupted`) and figures."""

    load: float
    status: str
    note: str = ""
    requests: int = 0
    duration_s: float = 0.0
    attainment: float | None = None  # meeting / judged, over every class
    goodput_req_per_s: float | None = None
    goodput_tok_per_s: float | None = None
    throughput_tok_per_s: float | None = None  # every output token, late or not
    classes: Mapping[str, ClassFigures] = field(default_factory=dict)
    run_dir: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Search:
    """Every step in the order run, and what they bracket."""

    steps: tuple[Step, ...]
    highest_pass: float | None
    first_fail: float | None  # the lowest failing load
    stopped_by: Step | None = None  # an invalid or interrupted step that ended the search

    @property
    def knee_found(self) -> bool:
        """A passing load with a failing one above it."""
        return self.highest_pass is not None and self.first_fail is not None

    @property
    def margin(self) -> float | None:
        """How far the highest pass lies below the first fail, as a share of the fail."""
        if self.highest_pass is None or self.first_fail is None:
            return None
        return (self.first_fail - self.highest_pass) / self.first_fail


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """A proposed limit against the search: pass only if limit <= highest pass × (1 − margin)."""

    proposed: float
    allowed: float | None  # the largest limit that would pass
    passed: bool
    reason: str


RunStep = Callable[[float], Step]


def min_requests(percentile: float, min_tail: int = 10) -> int:
    """Requests so that `min_tail` lie beyond the nearest-rank percentile: ⌈tail/(1 − p/100)⌉."""
    if not 0 < percentile < 100:
        raise ValueError(
            f"a p{percentile:g} is decided by the worst request whatever the count: "
            "no step length makes it trustworthy"
        )
    # round() first: 10 / (1 - 0.99) is 1000.0000000000009 in floats, not 1000
    return math.ceil(round(min_tail * 100 / (100 - percentile), 6))


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
    """Step up through `loads` until one fails, then bisect to `resolution` (see the module)."""
    steps: list[Step] = []

    def run(load: float) -> Step:
        step = run_step(load)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        return step

    lo: float | None = None
    hi: float | None = None
    stopped: Step | None = None
    for load in loads:
        step = run(load)
        if step.status == PASS:
            lo = load
            continue
        if step.status == FAIL:
            hi = load
        else:
            stopped = step
        break
    while lo is not None and hi is not None and stopped is None:
        mid = _midpoint(lo, hi, resolution, integer)
        if mid is None:
            break
        step = run(mid)
        if step.status == PASS:
            lo = mid
        elif step.status == FAIL:
            hi = mid
        else:
            stopped = step
    return Search(steps=tuple(steps), highest_pass=lo, first_fail=hi, stopped_by=stopped)


def _midpoint(lo: float, hi: float, resolution: float, integer: bool) -> float | None:
    """The next load to try, or None when the bracket is already fine enough."""
    if hi <= lo * (1 + resolution):
        return None
    if integer:
        mid = float((int(lo) + int(hi)) // 2)
        return mid if lo < mid < hi else None
    return (lo + hi) / 2


def judge(found: Search, proposed: float, *, safety_margin: float = 0.10) -> Verdict:
    """Pass only if `proposed` <= highest passing load × (1 − safety_margin)."""
    if found.highest_pass is None:
        return Verdict(
            proposed=proposed, allowed=None, passed=False, reason="no load passed every SLO"
        )
    allowed = found.highest_pass * (1 - safety_margin)
    passed = proposed <= allowed * (1 + 1e-9)
    relation = "<=" if passed else ">"
    reason = (
        f"{proposed:g} {relation} {allowed:g} (highest passing load {found.highest_pass:g} "
        f"less the {safety_margin:.0%} safety margin)"
    )
    return Verdict(proposed=proposed, allowed=allowed, passed=passed, reason=reason)


EXIT_PASS, EXIT_FAIL, EXIT_FELL_BEHIND, EXIT_INTERRUPTED = 0, 2, 3, 130


def exit_code(found: Search, verdict: Verdict | None) -> int:
    """0 pass (or, without a proposed limit, a knee found); 2 fail or no knee in range;
    3 the generator fell behind before the answer was known; 130 interrupted."""
    stopped = found.stopped_by
    if stopped is not None and stopped.status == INTERRUPTED:
        return EXIT_INTERRUPTED
    if verdict is not None and verdict.passed:
        return EXIT_PASS
    if verdict is None and found.knee_found:
        return EXIT_PASS
    if stopped is not None and found.first_fail is None and found.highest_pass is not None:
        return EXIT_FELL_BEHIND  # load above the last pass was never judged
    return EXIT_FAIL


# -- one step: the workload at one load ---------------------------------------------------
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
    """The file's total arrival rate of open-loop classes (None when a class replays a trace)."""
    rates = [c.arrival.mean_rate_per_s for c in spec.classes.values() if c.concurrency is None]
    if any(r is None for r in rates):
        return None
    return sum(r for r in rates if r is not None)


def step_spec(
    spec: WorkloadSpec, load: float, *, param: str, min_tail: int, warmup_s: float | None
) -> tuple[WorkloadSpec, int | None]:
    """The workload for one step, and its `max_in_flight` (None in rate mode).

    rate: every open-loop class's rate × load, all sending for one duration D (so the mix
    holds throughout), D long enough that each class has its required requests after the
    warm-up (10 % of D unless `warmup_s`). Closed-loop batches are sent as written.
    max_in_flight: every class of single requests becomes a closed loop of `load` workers
    sending its required requests (plus 10 % for the warm-up); the cap is the load.
    """
    required = required_requests(spec, min_tail)
    if param == "max_in_flight":
        return _closed_loop_spec(spec, int(load), required), int(load)
    needed_s = 0.0
    for name, count in required.items():
        rate = spec.classes[name].arrival.mean_rate_per_s
        if rate is not None and spec.classes[name].concurrency is None:
            needed_s = max(needed_s, count * PLAN_CUSHION / (rate * load))
    duration_s = needed_s + warmup_s if warmup_s is not None else needed_s / 0.9
    classes = {}
    for name, cls in spec.classes.items():
        if cls.concurrency is not None:
            classes[name] = cls
            continue
        scaled = replace(cls, arrival=cls.arrival.scaled(load))
        if cls.arrival.process != "trace" and duration_s > 0:
            scaled = replace(scaled, requests=None, duration_s=duration_s)
        classes[name] = scaled
    return replace(spec, classes=classes), None


def _closed_loop_spec(spec: WorkloadSpec, cap: int, required: Mapping[str, int]) -> WorkloadSpec:
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
        count = math.ceil(required.get(name, cls.requests or 100) * PLAN_CUSHION / 0.9)
        classes[name] = replace(cls, concurrency=cap, requests=count, duration_s=None)
    return replace(spec, classes=classes)


def audit_step(
    frame: pl.DataFrame,
    spec: WorkloadSpec,
    load: float,
    *,
    min_tail: int,
    warmup_s: float | None,
    from_send: bool,
    fell_behind: bool,
    run_dir: str | None = None,
) -> Step:
    """Drop the warm-up, re-audit what is left, and give the step its status and figures.

    Warm-up: records intended before first intended + `warmup_s` (default 10 % of the
    step's sending period, first → last intended time). `from_send` measures every latency from the
    send instead of the intended time (closed-loop cap steps).
    """
    if from_send:
        frame = frame.with_columns(pl.coalesce("sent_ns", "intended_ns").alias("intended_ns"))
    kept = _after_warmup(frame, warmup_s)
    slos = {name: cls.slo for name, cls in spec.classes.items()}
    summary = summarize(kept, run_id="step", slos=slos, planned=kept.height)
    summary = apply_objectives(summary, kept, {n: Objective.of(c) for n, c in spec.classes.items()})
    required = required_requests(spec, min_tail)
    classes = {
        name: _class_figures(block, required.get(name))
        for name, block in summary["classes"].items()
        if name in spec.classes
    }
    status, note = _status(summary, classes, fell_behind)
    return _step_of(summary, classes, load, status, note, kept, run_dir)


def _after_warmup(frame: pl.DataFrame, warmup_s: float | None) -> pl.DataFrame:
    if frame.height == 0:
        return frame
    first = int(frame["intended_ns"].min())  # type: ignore[arg-type]  # non-empty ints
    if warmup_s is None:  # 10 % of the sending period (not of the drain after it)
        cut = first + (int(frame["intended_ns"].max()) - first) // 10  # type: ignore[arg-type]
    else:
        cut = first + round(warmup_s * NS_PER_S)
    return frame.filter(pl.col("intended_ns") >= cut)


def _class_figures(block: Mapping[str, Any], required: int | None) -> ClassFigures:
    slo = block["slo"]
    targets = slo["targets"]
    p = float(targets["percentile"])
    key = f"p{p:g}" if f"p{p:g}" in block["ttft_ms_with_failures"] else "p99"
    return ClassFigures(
        requests=int(block["requests"]),
        required=required,
        percentile=p,
        attainment=slo["attainment"],
        met=bool(slo["met"]),
        ttft_ms=block["ttft_ms_with_failures"][key],
        tpot_ms=block["tpot_ms_with_failures"][key],
        ttft_slo_ms=targets["ttft_ms"],
        tpot_slo_ms=targets["tpot_ms"],
    )


def _status(
    summary: Mapping[str, Any], classes: Mapping[str, ClassFigures], fell_behind: bool
) -> tuple[str, str]:
    if fell_behind or summary["verdict"]["fell_behind"]:
        return INVALID, "the generator fell behind (late sends, or client errors)"
    short = [
        f"{name} {c.requests}/{c.required}"
        for name, c in classes.items()
        if c.required is not None and c.requests < c.required
    ]
    note = f"fewer requests than the rule asks: {', '.join(short)}" if short else ""
    if summary["verdict"]["slo_met"]:
        return PASS, note
    missed = [name for name, c in classes.items() if not c.met]
    return FAIL, "; ".join(filter(None, [f"missed: {', '.join(missed)}", note]))


def _step_of(
    summary: Mapping[str, Any],
    classes: Mapping[str, ClassFigures],
    load: float,
    status: str,
    note: str,
    kept: pl.DataFrame,
    run_dir: str | None,
) -> Step:
    duration_s = float(summary["duration_s"])
    judged = sum(c.requests for c in classes.values())
    meeting = sum((c.attainment or 0.0) * c.requests for c in classes.values())
    goodput = [b["goodput"] for b in summary["classes"].values()]
    tokens = int(kept["output_tokens"].fill_null(0).sum()) if kept.height else 0
    return Step(
        load=load, status=status, note=note, requests=judged, duration_s=duration_s,
        attainment=round(meeting / judged, 6) if judged else None,
        goodput_req_per_s=_total(g["requests_per_s"] for g in goodput),
        goodput_tok_per_s=_total(g["output_tokens_per_s"] for g in goodput),
        throughput_tok_per_s=round(tokens / duration_s, 3) if duration_s > 0 else None,
        classes=classes, run_dir=run_dir,
    )  # fmt: skip


def _total(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present), 3) if present else None


def step_runner(
    spec: WorkloadSpec,
    run_one: Callable[[WorkloadSpec, int | None, str], tuple[pl.DataFrame, bool, bool, Path]],
    *,
    param: str,
    min_tail: int = 10,
    warmup_s: float | None = None,
) -> RunStep:
    """The real step function: build the step's spec, run it with `run_one`, audit it.

    `run_one(step_spec, max_in_flight, run_id)` runs the load and returns the records,
    whether the generator fell behind, whether the run was interrupted, and its folder.
    """
    count = 0

    def run_step(load: float) -> Step:
        nonlocal count
        count += 1
        spec_at, cap = step_spec(spec, load, param=param, min_tail=min_tail, warmup_s=warmup_s)
        frame, fell_behind, interrupted, run_dir = run_one(spec_at, cap, f"step-{count:02d}")
        if interrupted:
            return Step(load=load, status=INTERRUPTED, note="interrupted", run_dir=str(run_dir))
        return audit_step(
            frame, spec_at, load, min_tail=min_tail, warmup_s=warmup_s,
            from_send=param == "max_in_flight", fell_behind=fell_behind, run_dir=str(run_dir),
        )  # fmt: skip

    return run_step


def to_json(found: Search, verdict: Verdict | None, settings: Mapping[str, Any]) -> dict[str, Any]:
    """capacity.json: the settings, every step, what they bracket and the verdict."""

    def step_json(step: Step) -> dict[str, Any]:
        data = {k: getattr(step, k) for k in Step.__dataclass_fields__ if k != "classes"}
        data["classes"] = {
            name: {k: getattr(c, k) for k in ClassFigures.__dataclass_fields__}
            for name, c in step.classes.items()
        }
        return data

    return {
        "settings": dict(settings),
        "steps": [step_json(s) for s in found.steps],
        "highest_pass": found.highest_pass,
        "first_fail": found.first_fail,
        "margin": found.margin,
        "knee_found": found.knee_found,
        "stopped_by": step_json(found.stopped_by) if found.stopped_by else None,
        "verdict": None
        if verdict is None
        else {
            "proposed": verdict.proposed,
            "allowed": verdict.allowed,
            "passed": verdict.passed,
            "reason": verdict.reason,
        },
        "exit_code": exit_code(found, verdict),
    }


# -- the knee plot ------------------------------------------------------------------------
def knee_png(found: Search, *, x_scale: float = 1.0, x_label: str = "load") -> bytes:
    """Attainment, goodput vs raw throughput, and the SLO-percentile latencies vs load.

    Three panels on one load axis (x = load × `x_scale`); SLO targets dashed; the highest
    passing load a green line, the first failing one red; invalid steps drawn as grey x
    and left out of the lines (their numbers are the generator's).
    """
    from matplotlib import ticker
    from matplotlib.figure import Figure  # no pyplot: nothing global to clean up

    from loadgen.plots import METRIC_COLOURS, _png  # the house colours, DPI and closing

    steps = sorted((s for s in found.steps if s.status in (PASS, FAIL)), key=lambda s: s.load)
    fig = Figure(figsize=(8.0, 8.5))
    top, middle, bottom = fig.subplots(3, 1, sharex=True)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.07, top=0.93, hspace=0.12)
    x = [s.load * x_scale for s in steps]
    _attainment_panel(top, steps, x)
    middle.plot(x, [s.goodput_tok_per_s for s in steps], "o-", color="tab:green",
                label="goodput (tokens of requests within SLO)")  # fmt: skip
    middle.plot(x, [s.throughput_tok_per_s for s in steps], "s--", color="tab:grey",
                label="raw throughput (all tokens)")  # fmt: skip
    middle.set_ylabel("output tokens/s")
    middle.set_ylim(bottom=0)
    _latency_panel(bottom, steps, x, METRIC_COLOURS)
    for ax in (top, middle, bottom):
        ax.grid(True, alpha=0.3)
        _mark_bracket(ax, found, x_scale, labelled=ax is top)
        ax.legend(loc="best", fontsize=8)
    if x and max(x) / min(x) > 4:
        bottom.set_xscale("log", base=2)
        bottom.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    bottom.set_xlabel(x_label)
    title = "capacity: SLOs vs load"
    if found.highest_pass is not None:
        title += f" — highest passing load {found.highest_pass * x_scale:.3g}"
    fig.suptitle(title)
    return _png(fig)


def _attainment_panel(ax: Any, steps: Sequence[Step], x: Sequence[float]) -> None:
    names = sorted({n for s in steps for n in s.classes})
    for name in names:
        y = [_pct(s.classes[name].attainment) if name in s.classes else None for s in steps]
        ax.plot(x, _nan(y), "o-", label=f"{name} attainment")
    for p in sorted({s.classes[n].percentile for s in steps for n in s.classes}):
        ax.axhline(p, color="grey", linestyle=":", linewidth=1, label=f"p{p:g} share")
    colours = {PASS: "tab:green", FAIL: "tab:red"}
    for xi, s in zip(x, steps, strict=True):
        ax.annotate(s.status, (xi, 2), ha="center", fontsize=7, color=colours[s.status])
    ax.set_ylabel("attainment (%)")
    ax.set_ylim(0, 105)


def _latency_panel(
    ax: Any, steps: Sequence[Step], x: Sequence[float], colours: Mapping[str, str]
) -> None:
    names = sorted({n for s in steps for n in s.classes})
    styles = ("-", "-.", ":", "--")
    for index, name in enumerate(names):
        style = styles[index % len(styles)]
        for metric in ("ttft", "tpot"):
            values = [getattr(s.classes[name], f"{metric}_ms") if name in s.classes else None
                      for s in steps]  # fmt: skip
            slo = next((getattr(s.classes[name], f"{metric}_slo_ms") for s in steps
                        if name in s.classes), None)  # fmt: skip
            if slo is None and not any(v is not None for v in values):
                continue
            p = next(s.classes[name].percentile for s in steps if name in s.classes)
            ax.plot(x, _nan(values), marker="o", linestyle=style, color=colours[metric],
                    label=f"{name} {metric.upper()} p{p:g}")  # fmt: skip
            if slo is not None:
                ax.axhline(slo, color=colours[metric], linestyle="--", linewidth=1,
                           label=f"{name} {metric.upper()} SLO {slo:g} ms")  # fmt: skip
    ax.set_yscale("log")
    ax.set_ylabel("latency at the SLO percentile (ms)\n(missing: falls on a failure)")


def _mark_bracket(ax: Any, found: Search, x_scale: float, *, labelled: bool) -> None:
    """The highest pass, first fail and invalid steps as vertical lines (labelled once)."""

    def label(text: str) -> str | None:
        return text if labelled else None

    if found.highest_pass is not None:
        ax.axvline(found.highest_pass * x_scale, color="tab:green", linewidth=1.5,
                   label=label(f"highest pass {found.highest_pass * x_scale:.3g}"))  # fmt: skip
    if found.first_fail is not None:
        ax.axvline(found.first_fail * x_scale, color="tab:red", linewidth=1, linestyle=":",
                   label=label(f"first fail {found.first_fail * x_scale:.3g}"))  # fmt: skip
    for step in found.steps:
        if step.status == INVALID:
            ax.axvline(step.load * x_scale, color="tab:grey", linewidth=1, linestyle="-.",
                       label=label(f"invalid (generator) {step.load * x_scale:.3g}"))  # fmt: skip


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]
