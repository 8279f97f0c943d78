"""Agent trajectories whose context grows: what each hop of a `kind: agent` flow sends.

Part of the engine (plans → engine → records), a flow beside those in `flows`, built on
their turn steps; it sees the engine only through `flows.Sender`. A real agent's every
model call carries the whole trajectory so far: the system prompt, the task, and for every
earlier hop the model's real answer (an assistant message that calls a tool) and the
tool's result (a tool message of the hop's `tool_result_tokens`).
So prefill grows hop by hop, and a server's prefix cache decides the TTFT of later hops.
The adapters put the tool call and result in their API's own shape (OpenAI `tool_calls`
and `role: tool`, Anthropic `tool_use`/`tool_result`, the Responses API's
`function_call`/`function_call_output`) or flatten them for text-in APIs.

With a context cap (`context.max_tokens`) the oldest hops are dropped whole, or replaced
by one summary message of `summary_tokens` (`summarize`), until the context fits; the task
and system prompt are always kept. A fan-out hop sends its branches at once (each the
context so far plus its own sub-task line) and joins them: every branch's answer and
tool result enter the context of the hops after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio

from loadgen.adapters.protocol import Message
from loadgen.engine.exchange import Exchange
from loadgen.engine.flows import Budget, Sender, as_sent, next_turn, send, system_prompt
from loadgen.results.records import Outcome
from loadgen.workload.plans import Flow, RequestPlan

TOOL_RESULT_KEY = 2_000_000_011  # seeds tool-result text apart from the hops' own
SUMMARY_KEY = 3_000_000_019


def capped(
    head: Sequence[Message], steps: Sequence[Sequence[Message]], count: Callable[[str], int],
    max_tokens: int | None, summary: Message | None,
) -> tuple[list[Message], int]:  # fmt: skip
    """The context to send and how many of the oldest steps were left out.

    `head` (system prompt and task) is always kept; then the newest steps that fit within
    `max_tokens` with the head (and the summary, which stands in for the dropped steps
    when there is one). With no cap, everything.
    """
    flat = [m for step in steps for m in step]
    if max_tokens is None:
        return [*head, *flat], 0
    budget = max_tokens - sum(count(t) for _, t in head)
    sizes = [sum(count(t) for _, t in step) for step in steps]
    dropped = 0
    while dropped < len(steps):
        room = budget - (count(summary[1]) if summary is not None and dropped else 0)
        if sum(sizes[dropped:]) <= room:
            break
        dropped += 1
    kept = [m for step in steps[dropped:] for m in step]
    middle = [summary] if summary is not None and dropped else []
    return [*head, *middle, *kept], dropped


class Trajectory:
    """One growing trajectory: hops in sequence (a fan-out hop's branches at once)."""

    def __init__(self, engine: Sender, flow: Flow) -> None:
        self.engine, self.flow = engine, flow
        prompts = engine.prompts
        self.count = prompts.count
        self.head: list[Message] = []
        if flow.system_prompt_tokens:
            self.head.append(("system", system_prompt(prompts, flow)))
        first = flow.plans[0]
        self.head.append(("user", prompts.text(first.request_id, first.prompt_tokens,
                                               first=not self.head)))  # fmt: skip
        self.steps: list[list[Message]] = []
        self.summary: Message | None = None
        if flow.context_max_tokens is not None and flow.context_overflow == "summarize":
            text = prompts.text(SUMMARY_KEY + flow.session_id, flow.summary_tokens)
            self.summary = ("user", f"Summary of the earlier steps: {text}")
        self.budget = Budget.of(flow, engine.t0_ns)

    async def run(self) -> None:
        """Every hop in order; a failed hop or a spent budget skips the rest."""
        engine, flow = self.engine, self.flow
        hops = _by_hop(flow.plans)
        due = engine.t0_ns + flow.start_ns
        for index, group in enumerate(hops):
            if index:
                due += int(group[0].delay_s * 1e9)
            rest = [p for later in hops[index:] for p in later]
            if not await next_turn(engine, self.budget, due, rest, first=not index):
                return
            context, _ = capped(self.head, self.steps, self.count, flow.context_max_tokens,
                                self.summary)  # fmt: skip
            exchanges = await self._hop(group, context, due)
            failed = next((e for e in exchanges if e.outcome is not Outcome.OK), None)
            if failed is not None:
                later = [p for hop in hops[index + 1 :] for p in hop]
                engine.skip(later, f"hop {index} ended {failed.outcome}")
                return
            for plan, exchange in zip(group, exchanges, strict=True):
                tool = engine.prompts.text(TOOL_RESULT_KEY + plan.request_id,
                                           plan.tool_result_tokens)  # fmt: skip
                self.steps.append([("assistant", "".join(exchange.texts)), ("tool", tool)])
            due = max(e.end_ns or engine.now_ns() for e in exchanges)

    async def _hop(self, group: Sequence[RequestPlan], context: list[Message], due_ns: int
                   ) -> list[Exchange]:  # fmt: skip
        """One hop, or a fan-out's branches at once (joined: this returns when all end)."""
        engine = self.engine
        if len(group) == 1:
            sent = as_sent(engine, group[0], context, due_ns, self.budget)
            return [await send(engine, sent, context)]
        results: list[Exchange | None] = [None] * len(group)

        async def branch(slot: int, plan: RequestPlan) -> None:
            task = ("user", f"Sub-task {slot + 1} of {len(group)}: work on part {slot + 1}.")
            messages = [*context, task]
            sent = as_sent(engine, plan, messages, due_ns, self.budget)
            results[slot] = await send(engine, sent, messages)

        async with anyio.create_task_group() as tg:
            for slot, plan in enumerate(group):
                tg.start_soon(branch, slot, plan)
        return [r for r in results if r is not None]


def _by_hop(plans: Sequence[RequestPlan]) -> list[list[RequestPlan]]:
    """Plans grouped by hop (a fan-out hop holds its branches), in order."""
    hops: list[list[RequestPlan]] = []
    for plan in plans:
        if hops and hops[-1][0].turn == plan.turn:
            hops[-1].append(plan)
        else:
            hops.append([plan])
    return hops
