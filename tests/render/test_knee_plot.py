"""knee.png: one unit per axis, the proposed limit drawn, each class its own colour, every
vertical line named in a legend beside the panels (none over the data), a first fail with
its reasons."""

from __future__ import annotations

from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from loadgen.analysis.capacity import FAIL, PASS, ClassFigures, Search, Step, judge
from loadgen.render.capacity_axis import LoadAxis
from loadgen.render.knee_plot import knee_png

AXIS = LoadAxis(param="rate", scale=2.0, unit="req/s",
                title="offered load (req/s: chat; summarize closed-loop, outside it)")  # fmt: skip


def figures(ttft_ms: float, verdict: str) -> ClassFigures:
    """A class at one step with a TTFT and TPOT at its p90."""
    return ClassFigures(requests=200, required=100, percentile=90.0, attainment=0.99,
                        met=verdict == "met", ttft_ms=ttft_ms, tpot_ms=20.0, ttft_slo_ms=1000.0,
                        tpot_slo_ms=50.0, verdict=verdict)  # fmt: skip


def search() -> Search:
    """Passes at 2x and 4x, the first fail at 8x (over-saturated)."""
    steps = (
        Step(load=2.0, status=PASS, classes={"chat": figures(100, "met"),
                                             "bulk": figures(150, "met")}),
        Step(load=4.0, status=PASS, classes={"chat": figures(300, "met"),
                                             "bulk": figures(400, "met")}),
        Step(load=8.0, status=FAIL, reasons=("over-saturated", "TTFT rising"),
             classes={"chat": figures(3000, "missed"), "bulk": figures(4000, "missed")}),
    )  # fmt: skip
    return Search(steps=steps, highest_pass=4.0, first_fail=8.0)


def test_the_knee_plot_labels_every_line_beside_the_panels(drawn: list[Figure]) -> None:
    """The x axis and title say req/s; the proposed limit (12 req/s: 6x, FAIL) and the
    allowed one are drawn at their req/s; the first fail names its reasons; chat and bulk
    have a colour each; every legend sits right of its panel and no text is on the axes."""
    found = search()
    assert knee_png(found, AXIS, judge(found, 6.0))[:4] == b"\x89PNG"
    (fig,) = drawn
    top, *_, bottom = fig.axes
    assert bottom.get_xlabel() == AXIS.title
    title = fig._suptitle.get_text()  # matplotlib keeps the suptitle here
    assert "offered load (req/s)" in title
    assert "highest passing load 8 req/s" in title
    assert "proposed limit 12 req/s: FAIL" in title
    labels = {line.get_label(): line for line in top.get_lines()}
    assert labels["proposed limit 12 req/s: FAIL"].get_xdata()[0] == 12.0
    assert labels["allowed ≤ 7.2 req/s (highest pass less margin)"].get_xdata()[0] == 7.2
    assert "first fail 16 req/s (over-saturated, TTFT\n  rising)" in labels
    colours = {name: to_hex(labels[f"{name} attainment"].get_color()) for name in ("chat", "bulk")}
    assert colours["chat"] != colours["bulk"]
    latency = {line.get_label(): to_hex(line.get_color()) for line in bottom.get_lines()}
    assert latency["chat TTFT p90"] == latency["chat TPOT p90"] == colours["chat"]
    assert latency["bulk TTFT p90"] == colours["bulk"]
    ticks = [t.get_text() for t in bottom.get_yticklabels() if t.get_text()]
    assert ticks
    assert all("$" not in t for t in ticks), ticks  # plain numbers (no mathtext is drawn)
    for ax in fig.axes:
        assert not ax.texts  # no label over the curves
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1
