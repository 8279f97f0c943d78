"""One way to run the engine: a connector and an engine on one event loop, from one t0.

`loadgen run` (in each engine process), `loadgen calibrate`, the benchmarks and the test
suites all run the engine through `run_engine`, so what one measures the others reproduce:
the same loop (uvloop when installed), the same garbage-collector settings, the same
wiring. What differs is the session: when t0 is and what runs beside the engine (signals,
the progress line, the watchdog; a parent's commands; nothing at all).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

import anyio

from loadgen.engine.host import backend_options, quiet_gc
from loadgen.engine.runner import Engine, EngineConfig, LiveStats
from loadgen.engine.transport import Connector
from loadgen.results.records import RequestRecord
from loadgen.workload.plans import RequestPlan, Work

Session = Callable[[Engine], Awaitable[None]]  # runs the engine: picks t0, runs beside it
Companion = Callable[[], Coroutine[Any, Any, None]]  # a task beside the engine, cancelled after it


def run_engine(
    work: Work | Sequence[RequestPlan],
    connector: Connector,
    config: EngineConfig,
    on_record: Callable[[RequestRecord], None],
    session: Session,
    *,
    stats: LiveStats | None = None,
    quiet: bool = True,
    loop_options: Mapping[str, Any] | None = None,
) -> None:
    """Build the engine on `connector`, run `session(engine)` on a fresh event loop, and
    close the connector. `quiet` keeps full garbage collections out of the run
    (`host.quiet_gc`); `loop_options` replaces the backend's (uvloop when installed)."""

    async def main() -> None:
        engine = Engine(work, connector, config, on_record, stats)
        try:
            await session(engine)
        finally:
            connector.close()

    options = dict(backend_options() if loop_options is None else loop_options)
    with quiet_gc() if quiet else contextlib.nullcontext():
        anyio.run(main, backend="asyncio", backend_options=options)


async def run_beside(engine: Engine, t0_ns: int, *companions: Companion) -> None:
    """Run the engine from `t0_ns` with `companions` beside it; cancel them once it is done."""
    async with anyio.create_task_group() as tg:
        for companion in companions:
            tg.start_soon(companion)
        await engine.run(t0_ns)
        tg.cancel_scope.cancel()


def from_t0(t0_ns: int) -> Session:
    """The session that runs the engine from an absolute `t0_ns` with nothing beside it."""

    async def session(engine: Engine) -> None:
        await engine.run(t0_ns)

    return session
