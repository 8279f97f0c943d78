"""The knee plot of a capacity search (`knee.png`): the steps' verdicts and figures vs load.

Drawn from a finished `loadgen.analysis.capacity.Search` alone, with the house colours and
`plots.figure_png`; the search itself never imports matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib import ticker
from matplotlib.figure import Figure  # no pyplot: nothing global to clean up

from loadgen.analysis.capacity import FAIL, INVALID, PASS, UNDECIDED, Search, Step
from loadgen.render.plots import METRIC_COLOURS, figure_png


def knee_png(found: Search, *, x_scale: float = 1.0, x_label: str = "load") -> bytes:
    """Attainment, completed vs offered requests, goodput vs raw throughput, and the
    SLO-percentile latencies vs load.

    Four panels on one load axis (x = load × `x_scale`); SLO targets dashed; each step's
    percentile with its confidence bounds as a bar; the highest passing load a green line,
    the first failing one red, the first still inconclusive one magenta, the capacity
    ceiling (from an over-saturated step) orange; invalid steps drawn as grey lines and
    left out of the curves (their numbers are the generator's).
    """

    steps = sorted((s for s in found.steps if s.status in (PASS, FAIL, UNDECIDED)),
                   key=lambda s: s.load)  # fmt: skip
    fig = Figure(figsize=(8.0, 10.5))
    top, rates, middle, bottom = fig.subplots(4, 1, sharex=True)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.06, top=0.94, hspace=0.12)
    x = [s.load * x_scale for s in steps]
    _attainment_panel(top, steps, x)
    _rates_panel(rates, steps, x)
    middle.plot(x, [s.goodput_tok_per_s for s in steps], "o-", color="tab:green",
                label="goodput (tokens of requests within SLO)")  # fmt: skip
    middle.plot(x, [s.throughput_tok_per_s for s in steps], "s--", color="tab:grey",
                label="raw throughput (all tokens)")  # fmt: skip
    middle.set_ylabel("output tokens/s")
    middle.set_ylim(bottom=0)
    _latency_panel(bottom, steps, x, METRIC_COLOURS)
    for ax in (top, rates, middle, bottom):
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
    return figure_png(fig)


def _rates_panel(ax: Any, steps: Sequence[Step], x: Sequence[float]) -> None:
    """Offered and completed requests/s of the judged parts: they part at saturation."""
    offered = [s.steady.offered_per_s if s.steady else None for s in steps]
    done = [s.steady.completed_per_s if s.steady else None for s in steps]
    ax.plot(x, _nan(offered), "s--", color="tab:grey", label="offered req/s")
    ax.plot(x, _nan(done), "o-", color="tab:blue", label="completed req/s (any outcome)")
    saturated = [(xi, d) for xi, s, d in zip(x, steps, done, strict=True) if s.over_saturated]
    if saturated:
        ax.plot(*zip(*saturated, strict=True), "o", color="tab:red", label="over-saturated")
    ax.set_ylabel("requests/s (judged part)")
    ax.set_ylim(bottom=0)


def _attainment_panel(ax: Any, steps: Sequence[Step], x: Sequence[float]) -> None:
    names = sorted({n for s in steps for n in s.classes})
    for name in names:
        y = [_pct(s.classes[name].attainment) if name in s.classes else None for s in steps]
        ax.plot(x, _nan(y), "o-", label=f"{name} attainment")
    for p in sorted({s.classes[n].percentile for s in steps for n in s.classes}):
        ax.axhline(p, color="grey", linestyle=":", linewidth=1, label=f"p{p:g} share")
    colours = {PASS: "tab:green", FAIL: "tab:red", UNDECIDED: "tab:purple"}
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
            _bounds(ax, steps, x, name, metric, colours[metric])
            if slo is not None:
                ax.axhline(slo, color=colours[metric], linestyle="--", linewidth=1,
                           label=f"{name} {metric.upper()} SLO {slo:g} ms")  # fmt: skip
    ax.set_yscale("log")
    ax.set_ylabel("latency at the SLO percentile (ms, nearest rank)\n(missing: falls on a failure)")


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
    if found.first_undecided is not None:
        ax.axvline(found.first_undecided * x_scale, color="tab:purple", linewidth=1,
                   linestyle=":", label=label(
                       f"first inconclusive {found.first_undecided * x_scale:.3g}"))  # fmt: skip
    if found.ceiling is not None:
        ax.axvline(found.ceiling * x_scale, color="tab:orange", linewidth=1, linestyle="--",
                   label=label(f"capacity ceiling {found.ceiling * x_scale:.3g}"))  # fmt: skip
    for step in found.steps:
        if step.status == INVALID:
            ax.axvline(step.load * x_scale, color="tab:grey", linewidth=1, linestyle="-.",
                       label=label(f"invalid (generator) {step.load * x_scale:.3g}"))  # fmt: skip


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]
