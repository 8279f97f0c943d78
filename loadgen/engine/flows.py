"""Flows: sessions and fixed-context trajectories turn by turn, batches closed-loop.

Part of the engine (plans → engine → records), between the scheduler (`runner.Engine`,
which starts each flow at its start time) and the exchange. A flow sees the engine only
through `Sender`, the small public interface the engine implements: the clock, the
prompts, and starting, following and skipping requests. Growing agent trajectories are in
`agents`, built on the same turn steps (`Budget`, `next_turn`, `as_sent`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import anyio

from loadgen.adapters.protocol import Message
from loadgen.engine.exchange import Exchange
from loadgen.engine.starts import Starts
from loadgen.results.records import Outcome
from loadgen.workload.plans import Flow, RequestPlan
from loadgen.workload.prompts import PromptMaker
from loadgen.workload.spec import Deadlines

# A started exchange: its request's bytes, and whether they were written already.
Started = tuple[Exchange, bytes, bool]


class Sender(Protocol):
    """What a flow may ask of the engine (`runner.Engine` implements it).

    Times are absolute nanoseconds on the engine's clock; `t0_ns` is the run's start.
    """

    @property
    def t0_ns(self) -> int: ...
    @property
    def prompts(self) -> PromptMaker: ...
    @property
    def stopping(self) -> bool:
        """The run is stopping: no new request, turn or hop starts."""
        ...

    def now_ns(self) -> int: ...
    async def wait_until(self, due_ns: int) -> bool:
        """Sleep until `due_ns` (a think or tool time); False when the run is stopping."""
        ...

    def prepare(
        self, plan: RequestPlan, messages: Sequence[Message] | None = None, keep_text: bool = False
    ) -> tuple[Exchange, bytes]:
        """The exchange of `plan` and its request's bytes, made ahead of its send."""
        ...

    def start(self, exchange: Exchange, request: bytes, dispatched_ns: int) -> bool:
        """Start the exchange; True when its request was written at once (no await)."""
        ...

    async def follow(self, exchange: Exchange, request: bytes, sent: bool) -> Exchange:
        """Wait for a started exchange (sending it first unless `sent`), record it."""
        ...

    def skip(self, plans: Sequence[RequestPlan], reason: str) -> None:
        """Record each of `plans` as skipped, for `reason`."""
        ...


async def send(engine: Sender, plan: RequestPlan, messages: Sequence[Message]) -> Exchange:
    """Send one turn now, wait for it, record it; the exchange (its text kept) says how it went.

    It is dispatched now, before its request is encoded: the encoding is the client's time."""
    dispatched_ns = engine.now_ns()
    exchange, request = engine.prepare(plan, messages, True)
    sent = engine.start(exchange, request, dispatched_ns)
    return await engine.follow(exchange, request, sent)


# -- turns: sessions and trajectories ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Budget:
    """A trajectory's time budget (`budget_s`, from its start; None: no budget). What is
    left of it cuts each hop's total deadline; once it is spent, the hops left are skipped."""

    end_ns: int | None
    seconds: float

    @classmethod
    def of(cls, flow: Flow, t0_ns: int) -> Budget:
        if not flow.budget_s:
            return cls(None, 0.0)
        return cls(t0_ns + flow.start_ns + int(flow.budget_s * 1e9), flow.budget_s)

    def deadlines(self, deadlines: Deadlines, due_ns: int) -> Deadlines:
        """A hop's deadlines, its total cut to what is left of the budget at `due_ns`."""
        if self.end_ns is None:
            return deadlines
        left_s = max(0.001, (self.end_ns - due_ns) / 1e9)
        return replace(deadlines, total_s=min(deadlines.total_s, left_s))


async def next_turn(
    engine: Sender, budget: Budget, due_ns: int, rest: Sequence[RequestPlan], *, first: bool
) -> bool:
    """Wait for a later turn's due time, then check the budget; False when the flow ends
    here: the run is stopping (the rest are recorded as not_sent by `Engine.run`), or the
    budget is spent (`rest`, this turn's plans and those after, are skipped)."""
    if not first and not await engine.wait_until(due_ns):
        return False
    if budget.end_ns is not None and engine.now_ns() >= budget.end_ns:
        engine.skip(rest, f"trajectory budget of {budget.seconds:g} s spent")
        return False
    return True


def as_sent(
    engine: Sender, plan: RequestPlan, messages: Sequence[Message], due_ns: int, budget: Budget
) -> RequestPlan:
    """The plan as sent: its real intended time, the context it carries (tokens), and its
    deadlines cut to what is left of the trajectory's budget."""
    return replace(
        plan,
        intended_ns=due_ns - engine.t0_ns,
        prompt_tokens=sum(engine.prompts.count(text) for _, text in messages),
        deadlines=budget.deadlines(plan.deadlines, due_ns),
    )


