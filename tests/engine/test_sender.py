"""The flows against a fake `flows.Sender`: no engine, no sockets, a clock the test moves.

Every turn takes exactly `TURN_NS` and answers "answer <request id>", so intended times,
messages and budget cuts are known answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import Message
from loadgen.engine.agents import Trajectory
from loadgen.engine.exchange import Exchange
from loadgen.engine.flows import Sender, conversation
from loadgen.results.records import Outcome
from loadgen.testing import PlanFactory
from loadgen.workload.plans import Flow, RequestPlan
from loadgen.workload.prompts import PromptMaker

NS = 1_000_000_000
TURN_NS = NS  # every request takes 1 s


@dataclass
class FakeSender:
    """A `Sender` whose requests end `TURN_NS` after they start, all ok."""

    t0_ns: int = 0
    prompts: PromptMaker = field(default_factory=lambda: PromptMaker(0))
    stopping: bool = False
    t_ns: int = 0
    sent: list[tuple[RequestPlan, list[Message]]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def now_ns(self) -> int:
        return self.t_ns

    async def wait_until(self, due_ns: int) -> bool:
        self.t_ns = max(self.t_ns, due_ns)
        return not self.stopping

    def prepare(
        self, plan: RequestPlan, messages: Sequence[Message] | None = None, keep_text: bool = False
    ) -> tuple[Exchange, bytes]:
        self.sent.append((plan, list(messages or [])))
        return Exchange(plan, adapter_for("openai-chat"), self.t0_ns, keep_text=keep_text), b""

    def start(self, exchange: Exchange, request: bytes, dispatched_ns: int) -> bool:
        return True

    async def follow(self, exchange: Exchange, request: bytes, sent: bool) -> Exchange:
        self.t_ns += TURN_NS
        exchange.texts.append(f"answer {exchange.plan.request_id}")
        exchange.finish(self.t_ns, Outcome.OK)
        return exchange

    def skip(self, plans: Sequence[RequestPlan], reason: str) -> None:
        self.skipped.extend((p.request_id, reason) for p in plans)


def flow_of(
    kind: str, turns: int, delay_s: float, budget_s: float | None = None, grow: bool = True
) -> Flow:
    """`turns` plans of one flow starting at t0, each after `delay_s` of think time."""
    plans = tuple(
        replace(p, session_id=0, turn=i, delay_s=delay_s)
        for i, p in enumerate(PlanFactory().at(*[0.0] * turns))
    )
    return Flow(kind=kind, class_name="chat", session_id=0, start_ns=0, plans=plans,
                budget_s=budget_s, grow=grow)  # fmt: skip


def test_the_fake_is_a_sender() -> None:
    """The fake implements the interface the flows are typed against (mypy checks it too)."""
    sender: Sender = FakeSender()
    assert sender.now_ns() == 0


def test_a_session_sends_each_turn_after_the_last_with_the_history() -> None:
    """Turn i is due at the end of turn i−1 plus its think time and carries every answer so far."""
    fake = FakeSender()
    asyncio.run(conversation(fake, flow_of("session", 3, delay_s=0.5)))
    assert [p.intended_ns for p, _ in fake.sent] == [0, int(1.5 * NS), 3 * NS]
    last_messages = fake.sent[-1][1]
    assert [role for role, _ in last_messages] == ["user", "assistant", "user", "assistant", "user"]
    assert [text for role, text in last_messages if role == "assistant"] == ["answer 0", "answer 1"]
    assert fake.skipped == []


def test_a_trajectory_budget_cuts_deadlines_then_skips_the_hops_left() -> None:
    """Budget 2.2 s, hops of 1 s after 0.5 s: hop 1 may take 0.7 s; hop 2 is due past the budget."""
    fake = FakeSender()
    flow = flow_of("trajectory", 4, delay_s=0.5, budget_s=2.2, grow=False)
    asyncio.run(conversation(fake, flow))
    assert [p.request_id for p, _ in fake.sent] == [0, 1]
    assert fake.sent[1][0].deadlines.total_s == pytest.approx(0.7, abs=1e-9)
    assert fake.skipped == [(2, "trajectory budget of 2.2 s spent"),
                            (3, "trajectory budget of 2.2 s spent")]  # fmt: skip


def test_a_growing_trajectory_shares_the_same_budget() -> None:
    """The growing trajectory (agents) stops at the same hop, for the same reason, as the fixed one."""
    fake = FakeSender()
    flow = flow_of("trajectory", 4, delay_s=0.5, budget_s=2.2)
    asyncio.run(Trajectory(fake, flow).run())
    assert [p.request_id for p, _ in fake.sent] == [0, 1]
    assert [reason for _, reason in fake.skipped] == ["trajectory budget of 2.2 s spent"] * 2
