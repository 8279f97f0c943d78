"""What `loadgen check` prints: the plan of a run, computed from the spec alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from loadgen.analysis.sizing import class_sizes, planned_units, size_text
from loadgen.units import NS_PER_S
from loadgen.workload.datasets import load_dataset
from loadgen.workload.plans import RequestPlan
from loadgen.workload.spec import ClassSpec, WorkloadSpec, offered_rate


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
    parts: list[RenderableType] = [
        table,
        Text(f"whole run: {len(plans)} requests over {span:,.1f} s; nothing was sent"),
        Text(offered_line(spec, plans)),
    ]
    parts.extend(Text(line) for line in source_lines(spec, plans))
    if show_schedule:
        parts.append(_schedule_table(plans))
    return Group(*parts)


def offered_line(spec: WorkloadSpec, plans: Sequence[RequestPlan]) -> str:
    """`offered load: 12 req/s (chat; summarize is a closed loop, outside it) asked; the
    schedule plans 11.4 req/s`: the one rate `--rate` and `capacity` speak of
    (`offered_rate`), as asked and as the sampled schedule has it (each open-loop class's
    arrivals over its own span)."""
    offered = offered_rate(spec)
    planned = [_arrival_rate(spec.classes[name], [p for p in plans if p.class_name == name])
               for name in offered.open_loop]  # fmt: skip
    sampled = (f"; the schedule plans {sum(r for r in planned if r is not None):,.3g} "
               f"{offered.unit}" if planned and None not in planned else "")  # fmt: skip
    return f"offered load: {offered.describe()} asked{sampled}"


def _arrival_rate(cls: ClassSpec, plans: Sequence[RequestPlan]) -> float | None:
    """A class's planned arrivals per second: its arrivals (requests, or the first turns of
    its sessions and trajectories) less one, over their span (None: fewer than two)."""
    starts = [p for p in plans if not p.turn]
    span = (starts[-1].intended_ns - starts[0].intended_ns) / NS_PER_S if len(starts) > 1 else 0.0
    return (len(starts) - 1) / span if span > 0 else None


def source_lines(spec: WorkloadSpec, plans: Sequence[RequestPlan]) -> list[str]:
    """Per class: its dataset (rows read, kept, dropped by reason, prompt and output length
    distributions of the rows kept), its shared-prefix set and its model mix as planned."""
    lines = []
    for name, cls in spec.classes.items():
        if cls.dataset is not None:
            data = load_dataset(cls.dataset, spec.target.tokenizer, cls.output_from_dataset)
            unit = "tokens" if spec.target.tokenizer else "words"
            dropped = ", ".join(f"{n:,} {why}" for why, n in data.dropped.items())
            lines.append(
                f"{name}: dataset {Path(cls.dataset.path).name} ({cls.dataset.format}, "
                f"turns: {cls.dataset.turns}): {data.rows:,} rows read, {len(data.kept):,} kept"
                + (f" (dropped: {dropped})" if dropped else "")
            )
            prompts = [row.prompt_tokens for row in data.kept]
            lines.append(f"  first-turn prompt {unit}: {_quantiles(prompts)}")
            outputs = [row.output_tokens for row in data.kept if row.output_tokens is not None]
            if outputs:
                lines.append(f"  recorded output {unit}: {_quantiles(outputs)}")
        if cls.shared_prefix is not None:
            shared = cls.shared_prefix
            lines.append(
                f"{name}: {shared.groups:,} shared prefixes of "
                f"{shared.shared_prefix_tokens:,} tokens, each request a fresh suffix"
            )
        if len(cls.models) > 1:
            counts = Counter(p.model for p in plans if p.class_name == name)
            total = sum(counts.values()) or 1
            mix = ", ".join(f"{model} {counts[model] / total:.0%} ({counts[model]:,})"
                            for model, _ in cls.models)  # fmt: skip
            lines.append(f"{name}: models {mix}")
    return lines


def _quantiles(values: Sequence[int]) -> str:
    """min / p50 / p90 / max and the mean of a list of lengths."""
    ordered = sorted(values)
    n = len(ordered)

    def q(p: float) -> int:
        return ordered[min(n - 1, int(p * n))]

    return (f"min {ordered[0]:,}, p50 {q(0.5):,}, p90 {q(0.9):,}, max {ordered[-1]:,}, "
            f"mean {sum(ordered) / n:,.0f} (n={n:,})")  # fmt: skip


def _class_cells(cls: ClassSpec, plans: Sequence[RequestPlan]) -> list[str]:
    n = len(plans)
    starts = [p for p in plans if not p.turn]  # sessions and trajectories start at turn 0
    if cls.concurrency is not None:
        starts = list(plans[:1])
    span = (starts[-1].intended_ns - starts[0].intended_ns) / NS_PER_S if len(starts) > 1 else 0.0
    arrivals = _arrival_rate(cls, plans) if cls.concurrency is None else None
    rate = "-" if arrivals is None else f"{arrivals:,.2f}"
    prompt = sum(p.prompt_tokens for p in plans)
    output = sum(p.output_tokens for p in plans)
    return [
        _count_text(cls, n, len(starts)),
        _arrival_text(cls),
        rate,
        f"{span:,.1f}",
        f"{prompt / max(n, 1):,.0f} / {prompt:,}",
        f"{output / max(n, 1):,.0f} / {output:,}",
        _objective_text(cls),
    ]


def _count_text(cls: ClassSpec, requests: int, starts: int) -> str:
    if cls.concurrency is not None:
        return f"{requests:,} docs, {cls.concurrency} at a time"
    if cls.kind == "agent":
        return f"{requests:,} in {starts:,} trajectories"
    if cls.is_flow:
        return f"{requests:,} in {starts:,} sessions"
    return f"{requests:,}"


def _arrival_text(cls: ClassSpec) -> str:
    a = cls.arrival
    if cls.concurrency is not None:
        text = "closed loop"
    elif a.process == "gamma":
        text = f"gamma cv={a.cv:g} @{a.rate_per_s:g}/s"
    elif a.process == "onoff":
        text = (f"onoff {a.on_rate_per_s:g}/s for ~{a.on_mean_s:g}s, "
                f"{a.off_rate_per_s:g}/s for ~{a.off_mean_s:g}s")  # fmt: skip
    elif a.process == "ramp":
        text = "ramp " + " → ".join(f"{r:g}/s×{d:g}s" for r, d in a.steps)
    elif a.process == "trace":
        assert a.trace is not None
        text = f"trace {Path(a.trace.path).name}"
        if a.trace.speed != 1:
            text += f" ×{a.trace.speed:g} speed"
    else:
        text = f"{a.process} @{a.rate_per_s:g}/s"
    return text + (f" from {a.start_s:g}s" if a.start_s else "")


def _objective_text(cls: ClassSpec) -> str:
    slo = cls.slo
    targets = [
        f"{k} {v:g}"
        for k, v in (("TTFT ms", slo.ttft_ms), ("TPOT ms", slo.tpot_ms),
                     ("ITL ms", slo.itl_ms), ("E2E ms", slo.e2e_ms))
        if v is not None
    ]  # fmt: skip
    if cls.kind == "summarization":
        deadline = f" in {cls.batch_deadline_s:g} s" if cls.batch_deadline_s else ""
        return f"whole batch ok{deadline}"
    if cls.kind == "agent":
        budget = f" in {cls.trajectory_budget_s:g} s" if cls.trajectory_budget_s else ""
        final = f", final hop {', '.join(targets)}" if targets else ""
        return f"{slo.percentile:g}% of trajectories ok{budget}{final}"
    return f"p{slo.percentile:g}: " + ", ".join(targets) if targets else "none"


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


def sizing_lines(spec: WorkloadSpec, plans: Sequence[RequestPlan]) -> list[Text]:
    """Per class: how many requests (trajectories) its SLO needs to be judged at its
    confidence, and whether the plan has them; a warning, with what to change, when not."""
    return [
        Text(size_text(size), style="" if size.enough else "bold yellow")
        for size in class_sizes(spec, planned_units(spec, plans))
    ]
