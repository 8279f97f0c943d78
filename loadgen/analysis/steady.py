"""Steady state of one load step: did the server keep up with the offered load?

Sits between a capacity step's records and its verdict (`loadgen.analysis.capacity.audit_step`): an
SLO met over a short step can hide a queue that grows without bound, so a step passes only
when its judged part (after the warm-up) shows a steady state. Pure functions of the
records frame; every figure is recomputable from `records.parquet`.

What is measured over the judged part [cut, last intended time] of length W:

- offered rate: requests intended in it / W; completed rate: requests (any outcome) that
  ended in it / W. Their difference is exactly the growth of the in-flight count L over
  the part (arrivals − departures = L(end) − L(cut)), so a server that cannot keep up
  completes less than it is offered, whatever the SLO says. At a steady state L(cut) and
  L(end) are two draws of the same distribution, so the shortfall's noise allowance is
  z·√2·σ_L (σ_L: the time-weighted spread of L about its fitted line over the part, z the
  normal quantile at CONFIDENCE).
- lifetime: the mean time from intended to end of the judged requests; W / lifetime says
  how many times a request's whole life fits in the part (Little's law needs several).
- trends (batch means): W is cut into k equal slices; per slice, the time-averaged number
  of requests in flight (from their intended time, so requests queued at the client
  count) and the mean TTFT from intended (a first-token timeout counts as its end, a lower
  bound). A least-squares line through the k slice values gives the rise across W and,
  from the scatter of the slices about the line, its one-sided confidence bound (Student
  t with k − 2 degrees of freedom). The slices are long (several lifetimes), so their
  values are close to independent and the bound is honest. A series is *rising* when its
  rise exceeds both that bound and one request's worth of queue: 1 request in flight, or
  1 / completed rate of wait (what one more request queued ahead adds). Below that
  floor a rise is no queue at all, however well measured (constant arrivals and
  deterministic service make the noise, and so the bound, nearly zero).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

import numpy as np
import polars as pl

from loadgen.measures import TTFT
from loadgen.results.records import Outcome
from loadgen.units import NS_PER_MS, NS_PER_S

SLICES = 10  # batch means: enough points for a line, each slice still several lifetimes
MIN_SLICES = 5  # fewer cannot bound a slope (k − 2 = 3 degrees of freedom)
MIN_PER_SLICE = 5  # requests a slice needs for its TTFT mean
CONFIDENCE = 0.999  # one-sided: a steady step is called rising about once in 1,000
NORMAL_Z = statistics.NormalDist().inv_cdf(CONFIDENCE)
SAMPLES = 2000  # instants at which the in-flight count's spread is taken
TIMEOUTS = (Outcome.TIMEOUT_FIRST_TOKEN, Outcome.TIMEOUT_TOTAL, Outcome.TIMEOUT_STALL)


@dataclass(frozen=True, slots=True, kw_only=True)
class Trend:
    """One queueing series across the judged part: its fitted rise and what noise allows."""

    series: str  # "in_flight" (requests) or "ttft_ms" (ms from intended)
    slices: int
    start: float  # the fitted line at the start of the judged part
    rise: float  # the fitted change across the judged part (slope × W)
    allowance: float  # one-sided CONFIDENCE bound of the rise from the slices' scatter
    floor: float  # one request's worth: 1 in flight, or 1000 / completed rate ms

    @property
    def rising(self) -> bool:
        """True when the rise is beyond both the noise allowance and one request's worth."""
        return self.rise > max(self.allowance, self.floor)


