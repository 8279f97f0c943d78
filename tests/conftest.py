"""Fixtures the suites share: the engine against scripted responses, the figures a plot drew,
the network path's real parts (nginx, tinyproxy, a test CA, a simulator upstream) for tests/netpath/.

Builders of records, run folders and workload files live in `loadgen.testing.builders`,
plain functions that module-scoped fixtures and benchmarks can call too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from loadgen.render import plots
from loadgen.results.records import RequestRecord
from loadgen.testing import ReceivedRequest, ScriptedServer, Step, netpath, run_engine
from loadgen.testing.busy import busy_loops
from loadgen.testing.virtual import run_scripted
from loadgen.workload.plans import RequestPlan

Handler = Callable[[ReceivedRequest], Iterable[Step]]
STREAMS = Path(__file__).resolve().parent / "fixtures" / "streams"


@dataclass(frozen=True)
class Capture:
    """A captured stream (tests/fixtures/streams/) and its known answer: a row of its
    README's table "Known answers" (None where the stream sent no such figure)."""

    file: str
    api: str
    output_events: int
    output_tokens: int | None
    prompt_tokens: int | None
    finish: str | None
    error: bool


def captures() -> list[Capture]:
    """Every row of tests/fixtures/streams/README.md's known answers."""
    text = (STREAMS / "README.md").read_text(encoding="utf-8").split("## Known answers", 1)[1]
    rows = [line for line in text.splitlines() if line.startswith("| `")]

    def figure(cell: str) -> int | None:
        return None if cell == "—" else int(cell)

    found = []
    for row in rows:
        cells = [c.strip().strip("`") for c in row.strip("|").split("|")]
        file, api, events, output, prompt, finish, error = cells
        found.append(Capture(file=file, api=api, output_events=int(events),
                             output_tokens=figure(output), prompt_tokens=figure(prompt),
                             finish=None if finish == "—" else finish, error=error == "yes"))  # fmt: skip
    return found


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


# -- the network path's real parts (tests/netpath/): nginx, tinyproxy, a CA, an upstream --
SETUP = "scripts/realserver/setup.sh netpath"


def _need(binary: str) -> str:
    path = netpath.find(binary)
    if path is not None:
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{binary} is not installed; CI is set, so it must be ({SETUP})", pytrace=False)
    pytest.skip(f"{binary} is not installed (run {SETUP}, or deselect with -m 'not realserver')")


@pytest.fixture
def need_nginx() -> str:
    """nginx's path; the test skips (fails under CI) without it."""
    return _need("nginx")


@pytest.fixture
def need_tinyproxy() -> str:
    """tinyproxy's path; the test skips (fails under CI) without it."""
    return _need("tinyproxy")


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One simulator (ten times real time) for the module's tests: its base URL."""
    with netpath.simulator(tmp_path_factory.mktemp("sim")) as sim:
        yield sim.url


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> netpath.TestCA:
    """A certificate authority of the module's own (trustme)."""
    return netpath.TestCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def busy_machine() -> Iterator[list[int]]:
    """Two busy loops beside the test for its whole length (`loadgen.testing.busy`): a box
    loaded like a shared CI runner. Yields their pids."""
    with busy_loops(2) as pids:
        yield pids
