"""`loadgen capacity` for people: the rules every step is judged by, each step's verdict
and evidence as it lands, the steps table, the conclusion, and the study's files
(capacity.json, knee.png). Where the server said its queue and prefill, each step says where
TTFT went, and the conclusion which part moved it across the knee (`split_view`).

Latencies are each class's SLO percentile (nearest rank) with failures ranked worst.
"""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from loadgen.analysis.capacity import (
    FAIL,
    INVALID,
    NOT_JUDGED,
    PASS,
    RATE_TOLERANCE,
    UNDECIDED,
    WARMUP_LIFETIMES,
    ClassFigures,
    Search,
    Step,
    Verdict,
    planned_size,
    required_requests,
    to_json,
)
from loadgen.measures import BY_NAME, TPOT, TTFT
from loadgen.render.capacity_axis import LoadAxis
from loadgen.render.knee_plot import knee_png
from loadgen.render.split_view import WITH_LOAD, moved_part, moved_text, parts_text, point_label
from loadgen.render.terminal import fmt_num, with_unit
from loadgen.results.runfolder import CAPACITY_FILE, KNEE_PLOT
from loadgen.workload.spec import WorkloadSpec


def rule_lines(
    spec: WorkloadSpec, min_tail: int, min_lifetimes: float, warmup_s: float | None, param: str
) -> list[str]:
    """The rules every step is judged by, stated before the first step runs."""
    required = required_requests(spec, min_tail)
    parts = [
        f"{name} p{spec.classes[name].slo.percentile:g} needs >= {n:,} judged requests"
        for name, n in required.items()
    ]
    warmup = (
        f"the first {warmup_s:g} s"
        if warmup_s is not None
        else f"the first 10 % or {WARMUP_LIFETIMES:g} mean lifetimes, whichever is longer,"
    )
    lines = [
        f"each step: {'; '.join(parts) or 'no percentile SLOs'} ({min_tail} beyond the "
        f"percentile: n >= {min_tail}/(1 - p/100)), and its judged part lasts >= "
        f"{min_lifetimes:g} mean lifetimes (intended → end) of its own requests; {warmup} "
        "of each step is warm-up, left out",
    ]
    if param == "rate":
        lines.append(
            f"a step passes only at a steady state: completed within {RATE_TOLERANCE:.0%} of "
            "the offered rate, requests in flight and TTFT (from each request's dispatch) not "
            "rising across the judged part (10 slices; beyond a 99.9 % one-sided bound from "
            "their scatter and beyond one request's worth), and every SLO met at its "
            "confidence (a step whose SLOs are neither met nor missed is run again, longer)"
        )
    else:
        lines.append(
            "a closed loop sends as fast as it completes, so every step is steady at its cap "
            "(completed vs offered and the TTFT trend are shown, not judged); latencies are "
            "judged from the send, and every SLO must be met"
        )
    lines.append(
        "a step is invalid (the generator's, not the server's) only when the client could "
        f"not run it: requests failed in the client, its sends more than {RATE_TOLERANCE:.0%} "
        "short of the scheduled rate, or its own time could have changed the SLO verdict "
        "(its send lag is charged to TTFT: a MET that holds with it stands)"
    )
    return lines


def evidence_line(step: Step) -> str:
    """One step's steady-state evidence: rates, lifetimes, trends."""
    steady = step.steady
    assert steady is not None
    share = steady.completed_share
    parts = [
        f"offered {steady.offered_per_s:.3g} req/s, completed {steady.completed_per_s:.3g}"
        + (f" ({share:.1%})" if share is not None else ""),
        f"judged {steady.window_s:.1f} s = "
        + (f"{steady.lifetimes:.1f} lifetimes of {steady.lifetime_s:.3g} s"
           if steady.lifetimes is not None and steady.lifetime_s is not None
           else "no lifetime measured"),
        f"mean in flight {steady.mean_in_flight:.3g}",
    ]  # fmt: skip
    for trend in steady.trends:
        unit = " ms" if trend.series == TTFT.column else ""
        name = TTFT.label if trend.series == TTFT.column else "in flight"
        tag = "" if not trend.rising else " rising" if step.closed_loop else " RISING"
        parts.append(
            f"{name} {_figure(trend.rise, sign=True)}{unit} (bound "
            f"{_figure(trend.allowance)}{unit}, floor {_figure(trend.floor)}{unit}){tag}"
        )
    if step.closed_loop:
        parts.append("closed loop: rate and trends shown, not judged")
    if step.extended > 1:
        parts.append(f"run {step.attempts} times, judged on the last (×{step.extended:g} long)")
    elif step.attempts > 1:
        parts.append("run twice (the first was too short)")
    return " · ".join(parts)


