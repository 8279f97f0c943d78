"""Request plans: what to send and when, built from the spec and the schedule alone.

Third stage (arrivals → plans → engine). A plan carries the intended send time, the class,
the target prompt and output token counts and the class's deadlines. Everything is sampled
from per-class seeded streams, so plans are a pure function of spec and seed. The prompt
text itself is made just before sending (`prompts.prompt_text`), to keep a million plans
small in memory.

Requests that depend on each other form a `Flow`: a chat session (turns, each carrying the
conversation so far, a think time apart), an agent trajectory (hops in strict sequence, each
prompt built from the previous hop's real output, a tool time apart), or a closed-loop batch
(documents sent at a fixed concurrency). A flow's first request is planned at the flow's
arrival; a later one's `intended_ns` is only the earliest it could go (previous planned
send + its delay): the engine sets the real one when the previous request ends, so a slow
answer delays the next turn exactly as it would delay a user.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.errors import ConfigError
from loadgen.units import MIB, NS_PER_S
from loadgen.workload.agent_traces import TraceTrajectory, load_agent_trace
from loadgen.workload.arrivals import Arrival, class_rng, class_times_s, trace_requests
from loadgen.workload.datasets import Conversation, counter_for, load_dataset, sample_rows
from loadgen.workload.inputs import size_text
from loadgen.workload.model import (
    MAX_SPAN_S,
    SPAN_WHY,
    ClassSpec,
    Deadlines,
    LengthDist,
    SecondsDist,
    WorkloadSpec,
)
from loadgen.workload.traces import shared_prefix_groups


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestPlan:
    """One request to send."""

    request_id: int
    class_name: str
    intended_ns: int
    prompt_tokens: int  # new tokens this request adds (a turn's user message, a document)
    output_tokens: int
    deadlines: Deadlines
    session_id: int | None = None
    turn: int | None = None
    delay_s: float = 0.0  # think or tool time after the previous turn/hop ends
    priority: int | None = None
    prefix_groups: tuple[int, ...] = ()  # shared 512-token prefix blocks (trace replay)
    # The text to send, when it is not generated words: a dataset row's messages (a
    # single request: the whole prompt; a session's turn: its new messages), shared with
    # every plan of that row. `recorded_answer`: the dataset's answer to this turn.
    messages: tuple[tuple[str, str], ...] = ()
    recorded_answer: str | None = None
    shared_prefix: tuple[int, int] | None = None  # (group, prefix tokens): `prompt:` sets
    model: str | None = None  # the class's model (mix) for this request; None: target.model
    tool_result_tokens: int = 0  # agents: the tool result that follows this hop's answer
    branch: int | None = None  # agents: the sub-agent branch of a fan-out hop


@dataclass(frozen=True, slots=True, kw_only=True)
class Flow:
    """Requests that depend on each other: a session, a trajectory or a closed-loop batch."""

    kind: str  # "session" | "trajectory" | "batch"
    class_name: str
    session_id: int
    start_ns: int
    plans: tuple[RequestPlan, ...]
    system_prompt_tokens: int = 0  # sessions: the class's shared system prompt
    budget_s: float | None = None  # trajectories: the whole trajectory's deadline
    concurrency: int = 1  # batches: documents in flight at once
    history: str = "model"  # sessions from a dataset: "recorded" answers, or the model's
    grow: bool = True  # trajectories: each hop carries the whole trajectory so far
    context_max_tokens: int | None = None  # trajectories: the context cap
    context_overflow: str = "drop_oldest"  # or "summarize"
    summary_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Work:
    """Everything a run will send: independent requests and flows, each in start order."""

    singles: list[RequestPlan] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)

    @property
    def plans(self) -> list[RequestPlan]:
        """Every planned request, by request id."""
        every = list(self.singles)
        for flow in self.flows:
            every.extend(flow.plans)
        return sorted(every, key=lambda p: p.request_id)


def sample_lengths(dist: LengthDist, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` token counts from `dist`, rounded and clamped to [min, max] (at least 1)."""
    if dist.dist == "uniform":
        values = rng.integers(dist.min, dist.max + 1, count).astype(float)
    else:
        values = _sample(dist.dist, float(dist.value), dist.mean, dist.cv, count, rng)
    clipped: np.ndarray = np.clip(np.rint(values), max(1, dist.min), dist.max).astype(np.int64)
    return clipped


