"""How many requests each class's SLO checks need to be judged, against what a plan holds.

Before any traffic (`loadgen check`, and `run`'s warning), from the spec and the planned
requests per class. A percentile target at confidence L can only be MET once the largest
value bounds the percentile from above: n >= log(1 − L) / log(p/100)
(`confidence.samples_needed`: 299 for p99 at 95 %, 29 for p90, 59 for p95); fewer, and the
check can only be MISSED or INCONCLUSIVE. The same count holds for every check of a class
(TTFT, TPOT, ITL and E2E judge requests; ITL counts requests, not gaps). An agent class's
trajectory share needs that many trajectories, every one ok (the exact lower bound of
n/n is (1 − L)^(1/n)). A summarization batch is judged whole: no count applies. The counts
are the least that can judge: values near their target need more.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loadgen.analysis.confidence import samples_needed
from loadgen.workload.plans import RequestPlan
from loadgen.workload.spec import WorkloadSpec

# The percentiles `check` suggests when a plan is too small for its own (the first whose
# need the plan meets).
SUGGESTED = (95.0, 90.0, 80.0, 50.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassSize:
    """One class: what is counted (`requests`, `trajectories`), how many the plan holds,
    how many its SLO needs at its confidence (None: never enough, a p100), the percentile
    and the level, and a lower percentile the plan could judge (None: none needed or
    none of SUGGESTED fits)."""

    name: str
    unit: str
    planned: int
    needed: int | None
    percentile: float
    confidence: float
    suggested: float | None = None

    @property
    def enough(self) -> bool:
        """The plan holds at least the count needed."""
        return self.needed is not None and self.planned >= self.needed


def class_sizes(spec: WorkloadSpec, planned: Mapping[str, int]) -> list[ClassSize]:
    """Every class whose SLO is judged from a sample (a batch is not), with `planned`, what
    the plan holds of its unit: requests, or an agent class's trajectories."""
    sizes = []
    for name, cls in spec.classes.items():
        slo = cls.slo
        if cls.kind == "summarization" or not slo.thresholds_ms():
            continue
        agent = cls.kind == "agent"
        count = planned.get(name, 0)
        needed = samples_needed(slo.percentile, slo.confidence)
        suggested = None
        if needed is None or count < needed:
            fits = [p for p in SUGGESTED if p < slo.percentile
                    and (samples_needed(p, slo.confidence) or math.inf) <= count]  # fmt: skip
            suggested = fits[0] if fits else None
        sizes.append(ClassSize(
            name=name, unit="trajectories" if agent else "requests", planned=count,
            needed=needed, percentile=slo.percentile, confidence=slo.confidence,
            suggested=suggested,
        ))  # fmt: skip
    return sizes


def planned_units(spec: WorkloadSpec, plans: Sequence[RequestPlan]) -> dict[str, int]:
    """Per class, what its verdict counts: requests, or an agent class's trajectories."""
    counts: dict[str, int] = {}
    for name, cls in spec.classes.items():
        mine = [p for p in plans if p.class_name == name]
        counts[name] = len({p.session_id for p in mine}) if cls.kind == "agent" else len(mine)
    return counts


def size_warnings(spec: WorkloadSpec, plans: Sequence[RequestPlan]) -> list[str]:
    """`size_text` of each class whose plan is too small to be MET (what `run` warns of)."""
    sizes = class_sizes(spec, planned_units(spec, plans))
    return [size_text(s) for s in sizes if not s.enough]


def size_text(size: ClassSize) -> str:
    """`chat: p90 judged at 95%: needs ≥ 29 requests to be MET; the plan has 40`, or a
    WARNING saying what the plan lacks and what to change."""
    level = f"{size.confidence:.0%}"
    p = f"p{size.percentile:g}"
    if size.unit == "trajectories":  # a share of trajectories, not a percentile of latencies
        p = f"a {size.percentile:g}% share of trajectories"
    if size.needed is None:
        return (
            f"WARNING {size.name}: {p} at {level}: no sample bounds a p100 from above, so its "
            "checks can only be MISSED or INCONCLUSIVE (exit 7); judge a lower percentile"
        )
    all_ok = " all ok" if size.unit == "trajectories" else ""
    if size.enough:
        return (
            f"{size.name}: {p} judged at {level}: needs ≥ {size.needed:,} {size.unit}{all_ok} "
            f"to be MET; the plan has {size.planned:,}"
        )
    fix = "--requests, --duration or --rate" if size.unit == "requests" else "--requests"
    lower = "" if size.suggested is None else (
        f", or ask a {size.suggested:g}% share" if size.unit == "trajectories"
        else f", or judge p{size.suggested:g}")  # fmt: skip
    return (
        f"WARNING {size.name}: {p} at {level} needs ≥ {size.needed:,} {size.unit}{all_ok} to "
        f"be MET; the plan has {size.planned:,}: its checks can only be MISSED or "
        f"INCONCLUSIVE (exit 7). Plan more ({fix}){lower}."
    )
