"""One request's exchange on its own: settling once, the retry reset, cancelling in flight."""

from __future__ import annotations

import asyncio

from loadgen.adapters import adapter_for
from loadgen.engine.exchange import Exchange
from loadgen.results.records import Outcome
from loadgen.testing import PlanFactory

T0_NS = 1_000_000_000


def exchange() -> Exchange:
    """An exchange of one plan due at t0, on the OpenAI chat adapter."""
    return Exchange(PlanFactory().at(0)[0], adapter_for("openai-chat"), T0_NS)


def test_a_cancelled_exchange_stays_cancelled() -> None:
    """Cancelled in flight, the outcome is settled there: a deadline firing later changes nothing."""

    async def scenario() -> tuple[Outcome | None, Outcome, int | None, bool]:
        ex = exchange()
        ex.then = lambda t_ns: None
        ex.cancel(T0_NS + 5_000)
        ex.timeout(Outcome.TIMEOUT_TOTAL, "not finished in 1 s")  # a timer that was not cancelled
        record = ex.record(T0_NS)
        return ex.outcome, record.outcome, record.end_ns, ex.then is None

    outcome, recorded, end_ns, no_follower = asyncio.run(scenario())
    assert outcome is Outcome.CANCELLED
    assert recorded is Outcome.CANCELLED
    assert end_ns == 5_000
    assert no_follower


def test_the_retry_reset_unsettles_a_request_lost_unanswered_once() -> None:
    """Lost before any response on a kept-alive connection: reset once, then a second loss stands."""

    async def scenario() -> list[tuple[Outcome | None, bool, bool, int]]:
        ex = exchange()
        ex.reused_connection = True
        seen = []
        ex.on_lost("connection reset", False, T0_NS + 1_000)
        seen.append((ex.outcome, ex.will_retry(), ex.done.done(), ex.retries))
        ex.reset_for_retry()
        seen.append((ex.outcome, ex.will_retry(), ex.done.done(), ex.retries))
        ex.on_lost("connection reset", False, T0_NS + 2_000)
        seen.append((ex.outcome, ex.will_retry(), ex.done.done(), ex.retries))
        return seen

    first, reset, second = asyncio.run(scenario())
    assert first == (Outcome.CONNECT_ERROR, True, True, 0)
    assert reset == (None, False, False, 1)
    assert second == (Outcome.CONNECT_ERROR, False, True, 1)