@dataclass(frozen=True, slots=True, kw_only=True)
class Steadiness:
    """The steady-state evidence of one step's judged part."""

    window_s: float
    offered: int  # requests intended in the judged part
    completed: int  # requests (any outcome) that ended in it
    offered_per_s: float
    completed_per_s: float  # any outcome
    served_per_s: float  # ok only: what an over-saturated server can actually serve
    lifetime_s: float | None  # mean intended → end of the judged requests that ended
    mean_in_flight: float
    in_flight_sd: float  # time-weighted standard deviation of the in-flight count
    trends: tuple[Trend, ...]

    @property
    def completed_share(self) -> float | None:
        """Completed over offered rate (None when nothing was offered)."""
        return self.completed_per_s / self.offered_per_s if self.offered_per_s > 0 else None

    @property
    def lifetimes(self) -> float | None:
        """How many mean lifetimes the judged part lasted."""
        if self.lifetime_s is None or self.lifetime_s <= 0:
            return None
        return self.window_s / self.lifetime_s

    @property
    def shortfall_allowance(self) -> float:
        """Requests the completions may fall short of the offered by noise: z·√2·σ_L."""
        return NORMAL_Z * math.sqrt(2) * self.in_flight_sd

    def rising(self) -> tuple[Trend, ...]:
        """The series that rose beyond noise."""
        return tuple(t for t in self.trends if t.rising)


def judged_window(frame: pl.DataFrame, warmup_s: float | None) -> tuple[int, int]:
    """[cut, last intended] in ns: the warm-up is `warmup_s`, else 10 % of the sending period."""
    first = int(frame["intended_ns"].min())  # type: ignore[arg-type]  # non-empty ints
    last = int(frame["intended_ns"].max())  # type: ignore[arg-type]
    if warmup_s is None:
        return first + (last - first) // 10, last
    return min(first + round(warmup_s * NS_PER_S), last), last


def steadiness(frame: pl.DataFrame, cut_ns: int, end_ns: int) -> Steadiness:
    """The evidence over [cut_ns, end_ns] (see the module docstring); needs a non-empty frame."""
    intended = frame["intended_ns"].to_numpy().astype(np.float64)
    ended = frame["end_ns"].fill_null(math.inf).to_numpy().astype(np.float64)
    window_ns = max(end_ns - cut_ns, 1)
    hi_ns = cut_ns + window_ns
    window_s = window_ns / NS_PER_S
    judged = (intended >= cut_ns) & (intended <= end_ns)
    offered = int(judged.sum())
    in_part = (ended > cut_ns) & (ended <= end_ns)
    completed = int(in_part.sum())
    served = int((in_part & (frame["outcome"] == "ok").to_numpy()).sum())
    lives = (ended - intended)[judged & np.isfinite(ended)]
    completed_per_s = completed / window_s
    slices = _slice_count(offered)
    edges = np.linspace(cut_ns, end_ns, slices + 1)
    trends = []
    if slices:
        trends.append(_fit("in_flight", in_flight_means(intended, ended, edges), edges, 1.0))
        ttft_floor = 1000 / completed_per_s if completed_per_s > 0 else math.inf
        trends.append(_fit(TTFT.column, ttft_means(frame, edges), edges, ttft_floor))
    return Steadiness(
        window_s=window_s,
        offered=offered,
        completed=completed,
        offered_per_s=offered / window_s,
        completed_per_s=completed_per_s,
        served_per_s=served / window_s,
        lifetime_s=float(lives.mean()) / NS_PER_S if lives.size else None,
        mean_in_flight=float(in_flight_means(intended, ended, np.array([cut_ns, hi_ns]))[0]),
        in_flight_sd=in_flight_spread(intended, ended, cut_ns, hi_ns),
        trends=tuple(t for t in trends if t is not None),
    )