def start_line(load: float, spec_at: WorkloadSpec, axis: LoadAxis) -> str:
    """What a step is about to send: how long, how many requests."""
    seconds, requests = planned_size(spec_at)
    length = f"{seconds:,.0f} s of sending, " if seconds else ""
    return f"running {axis.text(load)}: {length}~{requests:,.0f} requests"


def step_lines(step: Step, axis: LoadAxis) -> list[Text | str]:
    """A step's verdict with its reason, and its steady-state evidence when it has any."""
    lines: list[Text | str] = [Text.assemble(f"step {axis.text(step.load)}: ", status_text(step))]
    if step.steady is not None:
        lines.append(f"  {evidence_line(step)}")
    lines.extend(f"  {line}" for line in bounds_lines(step))
    lines.extend(f"  {line}" for line in split_lines(step))
    return lines


def split_lines(step: Step) -> list[str]:
    """Per class whose server said, where TTFT went at the step: `chat TTFT p90 1,150 ms
    went to queue 864 (75%), prefill 270 (23%), outside the engine 16 (1%)`."""
    return [f"{name} {point_label(c.ttft_split)} went to {parts_text(c.ttft_split)}"
            for name, c in step.classes.items() if c.ttft_split is not None]  # fmt: skip


def bounds_lines(step: Step) -> list[str]:
    """Per class, the TTFT and TPOT percentile with its confidence bounds and the verdict:
    `chat TTFT p90 412 ms (95% bounds 398–431 ms) ≤ 1,000 ms: met`; a value or bound on a
    failed request is `fail`, a bound the sample is too small to reach `open`."""
    lines = []
    for name, c in step.classes.items():
        parts = []
        for metric in (TTFT.name, TPOT.name):  # the measures a step records (`StepClass`)
            target = getattr(c, f"{metric}_slo_ms")
            if target is None:
                continue
            value, low, high = (getattr(c, f"{metric}{end}_ms") for end in ("", "_low", "_high"))
            low_open, high_open = (getattr(c, f"{metric}_{end}_open") for end in ("low", "high"))
            shown = "fail" if value is None else with_unit(value, "ms")
            level = f"{c.confidence:.0%} " if c.confidence is not None else ""
            bounds = f"{_bound(low, low_open)}–{_bound(high, high_open)}"
            label = BY_NAME[metric].label
            parts.append(f"{label} p{c.percentile:g} {shown} ({level}bounds {bounds}) "
                         f"≤ {with_unit(target, 'ms')}")  # fmt: skip
        if parts:
            lines.append(f"{name} " + " · ".join(parts) + f": {c.verdict}")
    return lines


def _bound(value: float | None, is_open: bool) -> str:
    """A bound in ms; `open` where the sample is too small to reach it, `fail` where it
    falls on a failed request."""
    if value is None:
        return "open" if is_open else "fail"
    return with_unit(value, "ms")


def _figure(value: float, *, sign: bool = False) -> str:
    """3 significant figures, never an exponent: `-1,110`, `2,800`, `12.3`, `0.42`."""
    magnitude = abs(value)
    decimals = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2
    return fmt_num(value, decimals, sign=sign)


STATUS_COLOUR = {PASS: "green", FAIL: "red", INVALID: "yellow", UNDECIDED: "magenta"}


def status_text(step: Step) -> Text:
    colour = STATUS_COLOUR.get(step.status, "magenta")
    text = Text(step.status.upper(), style=f"bold {colour}")
    if step.note:
        text.append(f" ({step.note})")
    return text


def steps_table(found: Search, axis: LoadAxis) -> Table:
    """One row per step, in load order: counts, attainment, goodput vs throughput, latencies."""
    names = sorted({n for s in found.steps for n in s.classes})
    required = max((c.required or 0 for s in found.steps for c in s.classes.values()), default=0)
    title = "capacity steps (after warm-up" + (f"; judged >= {required:,}" if required else "")
    table = Table(box=box.SIMPLE_HEAD, title=title + "; latencies in ms)")
    table.add_column("load", justify="right")
    if axis.unit:
        table.add_column(axis.unit, justify="right")
    for heading in ("judged", "done\n%", "life-\ntimes", "in flight\nrise", "TTFT\nrise",
                    "attain.", "good\ntok/s", "thru\ntok/s"):  # fmt: skip
        table.add_column(heading, justify="right")
    for name in names:
        p = next(s.classes[name].percentile for s in found.steps if name in s.classes)
        table.add_column(f"{name}\nTTFT p{p:g}", justify="right")
        table.add_column(f"{name}\nTPOT p{p:g}", justify="right")
    table.add_column("verdict")
    for step in sorted(found.steps, key=lambda s: s.load):
        cells: list[str | Text] = [f"{step.load:.3g}" + ("x" if axis.param == "rate" else "")]
        if axis.unit:
            cells.append(f"{axis.value(step.load):.3g}")
        cells += [
            f"{step.requests:,}",
            *_steady_cells(step),
            "—" if step.attainment is None else f"{step.attainment:.1%}",
            _num(step.goodput_tok_per_s),
            _num(step.throughput_tok_per_s),
        ]
        for name in names:
            figures = step.classes.get(name)
            cells += [_ms(figures, TTFT.name), _ms(figures, TPOT.name)]
        colour = STATUS_COLOUR.get(step.status, "magenta")
        cells.append(Text(step.status.upper(), style=f"bold {colour}"))
        table.add_row(*cells)
    return table


