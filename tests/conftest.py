"""Fixtures the suites share: the engine against scripted responses, the figures a plot drew.

Builders of records, run folders and workload files live in `loadgen.testing.builders`,
plain functions that module-scoped fixtures and benchmarks can call too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from matplotlib.figure import Figure

from loadgen.render import plots
from loadgen.results.records import RequestRecord
from loadgen.testing import ReceivedRequest, ScriptedServer, Step, run_engine
from loadgen.testing.virtual import run_scripted
from loadgen.workload.plans import RequestPlan

Handler = Callable[[ReceivedRequest], Iterable[Step]]


@dataclass(frozen=True)
class EngineRun:
    """Runs plans through the real engine against a handler's scripts: over loopback in
    real time (a `ScriptedServer`), or in virtual time (`run_scripted`: no socket, and
    `exact` is true: every interval is the one the script set, to the nanosecond).

    Calling it returns the records by request id and what the server saw (`requests`,
    `connections`)."""

    exact: bool

    def __call__(
        self, plans: Sequence[RequestPlan], handler: Handler, **engine: Any
    ) -> tuple[list[RequestRecord], Any]:
        if self.exact:
            return run_scripted(plans, handler, **engine)
        with ScriptedServer(handler) as server:
            return run_engine(plans, server.url, **engine), server


@pytest.fixture(params=["loopback", "virtual"])
def engine_run(request: pytest.FixtureRequest) -> EngineRun:
    """The engine against scripts, once over loopback and once in virtual time."""
    return EngineRun(exact=request.param == "virtual")


def arrivals_end_marks(fig: Figure) -> list[tuple[list[float], list[str]]]:
    """Per panel (twin axes merged into their host), the x of every dotted vertical line
    and the texts annotated on it."""
    panels: dict[tuple[float, ...], tuple[list[float], list[str]]] = {}
    for ax in fig.axes:
        xs, texts = panels.setdefault(tuple(ax.get_position().bounds), ([], []))
        for line in ax.get_lines():
            x = line.get_xdata()
            if line.get_linestyle() == ":" and len(x) == 2 and x[0] == x[1]:
                xs.append(float(x[0]))
        texts.extend(t.get_text() for t in ax.texts)
    return list(panels.values())


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the plot functions draw, caught before they are closed."""
    figures: list[Figure] = []
    keep = plots.figure_png

    def catch(fig: Figure) -> bytes:
        figures.append(fig)
        return keep(fig)

    monkeypatch.setattr(plots, "figure_png", catch)
    return figures
