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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loadgen.arrivals import Arrival, class_rng, class_times_s, trace_requests
from loadgen.spec import ClassSpec, Deadlines, LengthDist, SecondsDist, WorkloadSpec

NS_PER_S = 1_000_000_000


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
        starts.extend(_class_starts(cls, index, run_seed))
    starts.sort(key=lambda s: (s.time_ns, s.class_index))
    work = Work()
    next_id = 0
    for start in starts:
        made = start.make(next_id)  # type: ignore[operator]  # a closure built below
        if isinstance(made, Flow):
            work.flows.append(made)
        else:
            work.singles.append(made)
        next_id += start.size
    return work


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


def _class_starts(cls: ClassSpec, class_index: int, seed: int) -> list[_Start]:
    if cls.concurrency is not None:
        return [_batch_start(cls, class_index, seed)]
    times_ns = np.round(class_times_s(cls, seed) * NS_PER_S).astype(np.int64)
    if cls.turns is None and cls.kind != "agent":
        prompt, output = _lengths(cls, len(times_ns), seed)
        prefixes: list[tuple[int, ...]] = [()] * len(times_ns)
        if cls.arrival.process == "trace":
            from loadgen.traces import shared_prefix_groups

            prefixes = shared_prefix_groups(trace_requests(cls, seed)[: len(times_ns)])
        return [_single_start(cls, class_index, int(t), int(p), int(o), g)
                for t, p, o, g in zip(times_ns, prompt, output, prefixes, strict=True)]  # fmt: skip
    rng = class_rng(seed, cls.name, "flows")
    counts_dist = cls.turns if cls.turns is not None else cls.hops
    assert counts_dist is not None
    counts = sample_lengths(counts_dist, len(times_ns), rng)
    total = int(counts.sum())
    prompt, output = _lengths(cls, total, seed)
    delays = sample_seconds(
        cls.think_time_s if cls.kind != "agent" else cls.tool_time_s, total, rng
    )
    starts, offset = [], 0
    for t, n in zip(times_ns, counts, strict=True):
        n = int(n)
        chunk = slice(offset, offset + n)
        starts.append(
            _flow_start(cls, class_index, int(t), prompt[chunk], output[chunk], delays[chunk])
        )
        offset += n
    return starts


def _single_start(
    cls: ClassSpec, class_index: int, t_ns: int, prompt: int, output: int,
    prefix_groups: tuple[int, ...] = (),
) -> _Start:  # fmt: skip
    def make(request_id: int) -> RequestPlan:
        return RequestPlan(
            request_id=request_id, class_name=cls.name, intended_ns=t_ns, prompt_tokens=prompt,
            output_tokens=output, deadlines=cls.deadlines, priority=cls.priority,
            prefix_groups=prefix_groups,
        )  # fmt: skip

    return _Start(t_ns, class_index, 1, make)


def _flow_start(
    cls: ClassSpec, class_index: int, t_ns: int, prompt: np.ndarray, output: np.ndarray,
    delays: np.ndarray,
) -> _Start:  # fmt: skip
    kind = "trajectory" if cls.kind == "agent" else "session"

    def make(first_id: int) -> Flow:
        plans, earliest = [], t_ns
        for turn in range(len(prompt)):
            delay = 0.0 if turn == 0 else float(delays[turn])
            earliest += int(delay * NS_PER_S)
            plans.append(RequestPlan(
                request_id=first_id + turn, class_name=cls.name, intended_ns=earliest,
                prompt_tokens=int(prompt[turn]), output_tokens=int(output[turn]),
                deadlines=cls.deadlines, session_id=first_id, turn=turn, delay_s=delay,
                priority=cls.priority,
            ))  # fmt: skip
        return Flow(
            kind=kind, class_name=cls.name, session_id=first_id, start_ns=t_ns, plans=tuple(plans),
            system_prompt_tokens=cls.system_prompt_tokens, budget_s=cls.trajectory_budget_s,
        )  # fmt: skip

    return _Start(t_ns, class_index, len(prompt), make)


def _batch_start(cls: ClassSpec, class_index: int, seed: int) -> _Start:
    assert cls.requests is not None
    assert cls.concurrency is not None
    count = cls.requests
    prompt, output = _lengths(cls, count, seed)
    t_ns = round(cls.arrival.start_s * NS_PER_S)

    def make(first_id: int) -> Flow:
        plans = tuple(
            RequestPlan(
                request_id=first_id + i, class_name=cls.name, intended_ns=t_ns,
                prompt_tokens=int(prompt[i]), output_tokens=int(output[i]),
                deadlines=cls.deadlines, session_id=first_id, turn=i, priority=cls.priority,
            )
            for i in range(count)
        )  # fmt: skip
        return Flow(kind="batch", class_name=cls.name, session_id=first_id, start_ns=t_ns,
                    plans=plans, concurrency=cls.concurrency or 1)  # fmt: skip

    return _Start(t_ns, class_index, count, make)


def singles_of(plans: Sequence[RequestPlan]) -> Work:
    """A Work of independent requests (tests and benchmarks that make plans by hand)."""
    return Work(singles=sorted(plans, key=lambda p: (p.intended_ns, p.request_id)))
