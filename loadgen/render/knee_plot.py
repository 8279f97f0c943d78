"""The knee plot of a capacity search (`knee.png`): the steps' verdicts and figures vs load.

Drawn from a finished `loadgen.analysis.capacity.Search` alone, with `plots.figure_png`;
the search itself never imports matplotlib. One load axis for the four panels, in the
search's unit (`render.capacity_axis`: req/s of the open-loop classes, or the cap), each
panel's y in one unit; each class has its own colour, each latency its own line style;
every vertical line (highest pass, first fail with its reasons, the ceiling and whether it
holds, invalid and re-judged steps, the proposed limit and the allowed one) is named in
the legend, outside the panels, so no label lies over the data or over another label.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

from matplotlib import ticker
from matplotlib.figure import Figure  # no pyplot: nothing global to clean up

from loadgen.analysis.capacity import FAIL, INVALID, NOT_JUDGED, PASS, UNDECIDED, Search, Step
from loadgen.analysis.capacity import Verdict as LimitVerdict
from loadgen.measures import BY_NAME, TPOT, TTFT
from loadgen.render import plots
from loadgen.render.capacity_axis import LoadAxis

CLASS_COLOURS = ("tab:blue", "tab:brown", "tab:cyan", "tab:pink", "tab:olive", "navy")
STATUS_MARKS = {  # a step's verdict as a marker along the top of the attainment panel
    PASS: ("o", "tab:green", "step passed"),
    FAIL: ("X", "tab:red", "step failed"),
    UNDECIDED: ("D", "tab:purple", "step inconclusive (extended)"),
}
# The measures a capacity step records at its SLO percentile (`StepClass`), and their line
METRIC_STYLES = {TTFT.name: ("-", "o"), TPOT.name: ("--", "s")}
LABEL_WIDTH = 46  # a legend line's characters at fontsize 7 beside the panels
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 7, "borderaxespad": 0}


def knee_png(found: Search, axis: LoadAxis, verdict: LimitVerdict | None = None) -> bytes:
    """Attainment, offered vs completed requests, goodput vs raw throughput, and the
    SLO-percentile latencies vs load, with the search's bracket and the proposed limit.

    Judged steps (passed, failed, inconclusive) make the curves; an invalid step's figures
    are the client's, so it is a grey line only. A re-judged step is marked apart."""
    steps = sorted((s for s in found.steps if s.status in STATUS_MARKS), key=lambda s: s.load)
    names = sorted({n for s in steps for n in s.classes})
    colours = {name: CLASS_COLOURS[i % len(CLASS_COLOURS)] for i, name in enumerate(names)}
    fig = Figure(figsize=(11.0, 11.5))
    top, rates, middle, bottom = fig.subplots(4, 1, sharex=True)
    fig.subplots_adjust(left=0.09, right=0.70, bottom=0.06, top=0.93, hspace=0.14)
    x = [axis.value(s.load) for s in steps]
    _attainment_panel(top, steps, x, colours)
    _rates_panel(rates, steps, x, axis)
    _goodput_panel(middle, steps, x)
    _latency_panel(bottom, steps, x, colours)
    marks = _marks(found, axis, verdict)
    for ax in (top, rates, middle, bottom):
        ax.grid(True, alpha=0.3)
        for at, style, label in marks:
            ax.axvline(at, **style, label=_wrapped(label) if ax is top else None)
        ax.legend(**LEGEND)
    if x and max(x) / min(x) > 4:
        bottom.set_xscale("log", base=2)
        bottom.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        bottom.xaxis.set_minor_formatter(ticker.NullFormatter())
    bottom.set_xlabel(axis.title)
    fig.suptitle(_title(found, axis, verdict), fontsize=11)
    return plots.figure_png(fig)


def _title(found: Search, axis: LoadAxis, verdict: LimitVerdict | None) -> str:
    """`capacity: SLOs vs offered load (req/s) — highest passing load 14.2 req/s; proposed
    limit 12 req/s: PASS`."""
    unit = axis.unit or ("concurrent requests" if axis.param == "max_in_flight" else "× rates")
    title = f"capacity: SLOs vs offered load ({unit})"
    if found.highest_pass is not None:
        title += f" — highest passing load {_at(axis, found.highest_pass)}"
    if verdict is not None:
        word = {PASS: "PASS", NOT_JUDGED: "NOT JUDGED"}.get(verdict.status, "FAIL")
        title += f"\nproposed limit {_at(axis, verdict.proposed)}: {word}"
    return title


