"""Fixtures the suites share: the engine against scripted responses.

Builders of records, run folders and workload files live in `loadgen.testing.builders`,
plain functions that module-scoped fixtures and benchmarks can call too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

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