def sample_seconds(dist: SecondsDist | None, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` durations in seconds from `dist` (zeros when there is none)."""
    if dist is None:
        return np.zeros(count)
    if dist.dist == "uniform":
        values = rng.uniform(dist.min, dist.max, count)
    else:
        values = _sample(dist.dist, dist.value, dist.mean, dist.cv, count, rng)
    clipped: np.ndarray = np.clip(values, dist.min, dist.max)
    return clipped


def _sample(
    dist: str, value: float, mean: float, cv: float, count: int, rng: np.random.Generator
) -> np.ndarray:
    """fixed, exponential or lognormal (by mean and coefficient of variation) samples."""
    if dist == "fixed":
        return np.full(count, value)
    if dist == "exponential":
        return rng.exponential(mean, count)
    sigma2 = np.log1p(cv**2)  # lognormal parameterised by its mean and coefficient of variation
    return rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), count)


@dataclass(slots=True)
class _Start:
    """A class's request or flow before ids are given (ids follow start time order)."""

    time_ns: int
    class_index: int
    size: int  # requests it holds
    make: object  # callable(first_request_id) -> RequestPlan | Flow


def plan_work(spec: WorkloadSpec, seed: int | None = None) -> Work:
    """Every request of the run, grouped into independent requests and flows."""
    run_seed = spec.seed if seed is None else seed
    starts: list[_Start] = []
    for index, cls in enumerate(spec.classes.values()):
        starts.extend(_class_starts(cls, index, run_seed, spec.source, spec.target.tokenizer))
    starts.sort(key=lambda s: (s.time_ns, s.class_index))
    work = Work()
    next_id = 0
    for start in starts:
        made = start.make(next_id)  # type: ignore[operator]  # a closure built below
        if isinstance(made, Flow):
            work.flows.append(made)
            if made.plans:
                _check_span(spec.source, made.class_name, made.plans[-1].intended_ns / NS_PER_S)
        else:
            work.singles.append(made)
        next_id += start.size
    return work


def _check_span(source: str, class_name: str, last_s: float) -> None:
    """Every intended send lies within `MAX_SPAN_S` of t0 (ns since t0 are int64 columns)."""
    if not last_s <= MAX_SPAN_S:  # also NaN
        raise ConfigError(
            source, f"classes.{class_name}",
            f"its schedule reaches {last_s:,.0f} s after t0: more than "
            f"{MAX_SPAN_S:,} s ({SPAN_WHY})",
            "raise the rate, or lower requests, think/tool times or (traces) raise speed",
        )  # fmt: skip


def plan_run(spec: WorkloadSpec, seed: int | None = None) -> list[RequestPlan]:
    """Every request of the run, by request id."""
    return plan_work(spec, seed).plans


def build(
    spec: WorkloadSpec, arrivals: list[Arrival], seed: int | None = None
) -> list[RequestPlan]:
    """One single-request plan per arrival, in arrival order (classes without flows)."""
    run_seed = spec.seed if seed is None else seed
    by_class: dict[str, list[int]] = {name: [] for name in spec.classes}
    for index, arrival in enumerate(arrivals):
        by_class[arrival.class_name].append(index)
    prompt = np.zeros(len(arrivals), dtype=np.int64)
    output = np.zeros(len(arrivals), dtype=np.int64)
    for name, indices in by_class.items():
        p, o = _lengths(spec.classes[name], len(indices), run_seed)
        prompt[indices], output[indices] = p, o
    return [
        RequestPlan(
            request_id=a.request_id, class_name=a.class_name, intended_ns=a.intended_ns,
            prompt_tokens=int(prompt[i]), output_tokens=int(output[i]),
            deadlines=spec.classes[a.class_name].deadlines,
            priority=spec.classes[a.class_name].priority,
        )
        for i, a in enumerate(arrivals)
    ]  # fmt: skip


def _lengths(cls: ClassSpec, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output token counts of a class's first `count` requests."""
    if cls.arrival.process == "trace":
        rows = trace_requests(cls, seed)[:count]
        return (np.array([r.prompt_tokens for r in rows], dtype=np.int64),
                np.array([r.output_tokens for r in rows], dtype=np.int64))  # fmt: skip
    rng = class_rng(seed, cls.name, "lengths")
    return sample_lengths(cls.prompt_tokens, count, rng), sample_lengths(
        cls.output_tokens, count, rng
    )


def _class_starts(
    cls: ClassSpec, class_index: int, seed: int, source: str, tokenizer: str | None = None
) -> list[_Start]:  # fmt: skip
    if cls.concurrency is not None:
        return [_batch_start(cls, class_index, seed, tokenizer)]
    if is_agent_trace(cls):
        return _agent_trace_starts(cls, class_index, seed, source)
    times_s = class_times_s(cls, seed)
    if times_s.size:
        _check_span(source, cls.name, float(times_s.max()))
    times_ns = np.round(times_s * NS_PER_S).astype(np.int64)
    if cls.dataset is not None and cls.dataset.turns == "all":
        return _dataset_sessions(cls, class_index, times_ns, seed, tokenizer)
    if cls.turns is None and cls.kind != "agent":
        prompt, output = _lengths(cls, len(times_ns), seed)
        extras = _extras(cls, len(times_ns), seed, tokenizer, prompt, output)
        return [
            _single_start(cls, class_index, int(t), int(p), int(o), extra)
            for t, p, o, extra in zip(times_ns, prompt, output, extras, strict=True)
        ]
    rng = class_rng(seed, cls.name, "flows")
    counts_dist = cls.turns if cls.turns is not None else cls.hops
    assert counts_dist is not None
    counts = sample_lengths(counts_dist, len(times_ns), rng)
    total = int(counts.sum())
    prompt, output = _lengths(cls, total, seed)
    delays = sample_seconds(
        cls.think_time_s if cls.kind != "agent" else cls.tool_time_s, total, rng
    )
    tools = _tool_results(cls, total, seed)
    models = _models(cls, len(times_ns), seed)
    starts, offset = [], 0
    for t, n, model in zip(times_ns, counts, models, strict=True):
        n = int(n)
        chunk = slice(offset, offset + n)
        starts.append(_flow_start(cls, class_index, int(t), prompt[chunk], output[chunk],
                                  delays[chunk], tools[chunk], model))  # fmt: skip
        offset += n
    return starts


def is_agent_trace(cls: ClassSpec) -> bool:
    """True for an agent class replaying recorded trajectories (`format: agent`)."""
    trace = cls.arrival.trace
    return trace is not None and trace.format == "agent"


def agent_trajectories(cls: ClassSpec) -> list[TraceTrajectory]:
    """The trajectories an agent trace class replays: its window (on start times), limit."""
    trace = cls.arrival.trace
    assert trace is not None
    chosen = [t for t in load_agent_trace(trace.path) if t.start_s >= trace.start_s
              and (trace.end_s is None or t.start_s < trace.end_s)]  # fmt: skip
    return chosen[: trace.limit] if trace.limit is not None else chosen


def _agent_trace_starts(cls: ClassSpec, class_index: int, seed: int, source: str) -> list[_Start]:
    """One growing trajectory per recorded one, at its start (÷ speed, from the window's
    start), hops after the recorded tool times; each hop's answer the recorded length."""
    trace = cls.arrival.trace
    assert trace is not None
    if trace.rate_scale != 1:
        raise ConfigError(source, f"classes.{cls.name}.arrival", "an agent trace replays each "
                          "recorded trajectory once: it cannot be rate-scaled",
                          "scale it in time with speed (--rate and capacity searches "
                          "scale rates)")  # fmt: skip
    trajectories = agent_trajectories(cls)
    models = _models(cls, len(trajectories), seed)
    starts = []
    for recorded, model in zip(trajectories, models, strict=True):
        start_s = cls.arrival.start_s + (recorded.start_s - trace.start_s) / trace.speed
        _check_span(source, cls.name, start_s)
        starts.append(_recorded_start(cls, class_index, round(start_s * NS_PER_S), recorded,
                                      model, trace.speed))  # fmt: skip
    return starts


def _recorded_start(
    cls: ClassSpec, class_index: int, t_ns: int, recorded: TraceTrajectory, model: str | None,
    speed: float,
) -> _Start:  # fmt: skip
    tools = recorded.tool_results()
    size = sum(len(calls) for calls in recorded.hops)

    def make(first_id: int) -> Flow:
        plans, earliest, request_id = [], t_ns, first_id
        for hop, calls in enumerate(recorded.hops):
            delay = 0.0 if hop == 0 else recorded.hops[hop - 1][0].tool_s / speed
            earliest += int(delay * NS_PER_S)
            for branch, call in enumerate(calls):
                plans.append(RequestPlan(
                    request_id=request_id, class_name=cls.name, intended_ns=earliest,
                    prompt_tokens=call.input_tokens, output_tokens=call.output_tokens,
                    deadlines=cls.deadlines, session_id=first_id, turn=hop, delay_s=delay,
                    priority=cls.priority, model=model, tool_result_tokens=tools[hop],
                    branch=branch if len(calls) > 1 else None,
                ))  # fmt: skip
                request_id += 1
        context = cls.context
        return Flow(
            kind="trajectory", class_name=cls.name, session_id=first_id, start_ns=t_ns,
            plans=tuple(plans), system_prompt_tokens=cls.system_prompt_tokens,
            budget_s=cls.trajectory_budget_s, grow=context.grow,
            context_max_tokens=context.max_tokens, context_overflow=context.overflow,
            summary_tokens=context.summary_tokens,
        )  # fmt: skip

    return _Start(t_ns, class_index, size, make)


DEFAULT_TOOL_RESULT = LengthDist(dist="fixed", value=100)  # tokens, when the class gives none


def _tool_results(cls: ClassSpec, count: int, seed: int) -> np.ndarray:
    """Tokens of each hop's tool result (growing agents only; zeros otherwise)."""
    if cls.kind != "agent" or not cls.context.grow:
        return np.zeros(count, dtype=np.int64)
    dist = cls.tool_result_tokens or DEFAULT_TOOL_RESULT
    return sample_lengths(dist, count, class_rng(seed, cls.name, "tool_results"))


def _models(cls: ClassSpec, count: int, seed: int) -> list[str | None]:
    """Each request's (or flow's) model, drawn by the class's weights (seeded)."""
    if not cls.models:
        return [None] * count
    if len(cls.models) == 1:
        return [cls.models[0][0]] * count
    weights = np.array([w for _, w in cls.models])
    picks = class_rng(seed, cls.name, "models").choice(
        len(weights), count, p=weights / weights.sum()
    )
    return [cls.models[int(i)][0] for i in picks]


NO_EXTRAS: dict[str, object] = {}  # shared, never written to


def _extras(
    cls: ClassSpec, count: int, seed: int, tokenizer: str | None, prompt: np.ndarray,
    output: np.ndarray,
) -> list[dict[str, object]]:  # fmt: skip
    """What a single request carries beyond its lengths: its trace prefix blocks, dataset
    messages, shared-prefix group and model. Fills `prompt` (and, for `from_dataset`,
    `output`) in place from the dataset's rows. A class with none of them shares one empty
    mapping (a dict per request would add ~10 % to the plans' peak memory)."""
    has_extras = (
        bool(cls.models)
        or cls.arrival.process == "trace"
        or (cls.shared_prefix is not None or cls.dataset is not None)
    )
    if not has_extras:
        return [NO_EXTRAS] * count
    extras: list[dict[str, object]] = [{} for _ in range(count)]
    for extra, model in zip(extras, _models(cls, count, seed), strict=True):
        if model is not None:
            extra["model"] = model
    if cls.arrival.process == "trace":
        groups = shared_prefix_groups(trace_requests(cls, seed)[:count])
        for extra, group in zip(extras, groups, strict=True):
            extra["prefix_groups"] = group
    if cls.shared_prefix is not None:
        shared = cls.shared_prefix
        rng = class_rng(seed, cls.name, "prefix_groups")
        picks = rng.integers(0, shared.groups, count)
        for i, extra in enumerate(extras):
            extra["shared_prefix"] = (int(picks[i]), shared.shared_prefix_tokens)
    if cls.dataset is not None:
        data = load_dataset(cls.dataset, tokenizer, cls.output_from_dataset)
        rows = sample_rows(data, cls.dataset, count, class_rng(seed, cls.name, "dataset"))
        for i, (extra, row) in enumerate(zip(extras, rows, strict=True)):
            extra["messages"] = first_messages(row)
            prompt[i] = row.prompt_tokens
            if cls.output_from_dataset and row.output_tokens is not None:
                output[i] = row.output_tokens
    return extras


def first_messages(row: Conversation) -> tuple[tuple[str, str], ...]:
    """The first request of a dataset row: its system prompt, then its first human turn."""
    user = (("user", row.turns[0][0]),)
    return ((("system", row.system), *user)) if row.system else user


def _dataset_sessions(
    cls: ClassSpec, class_index: int, times_ns: np.ndarray, seed: int, tokenizer: str | None
) -> list[_Start]:  # fmt: skip
    """`turns: all`: one session per arrival, replaying a sampled conversation's human
    turns in order; each turn's output length is its recorded answer's (`from_dataset`)
    or drawn from the class's distribution."""
    assert cls.dataset is not None
    data = load_dataset(cls.dataset, tokenizer, cls.output_from_dataset)
    rows = sample_rows(data, cls.dataset, len(times_ns), class_rng(seed, cls.name, "dataset"))
    count = counter_for(tokenizer)
    total = sum(len(row.turns) for row in rows)
    drawn = sample_lengths(cls.output_tokens, total, class_rng(seed, cls.name, "lengths"))
    delays = sample_seconds(cls.think_time_s, total, class_rng(seed, cls.name, "flows"))
    models = _models(cls, len(times_ns), seed)
    starts, offset = [], 0
    for t, row, model in zip(times_ns, rows, models, strict=True):
        n = len(row.turns)
        turns = []
        for k, (user, answer) in enumerate(row.turns):
            messages = first_messages(row) if k == 0 else (("user", user),)
            output = int(drawn[offset + k])
            if cls.output_from_dataset and answer is not None:
                output = max(1, count(answer)) if k else (row.output_tokens or output)
            prompt = row.prompt_tokens if k == 0 else count(user)
            turns.append((messages, answer, prompt, output, float(delays[offset + k])))
        starts.append(_dataset_flow_start(cls, class_index, int(t), turns, model))
        offset += n
    return starts


def _dataset_flow_start(
    cls: ClassSpec, class_index: int, t_ns: int,
    turns: list[tuple[tuple[tuple[str, str], ...], str | None, int, int, float]],
    model: str | None,
) -> _Start:  # fmt: skip
    assert cls.dataset is not None
    history = cls.dataset.history

    def make(first_id: int) -> Flow:
        plans, earliest = [], t_ns
        for turn, (messages, answer, prompt, output, delay) in enumerate(turns):
            delay = 0.0 if turn == 0 else delay
            earliest += int(delay * NS_PER_S)
            plans.append(RequestPlan(
                request_id=first_id + turn, class_name=cls.name, intended_ns=earliest,
                prompt_tokens=prompt, output_tokens=output, deadlines=cls.deadlines,
                session_id=first_id, turn=turn, delay_s=delay, priority=cls.priority,
                messages=messages, recorded_answer=answer, model=model,
            ))  # fmt: skip
        return Flow(kind="session", class_name=cls.name, session_id=first_id, start_ns=t_ns,
                    plans=tuple(plans), history=history)  # fmt: skip

    return _Start(t_ns, class_index, len(turns), make)


def _single_start(
    cls: ClassSpec, class_index: int, t_ns: int, prompt: int, output: int,
    extra: dict[str, object] | None = None,
) -> _Start:  # fmt: skip
    if not extra:  # the common case, kept as small as it was: no mapping held per request

        def plain(request_id: int) -> RequestPlan:
            return RequestPlan(
                request_id=request_id, class_name=cls.name, intended_ns=t_ns,
                prompt_tokens=prompt, output_tokens=output, deadlines=cls.deadlines,
                priority=cls.priority,
            )  # fmt: skip

        return _Start(t_ns, class_index, 1, plain)
    more: dict[str, Any] = extra

    def make(request_id: int) -> RequestPlan:
        return RequestPlan(
            request_id=request_id, class_name=cls.name, intended_ns=t_ns, prompt_tokens=prompt,
            output_tokens=output, deadlines=cls.deadlines, priority=cls.priority, **more,
        )  # fmt: skip

    return _Start(t_ns, class_index, 1, make)


def _flow_start(
    cls: ClassSpec, class_index: int, t_ns: int, prompt: np.ndarray, output: np.ndarray,
    delays: np.ndarray, tools: np.ndarray, model: str | None,
) -> _Start:  # fmt: skip
    kind = "trajectory" if cls.kind == "agent" else "session"
    fanout = cls.fanout if kind == "trajectory" else None
    branches = fanout.branches if fanout is not None and fanout.at_hop < len(prompt) else 1

    def make(first_id: int) -> Flow:
        plans, earliest, request_id = [], t_ns, first_id
        for turn in range(len(prompt)):
            delay = 0.0 if turn == 0 else float(delays[turn])
            earliest += int(delay * NS_PER_S)
            fan = branches if fanout is not None and turn == fanout.at_hop else 1
            for branch in range(fan):
                plans.append(RequestPlan(
                    request_id=request_id, class_name=cls.name, intended_ns=earliest,
                    prompt_tokens=int(prompt[turn]), output_tokens=int(output[turn]),
                    deadlines=cls.deadlines, session_id=first_id, turn=turn, delay_s=delay,
                    priority=cls.priority, model=model, tool_result_tokens=int(tools[turn]),
                    branch=branch if fan > 1 else None,
                ))  # fmt: skip
                request_id += 1
        context = cls.context
        return Flow(
            kind=kind, class_name=cls.name, session_id=first_id, start_ns=t_ns, plans=tuple(plans),
            system_prompt_tokens=cls.system_prompt_tokens, budget_s=cls.trajectory_budget_s,
            grow=context.grow, context_max_tokens=context.max_tokens,
            context_overflow=context.overflow, summary_tokens=context.summary_tokens,
        )  # fmt: skip

    return _Start(t_ns, class_index, len(prompt) + branches - 1, make)


def _batch_start(cls: ClassSpec, class_index: int, seed: int, tokenizer: str | None) -> _Start:
    assert cls.requests is not None
    assert cls.concurrency is not None
    count = cls.requests
    prompt, output = _lengths(cls, count, seed)
    extras = _extras(cls, count, seed, tokenizer, prompt, output)
    t_ns = round(cls.arrival.start_s * NS_PER_S)

    def make(first_id: int) -> Flow:
        plans = tuple(
            RequestPlan(
                request_id=first_id + i, class_name=cls.name, intended_ns=t_ns,
                prompt_tokens=int(prompt[i]), output_tokens=int(output[i]),
                deadlines=cls.deadlines, session_id=first_id, turn=i, priority=cls.priority,
                **extras[i],  # type: ignore[arg-type]  # RequestPlan's own optional fields
            )
            for i in range(count)
        )  # fmt: skip
        return Flow(kind="batch", class_name=cls.name, session_id=first_id, start_ns=t_ns,
                    plans=plans, concurrency=cls.concurrency or 1)  # fmt: skip

    return _Start(t_ns, class_index, count, make)


def singles_of(plans: Sequence[RequestPlan]) -> Work:
    """A Work of independent requests (tests and benchmarks that make plans by hand)."""
    return Work(singles=sorted(plans, key=lambda p: (p.intended_ns, p.request_id)))


# ---------------------------------------------------------------- memory estimate

# What one planned request costs the client at its peak, the end of the run, when the joined
# records are audited and written as per-minute histograms (benchmarks/plan_memory.py):
PLAN_BYTES = 750  # its plan, held all run (tracemalloc peak of plan_work: ~720 B)
RECORD_BYTES = 8_000  # its record through the audit, before its tokens (measured 2-7 KB)
TOKEN_BYTES = 220  # per output token: chunk times and ITL gaps in the frame, the audit and
# the histograms (measured 170-210 B)
# Per character of dataset prompt text (one-line 20 and 50 MB jsonl datasets of `lorem `
# words; peak RSS by `/usr/bin/time -f %M loadgen check|run` less a 1 MB line's): the text
# held all run (the file read, its parsed row, the plans' shared messages: `check` peaked at
# 2.8 B per character), and what sending the largest prompt adds (its JSON body and the
# send buffer: the run at 3.5 B per character).
PROMPT_HELD_COPIES = 3  # × the kept rows' text, once per row however often it is sent
PROMPT_SENT_COPIES = 2  # × the largest prompt: the request in flight
TRACE_TOKENS = 256  # output tokens assumed per request of a trace too big to read first
TRACE_READ_FIRST = 16 * MIB  # a trace up to this size is read to count its requests exactly


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """The client memory a run of the plan needs at its peak (plans, records and their audit).

    bytes = requests × (PLAN_BYTES + RECORD_BYTES + TOKEN_BYTES × tokens)
            + PROMPT_HELD_COPIES × dataset text + PROMPT_SENT_COPIES × its largest prompt,

    with `requests` the expected count (an upper bound for a large trace: every row, times
    rate_scale; the plan's own count once it is built), `tokens` their mean output length,
    and the dataset text in characters of the rows kept (generated prompts are made at send
    time, one request's at a time: not counted).
    """

    requests: int
    output_tokens: float  # mean per request
    bytes: int
    prompt_chars: int = 0  # the datasets' kept text

    def text(self) -> str:
        """`~1.2 GiB for 200,000 requests of ~100 output tokens` (`and 50.0 MiB of dataset
        prompts` when there are)."""
        prompts = (f" and {size_text(self.prompt_chars)} of dataset prompts"
                   if self.prompt_chars else "")  # fmt: skip
        return (f"~{size_text(self.bytes)} for {self.requests:,} requests of "
                f"~{self.output_tokens:,.0f} output tokens{prompts}")  # fmt: skip


def estimate_memory(
    spec: WorkloadSpec, seed: int | None = None, plans: Sequence[RequestPlan] | None = None
) -> MemoryEstimate:
    """The estimate, from the spec alone (nothing is sampled; small traces are read), or
    from the built `plans` of it (their count and output lengths: what `check` prints)."""
    run_seed = spec.seed if seed is None else seed
    counts, tokens = [], []
    for cls in spec.classes.values():
        count, mean_tokens = _expected_class(cls, run_seed, spec.target.tokenizer)
        counts.append(count)
        tokens.append(count * mean_tokens)
    requests = sum(counts)
    mean = sum(tokens) / requests if requests else 0.0
    if plans is not None:
        requests = float(len(plans))
        mean = sum(p.output_tokens for p in plans) / len(plans) if plans else 0.0
    held, largest = _dataset_chars(spec)
    per_request = PLAN_BYTES + RECORD_BYTES + TOKEN_BYTES * mean
    total = requests * per_request + PROMPT_HELD_COPIES * held + PROMPT_SENT_COPIES * largest
    return MemoryEstimate(requests=round(requests), output_tokens=mean, bytes=round(total),
                          prompt_chars=held)  # fmt: skip


def _dataset_chars(spec: WorkloadSpec) -> tuple[int, int]:
    """Characters of every dataset's kept rows (each file once), and of the largest row."""
    held, largest, seen = 0, 0, set()
    for cls in spec.classes.values():
        if cls.dataset is None or cls.dataset in seen:
            continue
        seen.add(cls.dataset)
        data = load_dataset(cls.dataset, spec.target.tokenizer, cls.output_from_dataset)
        for row in data.kept:
            chars = len(row.system or "") + sum(len(q) + len(a or "") for q, a in row.turns)
            held += chars
            largest = max(largest, chars)
    return held, largest


def _expected_class(cls: ClassSpec, seed: int, tokenizer: str | None) -> tuple[float, float]:
    """Expected requests of a class and their mean output tokens."""
    if is_agent_trace(cls):
        trajectories = agent_trajectories(cls)
        calls = [c for t in trajectories for hop in t.hops for c in hop]
        return float(len(calls)), sum(c.output_tokens for c in calls) / max(1, len(calls))
    if cls.arrival.process == "trace":
        return _expected_trace(cls, seed)
    if cls.requests is not None:
        starts = float(cls.requests)
    else:
        starts = (cls.arrival.mean_rate_per_s or 0.0) * (cls.duration_s or 0.0)
    flows = cls.turns if cls.turns is not None else cls.hops
    if cls.concurrency is None and flows is not None:
        extra = starts * (cls.fanout.branches - 1) if cls.fanout is not None else 0.0
        starts = starts * _clamped_mean(flows) + extra  # a fan-out hop's extra branches
    if cls.dataset is not None:
        return _expected_dataset(cls, starts, tokenizer)
    return starts, _clamped_mean(cls.output_tokens)


def _expected_dataset(cls: ClassSpec, starts: float, tokenizer: str | None) -> tuple[float, float]:
    """A dataset class: sessions times the mean turns (`turns: all`); the recorded output
    lengths' mean (`from_dataset`)."""
    assert cls.dataset is not None
    data = load_dataset(cls.dataset, tokenizer, cls.output_from_dataset)
    if cls.dataset.turns == "all":
        starts *= sum(len(row.turns) for row in data.kept) / len(data.kept)
    outputs = [row.output_tokens for row in data.kept if row.output_tokens is not None]
    if cls.output_from_dataset and outputs:
        return starts, sum(outputs) / len(outputs)
    return starts, _clamped_mean(cls.output_tokens)


def _clamped_mean(dist: LengthDist) -> float:
    return min(max(dist.expected, dist.min, 1), dist.max)


def _expected_trace(cls: ClassSpec, seed: int) -> tuple[float, float]:
    """A small trace is read (plans reuse it); a large one counts as every row, scaled."""
    trace = cls.arrival.trace
    assert trace is not None
    path = Path(trace.path)
    if path.stat().st_size <= TRACE_READ_FIRST:
        rows = trace_requests(cls, seed)  # cached: the plans read the same
        count = float(len(rows))
        mean = sum(r.output_tokens for r in rows) / count if rows else 0.0
    else:
        count, mean = _line_count(path) * trace.rate_scale, float(TRACE_TOKENS)
    for limit in (trace.limit, cls.requests):
        if limit is not None:
            count = min(count, float(limit))
    return count, mean


def _line_count(path: Path) -> int:
    """Newlines in a file, read in 1 MiB blocks (an upper bound on a trace's rows)."""
    lines = 0
    with path.open("rb") as file:
        while block := file.read(MIB):
            lines += block.count(b"\n")
    return lines + 1


def host_memory_bytes() -> int | None:
    """This host's memory as the process may use it: physical RAM, or a smaller cgroup limit."""
    limits = []
    with contextlib.suppress(ValueError, OSError, AttributeError):  # not on this platform
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for name in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max" or a huge number: no limit
            limits.append(int(text))
    return min(limits) if limits else None


def default_memory_cap() -> tuple[int, str]:
    """Half of this host's memory (4 GiB where it cannot be read), and where it came from."""
    host = host_memory_bytes()
    if host is None:
        return 4 * 1024 * MIB, "this host's memory is unknown"
    return host // 2, f"half of this host's {size_text(host)}"


def check_memory(
    spec: WorkloadSpec, cap_bytes: int, cap_source: str, seed: int | None = None
) -> MemoryEstimate:
    """The estimate; a `ConfigError` with the figure when it exceeds `cap_bytes`."""
    estimate = estimate_memory(spec, seed)
    if estimate.bytes > cap_bytes:
        raise ConfigError(
            spec.source, "",
            f"this plan needs {estimate.text()}: over the {size_text(cap_bytes)} memory cap "
            f"({cap_source})",
            "lower --requests, --duration or --rate, or raise the cap with --max-memory-gb",
        )  # fmt: skip
    return estimate