def _at(axis: LoadAxis, load: float) -> str:
    """A load on the axis's scale with its unit: `12 req/s`, `6 in flight`."""
    if axis.param == "max_in_flight":
        return f"{load:g} in flight"
    return f"{axis.value(load):.3g} {axis.unit}" if axis.unit else f"{load:.3g}x"


def _attainment_panel(
    ax: Any, steps: Sequence[Step], x: Sequence[float], colours: dict[str, str]
) -> None:
    """Each class's attainment in its colour, the SLO percentiles' shares, and each step's
    verdict as a marker along the top (a re-judged step's ringed)."""
    for name, colour in colours.items():
        y = [_pct(s.classes[name].attainment) if name in s.classes else None for s in steps]
        ax.plot(x, _nan(y), "o-", color=colour, label=f"{name} attainment")
    judged = {c.percentile for s in steps for c in s.classes.values()
              if c.ttft_slo_ms is not None or c.tpot_slo_ms is not None}  # fmt: skip
    for p in sorted(judged):  # the share a percentile target asks for (a batch asks none)
        ax.axhline(p, color="grey", linestyle=":", linewidth=1, label=f"p{p:g} share")
    for status, (marker, colour, label) in STATUS_MARKS.items():
        at = [xi for xi, s in zip(x, steps, strict=True) if s.status == status]
        if at:
            ax.plot(at, [104] * len(at), marker, color=colour, linestyle="none", label=label)
    rejudged = [xi for xi, s in zip(x, steps, strict=True) if "re-judged" in s.reasons]
    if rejudged:
        ax.plot(rejudged, [104] * len(rejudged), "o", markersize=12, markerfacecolor="none",
                markeredgecolor="tab:orange", linestyle="none",
                label="re-judged FAIL by an over-saturated step")  # fmt: skip
    ax.set_ylabel("attainment (%)")
    ax.set_ylim(0, 109)


def _rates_panel(ax: Any, steps: Sequence[Step], x: Sequence[float], axis: LoadAxis) -> None:
    """Offered and completed requests/s of the judged parts: they part at saturation."""
    offered = [s.steady.offered_per_s if s.steady else None for s in steps]
    done = [s.steady.completed_per_s if s.steady else None for s in steps]
    ax.plot(x, _nan(offered), "s--", color="tab:grey", label="offered req/s (every class)")
    ax.plot(x, _nan(done), "o-", color="tab:blue", label="completed req/s (any outcome)")
    saturated = [(xi, d) for xi, s, d in zip(x, steps, done, strict=True) if s.over_saturated]
    if saturated:
        ax.plot(*zip(*saturated, strict=True), "o", color="tab:red", label="over-saturated")
    ax.set_ylabel("requests/s (judged part)")
    ax.set_ylim(bottom=0)


def _goodput_panel(ax: Any, steps: Sequence[Step], x: Sequence[float]) -> None:
    """Goodput (tokens of requests within SLO) against raw throughput, tokens/s."""
    ax.plot(x, _nan([s.goodput_tok_per_s for s in steps]), "o-", color="tab:green",
            label="goodput (tokens of requests within SLO)")  # fmt: skip
    ax.plot(x, _nan([s.throughput_tok_per_s for s in steps]), "s--", color="tab:grey",
            label="raw throughput (all tokens)")  # fmt: skip
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)