def system_prompt(prompts: PromptMaker, flow: Flow) -> str:
    """One system prompt per class, the same for all its flows (prefix caching); it is
    their first message, so it starts with a cold run's nonce."""
    class_key = -1 - zlib.crc32(flow.class_name.encode())
    return prompts.text(class_key, flow.system_prompt_tokens, first=True)


def session_turn(prompts: PromptMaker, plan: RequestPlan, *, first: bool) -> Sequence[Message]:
    """A session turn's new messages (the session's first message has the nonce)."""
    if plan.messages:
        return prompts.lead_messages(plan.messages) if first else plan.messages
    return [("user", prompts.text(plan.request_id, plan.prompt_tokens, first=first))]


async def conversation(engine: Sender, flow: Flow) -> None:
    """A chat session or fixed-context trajectory: turns in strict sequence, each after the last.

    A turn's intended time is the previous turn's end plus its think (or tool) time. A
    failed turn, or a trajectory budget spent, ends the flow: the rest are `skipped`.
    A trajectory without `grow` sends its fixed context (set by hop 0) and the last answer.
    """
    prompts = engine.prompts
    history: list[Message] = []
    if flow.system_prompt_tokens:
        history.append(("system", system_prompt(prompts, flow)))
    budget = Budget.of(flow, engine.t0_ns)
    context, previous_output, due = "", "", engine.t0_ns + flow.start_ns
    for index, plan in enumerate(flow.plans):
        if index:
            due += int(plan.delay_s * 1e9)
        if not await next_turn(engine, budget, due, flow.plans[index:], first=not index):
            return
        if flow.kind == "trajectory":
            context = context or prompts.text(plan.request_id, plan.prompt_tokens, first=True)
            turn_text = f"{context}\n\n{previous_output}" if previous_output else context
            messages: list[Message] = [("user", turn_text)]
        else:
            history.extend(session_turn(prompts, plan, first=not history))
            messages = list(history)
        exchange = await send(engine, as_sent(engine, plan, messages, due, budget), messages)
        if exchange.outcome is not Outcome.OK:
            step = "hop" if flow.kind == "trajectory" else "turn"
            engine.skip(flow.plans[index + 1 :], f"{step} {index} ended {exchange.outcome}")
            return
        previous_output = "".join(exchange.texts)
        recorded = plan.recorded_answer if flow.history == "recorded" else None
        history.append(("assistant", previous_output if recorded is None else recorded))
        due = exchange.end_ns or engine.now_ns()


# -- batches -------------------------------------------------------------------------------
async def batch(engine: Sender, flow: Flow, wave: list[Started]) -> None:
    """Documents sent closed-loop: `concurrency` at a time, the next when one ends.

    The first wave was started by the scheduler at the flow's start (its intended time).
    Each later document is encoded while its predecessor streams and sent in the very
    callback that ends the predecessor's use of its connection (`Exchange.then`), on
    that connection; its intended time is that end's stamp, so sent − intended is the
    client's turnaround. When the callback cannot (the stream settled but its
    connection is still open), the worker sends it once the predecessor is recorded.
    """
    plans = list(flow.plans)
    if not wave:  # encoded late: the scheduler had no time to do it ahead
        now = engine.now_ns()
        made = [engine.prepare(p) for p in plans[: flow.concurrency]]
        wave = [(e, r, engine.start(e, r, now)) for e, r in made]
    pending = iter(plans[len(wave) :])

    async def worker(exchange: Exchange, request: bytes, sent: bool) -> None:
        while True:
            plan = None if engine.stopping else next(pending, None)
            box: list[Started] = []
            if plan is not None:  # made while this one streams
                following = engine.prepare(plan)
                exchange.then = partial(_turnaround, engine, following, box)
            await engine.follow(exchange, request, sent)
            if plan is None:
                return
            exchange.then = None
            if not box:
                if engine.stopping:
                    return  # not sent: run() records it as not_sent
                _turnaround(engine, following, box, exchange.end_ns or engine.now_ns())
            exchange, request, sent = box[0]

    async with anyio.create_task_group() as tg:
        workers = Starts(tg)
        for exchange, request, sent in wave:
            workers.start(worker, exchange, request, sent)
        await workers.wait()


def _turnaround(
    engine: Sender, following: tuple[Exchange, bytes], box: list[Started], t_ns: int
) -> None:
    """The closed loop's next send, due at `t_ns` (its predecessor's end): in the callback
    where that stream ended, or from the worker when the callback could not."""
    if engine.stopping:
        return
    exchange, request = following
    sent = engine.start(exchange, request, engine.now_ns())  # nothing before the write reads
    exchange.plan = replace(exchange.plan, intended_ns=t_ns - engine.t0_ns)  # the intended time
    box.append((exchange, request, sent))