def _steady_cells(step: Step) -> list[str | Text]:
    """Completed req/s (share of offered), lifetimes judged, in-flight and TTFT rise."""
    steady = step.steady
    if steady is None:
        return ["—"] * 4
    share = steady.completed_share
    done = "—" if share is None else f"{share:.0%}"
    trends = {t.series: t for t in steady.trends}
    cells: list[str | Text] = [
        Text(done, style="red") if step.over_saturated else done,
        "—" if steady.lifetimes is None else f"{steady.lifetimes:.0f}",
    ]
    for series, decimals in (("in_flight", 1), (TTFT.column, 0)):
        trend = trends.get(series)
        if trend is None:
            cells.append("—")
            continue
        text = fmt_num(trend.rise, decimals, sign=True)
        cells.append(Text(text, style="red") if trend.rising else text)
    return cells


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _ms(figures: ClassFigures | None, metric: str) -> str | Text:
    if figures is None:
        return "—"
    value = getattr(figures, f"{metric}_ms")
    slo = getattr(figures, f"{metric}_slo_ms")
    if value is None:
        return Text("fail", style="red") if figures.requests else "—"
    text = f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
    return Text(text, style="red") if slo is not None and value > slo else text


def conclusion(
    found: Search, verdict: Verdict | None, axis: LoadAxis, safety_margin: float
) -> list[Text]:
    """What the search measured and what it advises, every sentence true of its steps: an
    invalid step is said to be the generator's (never "raise --max" above it), a pass over
    the ceiling says why it stands, a re-judged step says what re-judged it."""
    lines = []
    stopped = found.stopped_by
    invalid = stopped is not None and stopped.status == INVALID
    if stopped is not None and invalid and not judged_steps(found):
        lines.append(Text(
            f"no step was judged: at {axis.text(stopped.load)}, the first load, "
            f"{stopped.note}; its numbers describe the client, not the server (exit 3): "
            "rerun on a bigger or quieter machine, or with --workers",
            style="bold yellow",
        ))  # fmt: skip
        return lines
    if stopped is not None and invalid:
        lines.append(Text(
            f"stopped at {axis.text(stopped.load)}: {stopped.note}; the generator could not "
            "run that load, so the search went no further: loads above the highest pass "
            "there were not judged (rerun on a bigger or quieter machine, or with --workers)",
            style="yellow",
        ))  # fmt: skip
    lines += _ceiling_lines(found, axis)
    lines += [Text(f"step {axis.text(s.load)} re-judged FAIL: {s.note}", style="yellow")
              for s in found.steps if "re-judged" in s.reasons]  # fmt: skip
    if found.highest_pass is None:
        lines.append(Text("no load passed every SLO: lower --start", style="bold red"))
    elif found.upper is None and invalid:
        lines.append(
            Text(
                f"highest passing load {axis.text(found.highest_pass)}; the knee "
                "above it is unknown (the search stopped at an invalid step)"
            )
        )
    elif found.upper is None:
        lines.append(Text(f"highest passing load {axis.text(found.highest_pass)}; no step up "
                          "to --max failed, so the knee lies above it: raise --max"))  # fmt: skip
    else:
        lines += _knee_lines(found, axis)
        lines += knee_split_lines(found, axis)
    if verdict is not None:
        lines.append(_verdict_line(verdict, axis, safety_margin))
    return lines