def _latency_panel(
    ax: Any, steps: Sequence[Step], x: Sequence[float], colours: dict[str, str]
) -> None:
    """Each class's TTFT and TPOT at its SLO percentile (its colour; TTFT solid, TPOT
    dashed), their confidence bounds as bars, and each target a thin line of that style."""
    for name, colour in colours.items():
        p = next(s.classes[name].percentile for s in steps if name in s.classes)
        for metric, (style, marker) in METRIC_STYLES.items():
            values = [getattr(s.classes[name], f"{metric}_ms") if name in s.classes else None
                      for s in steps]  # fmt: skip
            slo = next((getattr(s.classes[name], f"{metric}_slo_ms") for s in steps
                        if name in s.classes), None)  # fmt: skip
            if slo is None:  # no target: the plot shows what the verdict judged
                continue
            ax.plot(x, _nan(values), marker=marker, linestyle=style, color=colour,
                    label=f"{name} {BY_NAME[metric].label} p{p:g}")  # fmt: skip
            _bounds(ax, steps, x, name, metric, colour)
            if slo is not None:
                ax.axhline(slo, color=colour, linestyle=style, linewidth=0.8, alpha=0.7,
                           label=f"{name} {BY_NAME[metric].label} SLO {slo:g} ms")  # fmt: skip
    plots.log_scale(ax, "y")
    ax.set_ylabel("ms at the SLO percentile\n(missing: on a failure)")


def _bounds(
    ax: Any, steps: Sequence[Step], x: Sequence[float], name: str, metric: str, colour: str
) -> None:
    """Each step's one-sided confidence bounds on the percentile as a vertical bar (both
    closed only: an open or failed bound has no place on the axis)."""
    for xi, step in zip(x, steps, strict=True):
        figures = step.classes.get(name)
        low = getattr(figures, f"{metric}_low_ms", None) if figures else None
        high = getattr(figures, f"{metric}_high_ms", None) if figures else None
        if low is not None and high is not None and low > 0:
            ax.vlines(xi, low, high, color=colour, linewidth=3, alpha=0.35)


def _marks(
    found: Search, axis: LoadAxis, verdict: LimitVerdict | None
) -> list[tuple[float, dict[str, Any], str]]:
    """The vertical lines every panel draws, each with its legend label: the bracket, the
    ceiling (and whether it holds), invalid steps, the proposed limit and the allowed one."""
    marks: list[tuple[float, dict[str, Any], str]] = []
    if found.highest_pass is not None:
        marks.append((axis.value(found.highest_pass), {"color": "tab:green", "linewidth": 1.5},
                      f"highest pass {_at(axis, found.highest_pass)}"))  # fmt: skip
    if found.first_fail is not None:
        step = next(s for s in found.steps if s.load == found.first_fail)
        why = f" ({', '.join(step.reasons)})" if step.reasons else ""
        marks.append((axis.value(found.first_fail),
                      {"color": "tab:red", "linewidth": 1, "linestyle": ":"},
                      f"first fail {_at(axis, found.first_fail)}{why}"))  # fmt: skip
    if found.first_undecided is not None:
        marks.append((axis.value(found.first_undecided),
                      {"color": "tab:purple", "linewidth": 1, "linestyle": ":"},
                      f"first inconclusive {_at(axis, found.first_undecided)}"))  # fmt: skip
    if found.ceiling is not None:
        holds = "" if found.ceiling_holds else " (a steady pass above it: bounds nothing)"
        marks.append((axis.value(found.ceiling),
                      {"color": "tab:orange", "linewidth": 1, "linestyle": "--"},
                      f"capacity ceiling {_at(axis, found.ceiling)}{holds}"))  # fmt: skip
    marks += [(axis.value(s.load), {"color": "tab:grey", "linewidth": 1, "linestyle": "-."},
               f"invalid (generator) {_at(axis, s.load)}")
              for s in found.steps if s.status == INVALID]  # fmt: skip
    if verdict is not None:
        word = {PASS: "PASS", NOT_JUDGED: "NOT JUDGED"}.get(verdict.status, "FAIL")
        marks.append((axis.value(verdict.proposed),
                      {"color": "black", "linewidth": 1.5, "linestyle": "--"},
                      f"proposed limit {_at(axis, verdict.proposed)}: {word}"))  # fmt: skip
        if verdict.allowed is not None:
            allowed = f"allowed ≤ {_at(axis, verdict.allowed)} (highest pass less margin)"
            marks.append(
                (
                    axis.value(verdict.allowed),
                    {"color": "black", "linewidth": 1, "linestyle": ":"},
                    allowed,
                )
            )
    return marks


def _wrapped(label: str) -> str:
    """A legend label folded to fit beside the panels (LABEL_WIDTH characters a line)."""
    return "\n".join(textwrap.wrap(label, LABEL_WIDTH, subsequent_indent="  "))


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]
