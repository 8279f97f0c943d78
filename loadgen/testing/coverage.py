"""Known answers for the verdict's confidence: many simulated runs drawn from latency
distributions whose percentiles are known in closed form, judged by `analysis.confidence`.

For each (distribution, sample size, percentile): how often the one-sided bounds hold the
true percentile (coverage: at least the stated level, up to binomial error over the runs),
and how often a verdict is wrong: MET for a target just below the truth, MISSED for one
just above (at most 1 - level). The point-estimate rule is judged beside it, to show the
test can fail: at small samples its MET is wrong about half the time or more.

ITL (`itl_cell`): gaps come in requests, and a request's gaps are alike. In the
slow-request model one request in five is slow, every one of its 30 gaps uniform on 50-100
ms, the others' on 0-50 ms, so the pooled p90 is exactly 75 ms; the bounds that count
requests (`judge_clustered`) are set beside bounds that take the gaps as independent.

Used by tests/test_confidence.py and benchmarks/verdict_coverage.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from loadgen.analysis.confidence import MET, judge_clustered, judge_percentile, one_sided_ranks
from loadgen.percentiles import nearest_rank

Draw = Callable[[np.random.Generator, tuple[int, int]], np.ndarray]
Quantile = Callable[[float], float]


@dataclass(frozen=True)
class Latency:
    """A latency distribution (ms): how to draw it and its exact quantile function."""

    name: str
    draw: Draw
    quantile: Quantile


# exponential (mean 200 ms), lognormal (median 150 ms, sigma 0.6: a heavy right tail),
# uniform 100..300 ms (bounded), and a 90/10 mixture whose tail is another mode.
LATENCIES = (
    Latency("exponential", lambda g, s: g.exponential(200.0, s),
            lambda q: -200.0 * math.log1p(-q)),
    Latency("lognormal", lambda g, s: g.lognormal(math.log(150.0), 0.6, s),
            lambda q: 150.0 * math.exp(0.6 * NormalDist().inv_cdf(q))),
    Latency("uniform", lambda g, s: g.uniform(100.0, 300.0, s),
            lambda q: 100.0 + 200.0 * q),
)  # fmt: skip


@dataclass(frozen=True)
class Cell:
    """One row of the table: `runs` simulated runs of `n` requests, percentile `p`."""

    distribution: str
    n: int
    p: float
    level: float
    runs: int
    upper_covers: float  # share of runs whose upper bound >= the true percentile (closed)
    lower_covers: float  # share of runs whose lower bound <= the true percentile (closed)
    upper_closed: bool  # n is enough to bound the percentile from above
    lower_closed: bool
    met_wrong: float  # MET for a target 1 % below the truth (interval rule)
    missed_wrong: float  # MISSED for a target 1 % above the truth (interval rule)
    point_met_wrong: float  # MET for the same target by the point estimate

    def allowance(self) -> float:
        """Binomial error of a share near 1 - level over `runs` runs: 3 standard errors."""
        return 3.0 * math.sqrt(self.level * (1.0 - self.level) / self.runs)


def cell(latency: Latency, n: int, p: float, level: float, runs: int, seed: int) -> Cell:
    """Simulate `runs` runs of `n` requests and judge each (vectorised: one sort per run)."""
    generator = np.random.default_rng(seed)
    samples = np.sort(latency.draw(generator, (runs, n)), axis=1)
    truth = latency.quantile(p / 100.0)
    lower, upper = one_sided_ranks(n, p / 100.0, level)
    upper_closed, lower_closed = upper <= n, lower >= 1
    high = samples[:, upper - 1] if upper_closed else np.full(runs, np.inf)
    low = samples[:, lower - 1] if lower_closed else np.full(runs, -np.inf)
    point = samples[:, nearest_rank(p, n) - 1]
    below, above = truth * 0.99, truth * 1.01  # targets the truth misses, and meets
    return Cell(
        distribution=latency.name, n=n, p=p, level=level, runs=runs,
        upper_covers=float(np.mean(high >= truth)), lower_covers=float(np.mean(low <= truth)),
        upper_closed=upper_closed, lower_closed=lower_closed,
        met_wrong=float(np.mean(high <= below)), missed_wrong=float(np.mean(low > above)),
        point_met_wrong=float(np.mean(point <= below)),
    )  # fmt: skip


def table(
    sizes: tuple[int, ...] = (10, 40, 100, 300, 1000),
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0),
    level: float = 0.95,
    runs: int = 2000,
    seed: int = 0,
) -> list[Cell]:
    """Every distribution × size × percentile, each cell from its own seed."""
    cells = []
    for i, latency in enumerate(LATENCIES):
        for j, n in enumerate(sizes):
            for k, p in enumerate(percentiles):
                cells.append(cell(latency, n, p, level, runs, seed + 100 * i + 10 * j + k))
    return cells


ITL_GAPS = 30  # gaps per request in the slow-request model
ITL_TRUTH_MS = 75.0  # its pooled p90: 0.8 + 0.2 · (75 − 50) / 50 = 0.9


@dataclass(frozen=True)
class ItlCell:
    """`runs` runs of `n` requests of the slow-request model, judged at p90 by both rules:
    the share of runs whose upper bound holds the truth, and whose MET for a target 1 %
    under it is wrong."""

    n: int
    runs: int
    level: float
    clustered_covers: float
    clustered_met_wrong: float
    pooled_covers: float
    pooled_met_wrong: float


def slow_request_runs(n: int, runs: int, seed: int) -> np.ndarray:
    """`runs` rows of the sorted gaps of n requests of the slow-request model."""
    generator = np.random.default_rng(seed)
    slow = generator.random((runs, n, 1)) < 0.2
    gaps = np.where(slow, 50.0, 0.0) + generator.uniform(0.0, 50.0, (runs, n, ITL_GAPS))
    return np.sort(gaps.reshape(runs, n * ITL_GAPS), axis=1)


def itl_cell(n: int, runs: int = 2000, level: float = 0.95, seed: int = 0) -> ItlCell:
    """Both rules over the same simulated runs (see the module doc)."""
    samples = slow_request_runs(n, runs, seed)
    target = ITL_TRUTH_MS * 0.99
    grouped = [judge_clustered(s, n, 90.0, target, level) for s in samples]
    pooled = [judge_percentile(s, 90.0, target, level) for s in samples]

    def covers(judged: list[Any]) -> float:
        return float(np.mean([j.high is not None and j.high >= ITL_TRUTH_MS for j in judged]))

    def met(judged: list[Any]) -> float:
        return float(np.mean([j.verdict == MET for j in judged]))

    return ItlCell(n=n, runs=runs, level=level, clustered_covers=covers(grouped),
                   clustered_met_wrong=met(grouped), pooled_covers=covers(pooled),
                   pooled_met_wrong=met(pooled))  # fmt: skip
