"""Plots return valid PNGs for ordinary and degenerate inputs, and leave no figure open."""

from __future__ import annotations

import io
from collections.abc import Callable

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import arrivals_end_marks
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from loadgen.render import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RNG = np.random.default_rng(0)
WIDE = RNG.lognormal(3.0, 1.5, 2000)  # spans > 2 decades: log axis
NARROW = RNG.normal(50.0, 5.0, 200)


def timeline(failed: list[int], p99: list[float | None]) -> bytes:
    n = len(failed)
    return plots.timeline_png(
        window_mid_s=np.arange(n) * 10.0 + 5.0,
        step_s=10.0,
        p99_ms={"ttft": p99, "tpot": [None if v is None else v / 10 for v in p99], "itl": p99},
        targets_ms={"ttft": 300.0, "tpot": 30.0, "itl": None},
        arrival_rate_per_s=[4.0] * n,
        failed=failed,
        title="chat",
    )


CASES: dict[str, Callable[[], bytes]] = {
    "cdf wide with failures": lambda: plots.cdf_png(
        WIDE, failures=40, title="t", metric="TTFT", target_ms=300.0, percentile=99.0
    ),
    "cdf narrow no target": lambda: plots.cdf_png(
        NARROW, failures=0, title="t", metric="TPOT", target_ms=None, percentile=90.0
    ),
    "cdf only failures": lambda: plots.cdf_png(
        [], failures=3, title="t", metric="TTFT", target_ms=100.0, percentile=99.0
    ),
    "cdf empty": lambda: plots.cdf_png(
        [], failures=0, title="t", metric="TTFT", target_ms=None, percentile=99.0
    ),
    "cdf one value": lambda: plots.cdf_png(
        [5.0], failures=0, title="t", metric="TTFT", target_ms=None, percentile=99.0
    ),
    "itl wide": lambda: plots.itl_histogram_png(WIDE, title="t", target_ms=100.0),
    "itl constant": lambda: plots.itl_histogram_png([20.0] * 50, title="t", target_ms=None),
    "itl empty": lambda: plots.itl_histogram_png([], title="t", target_ms=None),
    "tokens per chunk": lambda: plots.tokens_per_chunk_png({1: 900, 2: 40, 4: 3}, title="t"),
    "tokens per chunk empty": lambda: plots.tokens_per_chunk_png({}, title="t"),
    "timeline": lambda: timeline([0, 2, 0, 5], [120.0, 450.0, None, 2000.0]),
    "timeline one window no values": lambda: timeline([0], [None]),
    "timeline partial and rateless windows": lambda: plots.timeline_png(
        window_mid_s=[5.0, 15.0, 25.0, 35.0],
        step_s=10.0,
        p99_ms={"ttft": [100.0] * 4},
        targets_ms={"ttft": 300.0},
        arrival_rate_per_s=[4.0, 4.0, 4.0, None],
        failed=[0] * 4,
        title="chat",
        partial=[False, False, True, False],
        schedule_end_s=25.0,
    ),
    "timeline no rate at all": lambda: plots.timeline_png(
        window_mid_s=[5.0],
        step_s=10.0,
        p99_ms={"ttft": [None]},
        targets_ms={},
        arrival_rate_per_s=[None],
        failed=[0],
        title="chat",
        partial=[False],
        schedule_end_s=0.0,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_plot_is_a_png_and_closes_its_figure(name: str) -> None:
    """Each figure function returns a decodable PNG of the documented size and closes it."""
    png = CASES[name]()
    assert png.startswith(PNG_MAGIC)
    image = matplotlib.image.imread(io.BytesIO(png), format="png")
    height, width = image.shape[:2]
    assert width == 800
    assert height == HEIGHTS.get(name, 450)
    assert plt.get_fignums() == []


@pytest.mark.parametrize("name", list(CASES))
def test_every_tick_reads_in_plain_numbers(name: str, drawn: list[Figure]) -> None:
    """No axis shows mathtext as written (`$\\mathdefault{10^{2}}$`): text is drawn as
    written, so a log axis takes plain-number ticks (`plots.log_scale`)."""
    CASES[name]()
    ticks = [t.get_text() for fig in drawn for ax in fig.axes
             for t in (*ax.get_xticklabels(), *ax.get_yticklabels())]  # fmt: skip
    assert all("$" not in t for t in ticks), ticks


# a timeline is 190 px per metric panel plus 190 px for failures, title and axis label
HEIGHTS = {"timeline": 760, "timeline one window no values": 760,
           "timeline partial and rateless windows": 380, "timeline no rate at all": 380}  # fmt: skip


def _dashed_levels(ax: Axes) -> list[float]:
    return [float(line.get_ydata()[0]) for line in ax.get_lines() if line.get_linestyle() == "--"]


def test_each_timeline_metric_has_its_own_panel_and_only_its_own_slo(drawn: list[Figure]) -> None:
    """TTFT, TPOT and ITL p99 are drawn in panels of their own: the TPOT SLO line sits with
    the TPOT series, and the ITL panel (no ITL SLO) carries no SLO line but a note saying
    the TPOT SLO does not judge it, so an ITL p99 of 52 ms never reads as a TPOT breach."""
    plots.timeline_png(
        window_mid_s=[5.0, 15.0],
        step_s=10.0,
        p99_ms={"ttft": [300.0, 320.0], "tpot": [24.0, 25.0], "itl": [52.0, 70.0]},
        targets_ms={"ttft": 1000.0, "tpot": 50.0, "itl": None},
        arrival_rate_per_s=[1.7, 1.7],
        failed=[0, 0],
        title="chat",
    )
    (fig,) = drawn
    hosts = [ax for ax in fig.axes if ax.get_ylabel().endswith("p99 (ms)")]
    assert [ax.get_ylabel() for ax in hosts] == ["TTFT p99 (ms)", "TPOT p99 (ms)", "ITL p99 (ms)"]
    ttft, tpot, itl = hosts
    assert _dashed_levels(ttft) == [1000.0]
    assert _dashed_levels(tpot) == [50.0]
    assert _dashed_levels(itl) == []
    assert [line.get_ydata().tolist() for line in itl.get_lines()] == [[52.0, 70.0]]
    assert any("TPOT SLO judges request averages" in t.get_text() for t in itl.texts)
    assert not any("TPOT" in t.get_text() for t in ttft.texts)


def test_an_itl_slo_is_drawn_on_the_itl_panel(drawn: list[Figure]) -> None:
    """With an ITL target the ITL panel gets its own dashed line and no "no ITL SLO" note."""
    plots.timeline_png(
        window_mid_s=[5.0], step_s=10.0, p99_ms={"tpot": [24.0], "itl": [52.0]},
        targets_ms={"tpot": 50.0, "itl": 80.0}, arrival_rate_per_s=[1.0], failed=[0],
        title="chat",
    )  # fmt: skip
    (fig,) = drawn
    tpot, itl = (ax for ax in fig.axes if ax.get_ylabel().endswith("p99 (ms)"))
    assert (_dashed_levels(tpot), _dashed_levels(itl)) == ([50.0], [80.0])
    assert not any("no ITL SLO" in t.get_text() for t in itl.texts)


def test_the_backend_is_agg() -> None:
    """Plots never need a display."""
    assert plt.get_backend().lower() == "agg"


def test_hop_boxplot_and_batch_progress_are_pngs_even_when_empty() -> None:
    """Agent per-hop boxplots and summarization batch progress render, with data or without."""
    from loadgen.render.plots import batch_progress_png, hop_boxplot_png

    for png in (
        hop_boxplot_png({0: [100.0, 120.0, 300.0], 1: [90.0, 110.0]}, title="t", budget_s=2),
        hop_boxplot_png({}, title="t"),
        batch_progress_png([1.0, 2.5, 4.0], documents=4, title="b", deadline_s=10),
        batch_progress_png([], documents=3, title="b"),
    ):
        assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_fit_x_keeps_the_data_readable_and_says_when_the_slo_is_off_scale() -> None:
    """15 ms values and a 20 s target: the axis fits the values and the target is off-scale;
    a target near the values (linear: within 3x their span; log: a decade) is on the axis."""
    values = np.asarray([14.0, 15.0, 16.0])
    _, right, shown = plots.fit_x(values, 20_000.0, log=False)
    assert not shown
    assert right < 20
    assert plots.fit_x(values, 17.0, log=False)[2]
    assert plots.fit_x(values, 17.0, log=False)[1] >= 17
    assert plots.fit_x(np.asarray([20.0, 2490.0]), 20_000.0, log=True)[2]
    assert not plots.fit_x(np.asarray([20.0, 200.0]), 20_000.0, log=True)[2]


def test_an_off_scale_slo_is_noted_and_a_near_one_drawn() -> None:
    """On the axes: off-scale, no SLO line and a note naming it; near, a line at the target."""
    fig, ax = plt.subplots()
    note = plots._slo_line(ax, np.asarray([14.0, 15.0, 16.0]), 20_000.0)
    assert ax.get_xlim()[1] < 20
    assert not ax.get_lines()
    assert note is not None
    assert note.startswith("SLO 20.0 s off-scale (right)")
    assert plots._slo_line(ax, np.asarray([14.0, 15.0, 16.0]), 17.0) is None
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [17.0]
    plt.close(fig)


def test_the_cdf_notes_stand_above_the_plot_never_over_the_curve_or_the_bounds() -> None:
    """An off-scale SLO, failures and a p99 on a failure: each note lies above the plot area
    and below the title, none over another (inside the axes, one lay over the curve)."""
    values = np.linspace(20.0, 120.0, 97)
    fig = plots.cdf_figure(
        values,
        failures=3,
        title="chat: TTFT",
        metric="TTFT",
        target_ms=20_000.0,
        percentile=99.0,
        bounds=plots.Bounds(low_ms=110.0, high_ms=None, confidence=0.95),
    )
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    ax = fig.axes[0]
    plot = ax.get_window_extent(renderer)
    title = ax.title.get_window_extent(renderer)
    notes = [t for t in ax.texts if t.get_text() and t is not ax.title]
    assert sorted(t.get_text().split(" ")[0] for t in notes) == ["3", "SLO", "p99"]
    boxes = [t.get_window_extent(renderer) for t in notes]
    for box in boxes:
        assert box.y0 >= plot.y1
        assert box.y1 <= title.y0
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    plt.close(fig)


def server_timeline(schedule_end_s: float | None) -> bytes:
    return plots.server_timeline_png(
        client={"chat": ([2.5, 7.5, 12.5], [100.0, 120.0, None], [4.0, 4.0, None])},
        server_t_s=[0.0, 5.0, 10.0, 15.0],
        server={"queue_depth": [0, 3, 1, 0], "running": [2, 8, 4, 0], "kv_usage": [0.1] * 4},
        title="t",
        schedule_end_s=schedule_end_s,
    )


def test_both_timelines_mark_where_arrivals_ended_in_every_panel(drawn: list[Figure]) -> None:
    """The client and the server timeline draw the "arrivals end" line at the schedule's
    end across each of their panels, labelled once; without an end, neither draws one."""
    CASES["timeline partial and rateless windows"]()  # schedule_end_s=25.0
    server_timeline(12.0)
    client, server = (arrivals_end_marks(fig) for fig in drawn)
    assert [xs for xs, _ in client] == [[25.0], [25.0]]
    assert [xs for xs, _ in server] == [[12.0], [12.0], [12.0]]
    for marks in (client, server):
        assert [texts.count("arrivals end") for _, texts in marks] == [1] + [0] * (len(marks) - 1)
    drawn.clear()
    timeline([0, 1], [100.0, 200.0])
    server_timeline(None)
    for fig in drawn:
        assert all(
            xs == [] and "arrivals end" not in texts for xs, texts in arrivals_end_marks(fig)
        )


@pytest.mark.parametrize(
    ("bounds", "span", "arrows"),
    [
        (plots.Bounds(low_ms=45.0, high_ms=55.0, confidence=0.95), (45.0, 55.0), []),
        (plots.Bounds(low_ms=48.0, high_ms=None, confidence=0.95), (48.0, NARROW.max()), [">"]),
        (
            plots.Bounds(low_ms=None, high_ms=float("inf"), confidence=0.9),
            (NARROW.min(), NARROW.max()),
            ["<", ">"],
        ),
    ],
)
def test_a_checks_bounds_are_a_bar_on_the_percentile_line(
    drawn: list[Figure], bounds: plots.Bounds, span: tuple[float, float], arrows: list[str]
) -> None:
    """The CDF draws a check's bounds on its percentile's line, low to high; a side the
    sample does not bound (open, or on a failure) runs to the data's edge with an arrow."""
    plots.cdf_png(NARROW, failures=0, title="t", metric="TPOT", target_ms=60.0,
                  percentile=90.0, bounds=bounds)  # fmt: skip
    (fig,) = drawn
    (ax,) = fig.axes
    bars = [line for line in ax.get_lines() if line.get_label().endswith("bounds each side")]
    assert len(bars) == 1
    assert bars[0].get_xdata().tolist() == pytest.approx(list(span))
    assert bars[0].get_ydata().tolist() == [0.9, 0.9]
    assert bars[0].get_label() == f"{bounds.confidence:.0%} bounds each side"
    markers = [line.get_marker() for line in ax.get_lines() if line.get_color() == "tab:purple"]
    assert sorted(m for m in markers if m in ("<", ">")) == sorted(arrows)
