"""Arrivals: the intended send time of every request, precomputed from the spec and a seed.

Second stage (spec → arrivals → plans). Pure and seeded: the same spec and seed give the
same schedule, whatever machine or process computes it, so a run can be repeated or split
into shards. Each class has its own random stream (seeded by the run seed and the class
name), so adding a class does not change another class's arrivals.

Gaps: constant 1/rate; Poisson exponential with mean 1/rate; gamma with shape 1/cv² and
mean 1/rate (cv > 1 is bursty). For these the first request of a class is sent at its
`start_s`, each later one a gap after the previous; a `duration_s` class sends while
t < start + duration. On/off (a two-state modulated Poisson process) and ramps (Poisson
at each step's rate) draw Poisson counts per period; a trace replays recorded times.
"""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from loadgen.units import NS_PER_S
from loadgen.workload.model import ArrivalSpec, ClassSpec, TraceSpec, WorkloadSpec
from loadgen.workload.traces import TraceOptions, load_trace

if TYPE_CHECKING:
    from loadgen.workload.traces import TraceRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Arrival:
    """One planned request's intended send time (ns since run t0) and class."""

    request_id: int
    class_name: str
    intended_ns: int


def class_rng(seed: int, class_name: str, stream: str) -> np.random.Generator:
    """The random stream for one purpose (`arrivals`, `lengths`, ...) of one class."""
    key = zlib.crc32(f"{class_name}\x00{stream}".encode())
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, key])


def gaps_s(arrival: ArrivalSpec, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` inter-arrival gaps in seconds for one arrival process."""
    mean = 1.0 / arrival.rate_per_s
    if arrival.process == "constant":
        return np.full(count, mean)
    if arrival.process == "poisson":
        return rng.exponential(mean, count)
    shape = 1.0 / arrival.cv**2  # gamma: mean = shape·scale, cv = 1/√shape
    return rng.gamma(shape, mean / shape, count)


def class_times_s(cls: ClassSpec, seed: int) -> np.ndarray:
    """Intended send times of one class, in seconds since t0, ascending."""
    rng = class_rng(seed, cls.name, "arrivals")
    arrival = cls.arrival
    if arrival.process == "onoff":
        times = _onoff_times(cls, rng)
    elif arrival.process == "ramp":
        times = _ramp_times(cls, rng)
    elif arrival.process == "trace":
        times = np.array([r.t_s for r in trace_requests(cls, seed)], dtype=float)
        times = arrival.start_s + _limit(times, cls)
    else:
        times = _renewal_times(cls, rng)
    return times


def _limit(times: np.ndarray, cls: ClassSpec) -> np.ndarray:
    """Keep the first `requests` times, or those before the class's `duration_s`."""
    if cls.requests is not None:
        return times[: cls.requests]
    if cls.duration_s is not None:
        return times[times < cls.arrival.start_s + cls.duration_s]
    return times


def _renewal_times(cls: ClassSpec, rng: np.random.Generator) -> np.ndarray:
    start = cls.arrival.start_s
    if cls.requests is not None:
        gaps = gaps_s(cls.arrival, cls.requests, rng)
        gaps[0] = 0.0
        return start + np.cumsum(gaps)
    assert cls.duration_s is not None  # the spec guarantees one of the two
    end = start + cls.duration_s
    # Draw in blocks until the horizon is passed; the same seed draws the same blocks.
    expected = max(16, int(cls.duration_s * cls.arrival.rate_per_s * 1.2) + 16)
    times: list[np.ndarray] = []
    last = start
    first = True
    while True:
        gaps = gaps_s(cls.arrival, expected, rng)
        if first:
            gaps[0] = 0.0
            first = False
        block = last + np.cumsum(gaps)
        times.append(block[block < end])
        if block[-1] >= end:
            break
        last = float(block[-1])
    return np.concatenate(times)


def _poisson_in(rate: float, begin: float, end: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals at `rate` in [begin, end): a Poisson count, then uniform order stats."""
    if rate <= 0 or end <= begin:
        return np.empty(0)
    count = rng.poisson(rate * (end - begin))
    return np.sort(rng.uniform(begin, end, count))


def _onoff_times(cls: ClassSpec, rng: np.random.Generator) -> np.ndarray:
    """A two-state modulated Poisson process, starting in the on state."""
    a = cls.arrival
    horizon = a.start_s + cls.duration_s if cls.duration_s is not None else math.inf
    wanted = cls.requests if cls.requests is not None else math.inf
    parts: list[np.ndarray] = []
    t, on, count = a.start_s, True, 0
    while t < horizon and count < wanted:
        length = rng.exponential(a.on_mean_s if on else a.off_mean_s)
        chunk = _poisson_in(
            a.on_rate_per_s if on else a.off_rate_per_s, t, min(t + length, horizon), rng
        )
        parts.append(chunk)
        count += len(chunk)
        t += length
        on = not on
    times = np.concatenate(parts) if parts else np.empty(0)
    return times[: cls.requests] if cls.requests is not None else times


def _ramp_times(cls: ClassSpec, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals at each step's rate for its duration, steps back to back."""
    a = cls.arrival
    horizon = a.start_s + cls.duration_s if cls.duration_s is not None else math.inf
    parts, t = [], a.start_s
    for rate, duration in a.steps:
        parts.append(_poisson_in(rate, t, min(t + duration, horizon), rng))
        t += duration
    times = np.concatenate(parts) if parts else np.empty(0)
    return times[: cls.requests] if cls.requests is not None else times


def trace_requests(cls: ClassSpec, seed: int) -> list[TraceRequest]:
    """The requests a trace-replay class sends (cached: arrivals and plans both need them)."""
    trace = cls.arrival.trace
    assert trace is not None
    return _load_trace_cached(trace, seed)


@functools.lru_cache(maxsize=8)
def _load_trace_cached(trace: TraceSpec, seed: int) -> list[TraceRequest]:
    options = TraceOptions(
        format=trace.format, start_s=trace.start_s, end_s=trace.end_s, speed=trace.speed,
        rate_scale=trace.rate_scale, spread_s=trace.spread_s,
        include_failed=trace.include_failed, limit=trace.limit,
    )  # fmt: skip
    return load_trace(Path(trace.path), options, seed=seed)


def schedule(spec: WorkloadSpec, seed: int | None = None) -> list[Arrival]:
    """Every class's arrivals merged in time order; request ids number them 0..n-1.

    Ties (equal times in two classes) are broken by class order in the file, so the
    schedule is a pure function of spec and seed.
    """
    run_seed = spec.seed if seed is None else seed
    names: list[str] = []
    times: list[np.ndarray] = []
    for cls in spec.classes.values():
        times.append(np.round(class_times_s(cls, run_seed) * NS_PER_S).astype(np.int64))
        names.append(cls.name)
    if not times:
        return []
    all_ns = np.concatenate(times)
    class_index = np.concatenate([np.full(len(t), i) for i, t in enumerate(times)])
    order = np.lexsort((class_index, all_ns))
    return [
        Arrival(request_id=i, class_name=names[class_index[j]], intended_ns=int(all_ns[j]))
        for i, j in enumerate(order)
    ]
