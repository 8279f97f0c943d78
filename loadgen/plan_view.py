"""What `loadgen check` prints: the plan of a run, computed from the spec alone."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from loadgen.plans import RequestPlan
from loadgen.spec import ClassSpec, WorkloadSpec

NS_PER_S = 1e9


def render_plan(
    spec: WorkloadSpec, plans: Sequence[RequestPlan], *, show_schedule: bool = False
) -> RenderableType:
    """A table per class: requests, arrival process, mean rate, token totals, span, SLOs."""
    table = Table(title=f"{spec.name}: {len(plans)} planned requests ({spec.source})")
    for column in (
        "class",
        "requests",
        "arrivals",
        "rate req/s",
        "span s",
        "prompt tok (mean / total)",
        "output tok (mean / total)",
        "SLO",
    ):
        table.add_column(
            column, justify="left" if column in ("class", "arrivals", "SLO") else "right"
        )
    for name, cls in spec.classes.items():
        mine = [p for p in plans if p.class_name == name]
        table.add_row(name, *_class_cells(cls, mine))
    span = (plans[-1].intended_ns - plans[0].intended_ns) / NS_PER_S if plans else 0.0
    rate = (len(plans) - 1) / span if span > 0 else float("nan")
    parts: list[RenderableType] = [
        table,
        Text(
            f"whole run: {len(plans)} requests over {span:,.1f} s "
            f"(mean {rate:,.2f} req/s); nothing was sent"
        ),
    ]
    if show_schedule:
        parts.append(_schedule_table(plans))
    return Group(*parts)


def _class_cells(cls: ClassSpec, plans: Sequence[RequestPlan]) -> list[str]:
    n = len(plans)
    span = (plans[-1].intended_ns - plans[0].intended_ns) / NS_PER_S if n > 1 else 0.0
    rate = f"{(n - 1) / span:,.2f}" if span > 0 else "-"
    arrival = cls.arrival.process + (
        f" cv={cls.arrival.cv:g}" if cls.arrival.process == "gamma" else ""
    )
    arrival += f" @{cls.arrival.rate_per_s:g}/s"
    if cls.arrival.start_s:
        arrival += f" from {cls.arrival.start_s:g}s"
    prompt = sum(p.prompt_tokens for p in plans)
    output = sum(p.output_tokens for p in plans)
    slo = cls.slo
    targets = [
        f"{k} {v:g}"
        for k, v in (
            ("TTFT ms", slo.ttft_ms),
            ("TPOT ms", slo.tpot_ms),
            ("ITL ms", slo.itl_ms),
            ("E2E ms", slo.e2e_ms),
        )
        if v is not None
    ]
    slo_text = f"p{slo.percentile:g}: " + ", ".join(targets) if targets else "none"
    return [
        f"{n:,}",
        arrival,
        rate,
        f"{span:,.1f}",
        f"{prompt / max(n, 1):,.0f} / {prompt:,}",
        f"{output / max(n, 1):,.0f} / {output:,}",
        slo_text,
    ]


def _schedule_table(plans: Sequence[RequestPlan], limit: int = 20) -> Table:
    table = Table(title=f"first {min(limit, len(plans))} of {len(plans)} intended sends")
    for column in ("id", "class", "t (s)", "gap (ms)", "prompt tok", "output tok"):
        table.add_column(column, justify="right")
    previous = None
    for plan in plans[:limit]:
        gap = "" if previous is None else f"{(plan.intended_ns - previous) / 1e6:,.1f}"
        table.add_row(
            str(plan.request_id),
            plan.class_name,
            f"{plan.intended_ns / NS_PER_S:.3f}",
            gap,
            str(plan.prompt_tokens),
            str(plan.output_tokens),
        )
        previous = plan.intended_ns
    return table