def _slice_count(requests: int) -> int:
    """SLICES, fewer when the part holds too few requests for them; 0 below MIN_SLICES."""
    slices = min(SLICES, requests // MIN_PER_SLICE)
    return slices if slices >= MIN_SLICES else 0


def in_flight_means(intended: np.ndarray, ended: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per slice [edges[j], edges[j+1]): the time-averaged count of requests in flight
    (intended <= t < end; a request with no end is in flight to the end)."""
    lo, hi = edges[:-1], edges[1:]
    overlap = np.minimum(ended[:, None], hi[None, :]) - np.maximum(intended[:, None], lo[None, :])
    return np.clip(overlap, 0, None).sum(axis=0) / (hi - lo)  # type: ignore[no-any-return]


def in_flight_spread(intended: np.ndarray, ended: np.ndarray, lo: float, hi: float) -> float:
    """The standard deviation of the in-flight count about its least-squares line over
    [lo, hi), sampled at SAMPLES evenly spaced instants: L(t) = #(intended <= t) − #(end <= t).
    About the line, so that a queue growing steadily is not mistaken for noise."""
    at = np.linspace(lo, hi, SAMPLES, endpoint=False)
    count = np.searchsorted(np.sort(intended), at, side="right")
    count -= np.searchsorted(np.sort(ended), at, side="right")
    slope, intercept = np.polyfit(at - lo, count.astype(np.float64), 1)
    return float((count - (slope * (at - lo) + intercept)).std())


def ttft_means(frame: pl.DataFrame, edges: np.ndarray) -> np.ndarray:
    """Per slice: mean ms from intended to the first token of the requests intended in it
    (a timeout without one counts at its end: a lower bound); NaN when too few."""
    waits = frame.select(
        pl.col("intended_ns"),
        pl.when(pl.col("first_token_ns").is_not_null())
        .then(pl.col("first_token_ns") - pl.col("intended_ns"))
        .when(pl.col("outcome").is_in(TIMEOUTS))
        .then(pl.col("end_ns") - pl.col("intended_ns"))
        .alias("wait_ns"),
    ).drop_nulls()
    at = waits["intended_ns"].to_numpy()
    wait_ms = waits["wait_ns"].to_numpy() / NS_PER_MS
    index = np.searchsorted(edges, at, side="right") - 1
    means = np.full(len(edges) - 1, math.nan)
    for j in range(len(edges) - 1):
        mine = wait_ms[index == j]
        if mine.size >= MIN_PER_SLICE:
            means[j] = mine.mean()
    return means


def _fit(series: str, values: np.ndarray, edges: np.ndarray, floor: float) -> Trend | None:
    """The least-squares line through the slice values (at slice midpoints), as a Trend."""
    mids = (edges[:-1] + edges[1:]) / 2
    keep = np.isfinite(values)
    if keep.sum() < MIN_SLICES:
        return None
    x = (mids[keep] - edges[0]) / NS_PER_S
    y = values[keep]
    slope, intercept = statistics.linear_regression(x.tolist(), y.tolist())
    residuals = y - (slope * x + intercept)
    dof = len(x) - 2
    spread = float(np.sqrt((residuals**2).sum() / dof / ((x - x.mean()) ** 2).sum()))
    window = float(edges[-1] - edges[0]) / NS_PER_S
    return Trend(
        series=series,
        slices=len(x),
        start=float(intercept),
        rise=float(slope * window),
        allowance=float(t_quantile(CONFIDENCE, dof) * spread * window),
        floor=float(floor),
    )


@functools.cache
def t_quantile(p: float, dof: int) -> float:
    """The p-quantile of Student's t with `dof` degrees of freedom (p in (0.5, 1)).

    Bisection on the CDF, itself Simpson's rule over the density from 0 (no SciPy for one
    number per step; accurate to ~1e-6 for the dof and p used here).
    """
    if not (0.5 < p < 1 and dof >= 1):
        raise ValueError(f"need 0.5 < p < 1 and dof >= 1 (got {p}, {dof})")
    norm = math.gamma((dof + 1) / 2) / (math.sqrt(dof * math.pi) * math.gamma(dof / 2))

    def cdf(t: float) -> float:
        n = 2000  # even: Simpson's rule
        h = t / n
        total = _density(0, dof) + _density(t, dof)
        total += sum((4 if i % 2 else 2) * _density(i * h, dof) for i in range(1, n))
        return 0.5 + norm * total * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _density(t: float, dof: int) -> float:
    return float((1 + t * t / dof) ** (-(dof + 1) / 2))
