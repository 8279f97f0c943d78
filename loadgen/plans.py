"""Request plans: what to send and when, built from the spec and the schedule alone.

Third stage (arrivals → plans → engine). A plan carries the intended send time, the class,
the target prompt and output token counts and the class's deadlines. Token counts are
sampled per class from its own seeded stream, so plans are a pure function of spec and seed.
The prompt text itself is made just before sending (`prompts.prompt_text`), to keep a
million plans small in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen.arrivals import Arrival, class_rng, schedule
from loadgen.spec import Deadlines, LengthDist, WorkloadSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestPlan:
    """One request to send."""

    request_id: int
    class_name: str
    intended_ns: int
    prompt_tokens: int
    output_tokens: int
    deadlines: Deadlines


def sample_lengths(dist: LengthDist, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` token counts from `dist`, rounded and clamped to [min, max] (at least 1)."""
    if dist.dist == "fixed":
        values = np.full(count, float(dist.value))
    elif dist.dist == "uniform":
        values = rng.integers(dist.min, dist.max + 1, count).astype(float)
    elif dist.dist == "exponential":
        values = rng.exponential(dist.mean, count)
    else:  # lognormal parameterised by its mean and coefficient of variation
        sigma2 = np.log1p(dist.cv**2)
        values = rng.lognormal(np.log(dist.mean) - sigma2 / 2, np.sqrt(sigma2), count)
    clipped: np.ndarray = np.clip(np.rint(values), max(1, dist.min), dist.max).astype(np.int64)
    return clipped


def build(
    spec: WorkloadSpec, arrivals: list[Arrival], seed: int | None = None
) -> list[RequestPlan]:
    """One plan per arrival, in arrival order."""
    run_seed = spec.seed if seed is None else seed
    by_class: dict[str, list[int]] = {name: [] for name in spec.classes}
    for index, arrival in enumerate(arrivals):
        by_class[arrival.class_name].append(index)
    prompt = np.zeros(len(arrivals), dtype=np.int64)
    output = np.zeros(len(arrivals), dtype=np.int64)
    for name, indices in by_class.items():
        cls = spec.classes[name]
        rng = class_rng(run_seed, name, "lengths")
        prompt[indices] = sample_lengths(cls.prompt_tokens, len(indices), rng)
        output[indices] = sample_lengths(cls.output_tokens, len(indices), rng)
    return [
        RequestPlan(
            request_id=a.request_id,
            class_name=a.class_name,
            intended_ns=a.intended_ns,
            prompt_tokens=int(prompt[i]),
            output_tokens=int(output[i]),
            deadlines=spec.classes[a.class_name].deadlines,
        )
        for i, a in enumerate(arrivals)
    ]


def plan_run(spec: WorkloadSpec, seed: int | None = None) -> list[RequestPlan]:
    """Every request of the run, in intended-time order."""
    return build(spec, schedule(spec, seed), seed)