def _ceiling_lines(found: Search, axis: LoadAxis) -> list[Text]:
    """What an over-saturated step showed: the ceiling it sets, or why a pass stands above it."""
    if found.capacity is None or found.ceiling is None:
        return []
    served = f"over-saturated, the server served at most {axis.text(found.capacity)}"
    if found.ceiling_holds:
        return [Text(f"{served}; no load at or above {axis.text(found.ceiling)} "
                     f"({1 - RATE_TOLERANCE:.0%} of it) can pass")]  # fmt: skip
    above = [s for s in found.steps if s.status == PASS and s.load >= found.ceiling]
    return [Text(
        f"{served}; the pass at {axis.text(s.load)} stands above {axis.text(found.ceiling)} "
        f"({1 - RATE_TOLERANCE:.0%} of it): its own ok completions served "
        f"{axis.text(s.served or s.load)}, steadily, so the server serves less overloaded "
        "than at its knee, and the ceiling bounds nothing"
    ) for s in above]  # fmt: skip


def _knee_lines(found: Search, axis: LoadAxis) -> list[Text]:
    """The highest pass, what bounds the knee from above, and the bracket."""
    assert found.highest_pass is not None
    assert found.upper is not None
    if found.first_fail is not None and found.upper == found.first_fail:
        bound = f"the first failing load {axis.text(found.first_fail)}"
        step = next(s for s in found.steps if s.load == found.first_fail)
        if step.reasons:
            bound += f" ({', '.join(step.reasons)})"
    elif found.first_undecided is not None and found.upper == found.first_undecided:
        bound = (f"the first load still inconclusive when extended "
                 f"{axis.text(found.first_undecided)}")  # fmt: skip
    else:
        bound = f"the capacity bound {axis.text(found.upper)}"
    return [
        Text(f"highest passing load {axis.text(found.highest_pass)}, {found.margin:.1%} below "
             f"{bound}", style="bold"),
        Text(f"the knee lies in [{axis.text(found.highest_pass)}, {axis.text(found.upper)}): "
             "shown to pass at the first, not shown to pass at the second"),
    ]  # fmt: skip


def knee_split_lines(found: Search, axis: LoadAxis) -> list[Text]:
    """Per class, what moved TTFT across the knee: its split at the highest pass and at the
    step above it, and what the part that grew most points to with the load (`WITH_LOAD`:
    queueing, admission or replicas; prefill, contention for its steps), when the server said
    at both."""
    below = next((s for s in found.steps if s.load == found.highest_pass), None)
    above = next((s for s in found.steps if s.load == found.upper), None)
    if below is None or above is None:
        return []
    lines = []
    for name, c in above.classes.items():
        low = below.classes.get(name)
        before, after = low.ttft_split if low else None, c.ttft_split
        if before is None or after is None:
            continue
        lines.append(Text(
            f"where {name}'s TTFT p{c.percentile:g} went across the knee, "
            f"{axis.text(below.load)} → {axis.text(above.load)}: {moved_text(before, after)}"
            f" → {WITH_LOAD[moved_part(before, after)]}",
            style="bold",
        ))  # fmt: skip
    return lines


def _verdict_line(verdict: Verdict, axis: LoadAxis, safety_margin: float) -> Text:
    words = {PASS: ("PASS", "bold green"), NOT_JUDGED: ("NOT JUDGED", "bold yellow")}
    text, style = words.get(verdict.status, ("FAIL", "bold red"))
    proposed = axis.text(verdict.proposed)
    if verdict.allowed is None:
        reason = "no load passed every SLO"
    else:
        allowed = axis.text(verdict.allowed)
        relation = "<=" if verdict.passed else ">"
        reason = (f"{proposed} {relation} {allowed} = highest pass less the "
                  f"{safety_margin:.0%} safety margin")  # fmt: skip
    if verdict.status == NOT_JUDGED:
        reason += ("; a load that would have allowed it was never judged: the search stopped "
                   "at a step the generator could not run (exit 3)")  # fmt: skip
    return Text.assemble("proposed limit ", proposed, ": ", Text(text, style=style),
                         f" ({reason})")  # fmt: skip


def capacity_files(
    found: Search, verdict: Verdict | None, axis: LoadAxis, settings: dict[str, Any]
) -> dict[str, bytes]:
    """capacity.json (`analysis.capacity.to_json`) and knee.png, for the command to write
    (`results.write.write_files`), on the search's `axis`."""
    data = to_json(found, verdict, settings, axis.scale if axis.unit else None)
    files = {CAPACITY_FILE: (json.dumps(data, indent=2) + "\n").encode("utf-8")}
    if judged_steps(found):  # else there is nothing to draw: no knee.png, and the
        files[KNEE_PLOT] = knee_png(found, axis, verdict)  # why is said
    return files


def judged_steps(found: Search) -> list[Step]:
    """The steps with a verdict on the server (passed, failed, or inconclusive however long
    they ran): what the knee plot draws."""
    return [s for s in found.steps if s.status in (PASS, FAIL, UNDECIDED)]
