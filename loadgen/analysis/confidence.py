"""Confidence from a sample: distribution-free bounds on a percentile, score intervals on a
share, and the verdict a target gets from them.

Every verdict of loadgen is a measurement too: from n requests, the p-th percentile of the
population they came from is known only to an interval, and a gate that acts on the point
estimate acts on noise whenever the target lies inside it (the p99 of 40 requests is their
maximum; the true p99 lies above it with probability 0.99^40 = 67 %).

Percentiles (order statistics, no assumption about the distribution): the count K of
values below the true q-quantile xi_q is Binomial(n, q), so for the sorted sample x_(1..n),

- P(x_(u) >= xi_q) = P(K <= u - 1) = F(u - 1): the smallest u with F(u - 1) >= level is the
  one-sided upper bound at `level`; it exists (u <= n) once 1 - q^n >= level, i.e.
  n >= log(1 - level) / log(q): 299 requests for p99 at 95 %, 29 for p90, 5 for p50
  (`samples_needed`);
- P(x_(l) <= xi_q) = P(K >= l) = 1 - F(l - 1): the largest l with F(l - 1) <= 1 - level is
  the one-sided lower bound; it exists once (1 - q)^n <= 1 - level.

F is the exact binomial CDF (`binomial_cdf`). Failures rank worst (+inf), so they sit at the
top of the sample and move both bounds up, as they move the point estimate.

The verdict on "the p-th percentile <= target" at `level` (`judge_percentile`):

- MET when the upper bound is closed and <= target: wrong (the truth above the target)
  with probability <= 1 - level;
- MISSED when the lower bound is closed and > target: wrong with probability <= 1 - level;
- INCONCLUSIVE otherwise: the target lies between the bounds, or the sample is too small
  to close the upper bound (`needed` says how many requests would).

The two bounds together are a two-sided interval at 2 * level - 1 (90 % for 95 % bounds).
Shares (attainment) are judged with exact (Clopper-Pearson) one-sided bounds the same way
(`share_bounds`, `judge_share`); `compare` keeps Wilson score intervals for its changes.
Student's t (`t_quantile`) bounds a mean from few values: the lag trend's slope and the
between-run interval of repeated runs.
The intervals assume independent requests; queueing correlates neighbours, so the true
uncertainty of a loaded server is somewhat wider.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from loadgen.percentiles import nearest_rank
from loadgen.results.summary import INCONCLUSIVE as INCONCLUSIVE  # the verdicts, as stored
from loadgen.results.summary import MET as MET
from loadgen.results.summary import MISSED as MISSED
from loadgen.workload.model import DEFAULT_CONFIDENCE as DEFAULT_CONFIDENCE  # beside the SLO

Values = npt.NDArray[np.float64]

INTERVAL, POINT = "interval", "point"
RULES = (INTERVAL, POINT)  # how a check is judged: its bounds, or its point estimate


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A point estimate and its confidence interval [low, high].

    `value` is None when there is nothing to estimate (n = 0) and +inf when a percentile
    falls on a failed request. An open side (`low_open`/`high_open`) needs an order
    statistic beyond the sample; it holds the sample's min/max. `ranks` are a
    percentile's 1-based (l, u), 0 or n + 1 where open. `n`: the values (percentiles),
    requests (shares) or requests counted (goodput) behind the estimate.
    """

    value: float | None
    low: float | None = None
    high: float | None = None
    n: int = 0
    low_open: bool = False
    high_open: bool = False
    ranks: tuple[int, int] | None = None


NO_VALUES = Estimate(value=None)


def binomial_cdf(n: int, q: float) -> tuple[int, npt.NDArray[np.float64]]:
    """(k0, F) with F[i] = P(K <= k0 + i) for K ~ Binomial(n, q), over the ks that carry mass.

    Exact: log pmf(k0) from `math.lgamma`, then the ratio pmf(k+1)/pmf(k) =
    (n-k)/(k+1) * q/(1-q), over mean ± (12 sd + 10); the mass outside is < 1e-30.
    """
    if not 0.0 < q < 1.0 or n < 1:
        raise ValueError(f"need n >= 1 and 0 < q < 1 (got n={n}, q={q})")
    spread = 12.0 * math.sqrt(n * q * (1.0 - q)) + 10.0
    lo, hi = max(0, math.floor(n * q - spread)), min(n, math.ceil(n * q + spread))
    first = (
        math.lgamma(n + 1)
        - math.lgamma(lo + 1)
        - math.lgamma(n - lo + 1)
        + lo * math.log(q)
        + (n - lo) * math.log1p(-q)
    )
    ks = np.arange(lo, hi, dtype=np.float64)
    steps = np.log(n - ks) - np.log(ks + 1) + math.log(q) - math.log1p(-q)
    log_pmf = np.concatenate(([first], first + np.cumsum(steps)))
    pmf = np.exp(log_pmf - log_pmf.max())
    cdf = np.cumsum(pmf)
    return lo, cdf / cdf[-1]


def order_statistic_ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """1-based ranks (l, u) with P(x_(l) <= xi_q <= x_(u)) >= confidence, equal tails.

    l = 0 or u = n + 1 when the interval reaches beyond the sample on that side.
    """
    half_alpha = (1.0 - confidence) / 2.0
    k0, cdf = binomial_cdf(n, q)
    below = int(np.searchsorted(cdf, half_alpha, side="right"))  # F(k) <= alpha/2 for these
    lower = k0 + below  # l - 1 = the largest k with F(k) <= alpha/2
    upper = k0 + int(np.searchsorted(cdf, 1.0 - half_alpha, side="left")) + 1
    return lower, min(upper, n + 1)


def min_samples(q: float, confidence: float) -> tuple[int, int]:
    """The smallest n at which a q-quantile's interval closes (below, above)."""
    log_half_alpha = math.log((1.0 - confidence) / 2.0)
    return (
        math.ceil(log_half_alpha / math.log1p(-q) - 1e-9),
        math.ceil(log_half_alpha / math.log(q) - 1e-9),
    )


def percentile_estimate(
    ordered: Values, p: float, confidence: float, *, failures: int = 0
) -> Estimate:
    """Nearest-rank percentile of sorted values plus `failures` ranked worst (+inf), with
    its order-statistic interval."""
    n = ordered.size + failures
    if n == 0:
        return NO_VALUES

    def at(rank: int) -> float:
        rank = min(max(rank, 1), n)
        return float(ordered[rank - 1]) if rank <= ordered.size else math.inf

    lower, upper = order_statistic_ranks(n, p / 100.0, confidence)
    return Estimate(
        value=at(nearest_rank(p, n)),
        low=at(lower),
        high=at(upper),
        n=n,
        low_open=lower < 1,
        high_open=upper > n,
        ranks=(lower, upper),
    )


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)


def wilson(successes: int, n: int, confidence: float) -> Estimate:
    """A share with its Wilson score interval."""
    if n == 0:
        return NO_VALUES
    z, share = _z(confidence), successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    return Estimate(value=share, low=max(0.0, centre - half), high=min(1.0, centre + half), n=n)


def poisson_rate(count: int, duration_s: float, confidence: float, scale: float = 1.0) -> Estimate:
    """count / duration (times `scale`) with the Poisson score interval
    (count + z²/2 ± z·sqrt(count + z²/4)) / duration."""
    if duration_s <= 0:
        return NO_VALUES
    z = _z(confidence)
    centre, half = count + z * z / 2, z * math.sqrt(count + z * z / 4)
    per_s = scale / duration_s
    return Estimate(
        value=count * per_s,
        low=max(0.0, centre - half) * per_s,
        high=(centre + half) * per_s,
        n=count,
    )


# --- one-sided bounds and verdicts ----------------------------------------------------------


def one_sided_ranks(n: int, q: float, level: float) -> tuple[int, int]:
    """1-based ranks (l, u): P(x_(l) <= xi_q) >= level and P(x_(u) >= xi_q) >= level.

    l = 0 or u = n + 1 when that bound reaches beyond the sample (open). The pair is the
    equal-tailed two-sided interval at 2 * level - 1 (`order_statistic_ranks`).
    """
    if not 0.5 < level < 1.0:
        raise ValueError(f"a confidence level must be in (0.5, 1) (got {level})")
    return order_statistic_ranks(n, q, 2.0 * level - 1.0)


def samples_needed(p: float, level: float) -> int | None:
    """The fewest values whose largest is an upper bound on the p-th percentile at `level`
    (1 - q^n >= level): 299 for p99 at 95 %, 29 for p90, 5 for p50. None for p100, which no
    sample bounds from above."""
    q = p / 100.0
    if q >= 1.0:
        return None
    return max(1, math.ceil(math.log1p(-level) / math.log(q) - 1e-9))


@dataclass(frozen=True, slots=True, kw_only=True)
class Judgement:
    """A target judged from a sample: the point estimate, its one-sided bounds at
    `confidence` (None: open, the sample too small to bound that side), the verdict, and
    `needed`, the sample size that would close the upper bound (None when it is closed)."""

    value: float | None
    low: float | None
    high: float | None
    verdict: str
    n: int
    confidence: float
    needed: int | None = None


def bounds_verdict(low: float | None, high: float | None, target: float) -> str:
    """MET when the upper bound is closed and meets `target`, MISSED when the lower bound
    is closed and misses it, else INCONCLUSIVE (see the module doc)."""
    if high is not None and high <= target:
        return MET
    if low is not None and low > target:
        return MISSED
    return INCONCLUSIVE


def judge_percentile(
    ordered: Values, p: float, target: float, level: float, *, failures: int = 0
) -> Judgement:
    """The verdict on "p-th percentile <= target" from sorted values plus `failures` ranked
    worst (+inf), with one-sided bounds at `level` (see the module doc)."""
    n = ordered.size + failures
    if n == 0:
        return Judgement(value=None, low=None, high=None, verdict=MISSED, n=0,
                         confidence=level, needed=samples_needed(p, level))  # fmt: skip

    def at(rank: int) -> float:
        return float(ordered[rank - 1]) if rank <= ordered.size else math.inf

    q = p / 100.0
    value = at(nearest_rank(p, n))
    low: float | None
    high: float | None
    if q >= 1.0:  # p100: no sample bounds the supremum from above; the maximum from below
        low, high = value, None
    else:
        lower, upper = one_sided_ranks(n, q, level)
        low = at(lower) if lower >= 1 else None
        high = at(upper) if upper <= n else None
    needed = samples_needed(p, level) if high is None else None
    return Judgement(value=value, low=low, high=high, verdict=bounds_verdict(low, high, target),
                     n=n, confidence=level, needed=needed)  # fmt: skip


def judge_clustered(
    ordered: Values, clusters: int, p: float, target: float, level: float, *, failures: int = 0
) -> Judgement:
    """The verdict on "the p-th percentile of the pooled values <= target" when the values
    come in `clusters` correlated groups (ITL: the gaps of one request), with `failures`
    groups that failed, each ranked worst as one group of average size.

    The bounds count groups, not values: the order-statistic ranks (l, u) of
    `one_sided_ranks` for n = clusters + failures, mapped onto the pooled sorted values at
    the same share of the way (rank u·w from the bottom for the upper bound, (l − 1)·w + 1
    for the lower, w = values per group). This is exact when a group's values are equal
    (perfect correlation: the pooled sample is each group's value w times) and
    conservative when they are not: a group's share of values above the target lies in
    [0, 1], so its variance is at most a single yes/no value's, and n groups carry at least
    the information of n independent values. With one value per group it is
    `judge_percentile`. The point estimate is the nearest rank of the pooled values with
    the failures' values (+inf) on top; `needed` counts groups (requests).
    """
    size = int(ordered.size)
    n = clusters + failures
    if n == 0 or (size == 0 and failures == 0):
        return Judgement(value=None, low=None, high=None, verdict=MISSED, n=0,
                         confidence=level, needed=samples_needed(p, level))  # fmt: skip
    if clusters == 0:  # only failures: every pooled value is the worst
        return judge_percentile(ordered[:0], p, target, level, failures=failures)
    weight = size / clusters
    total = size + failures * weight

    def at(rank: float) -> float:
        index = min(max(math.ceil(rank - 1e-9), 1), math.ceil(total - 1e-9))
        return float(ordered[index - 1]) if index <= size else math.inf

    q = p / 100.0
    value = at(q * total)
    low: float | None
    high: float | None
    if q >= 1.0:
        low, high = value, None
    else:
        lower, upper = one_sided_ranks(n, q, level)
        low = at(math.floor((lower - 1) * weight + 1e-9) + 1) if lower >= 1 else None
        high = at(upper * weight) if upper <= n else None
    needed = samples_needed(p, level) if high is None else None
    return Judgement(value=value, low=low, high=high, verdict=bounds_verdict(low, high, target),
                     n=n, confidence=level, needed=needed)  # fmt: skip


@functools.lru_cache(maxsize=64)
def _log_factorials(n: int) -> npt.NDArray[np.float64]:
    """log(k!) for k = 0..n."""
    return np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))))


def _at_most(k: int, n: int, share: float) -> float:
    """P(K <= k) for K ~ Binomial(n, share), exactly (log-pmf summed in log space)."""
    if k < 0:
        return 0.0
    if k >= n or share <= 0.0:
        return 1.0
    if share >= 1.0:
        return 0.0
    lf = _log_factorials(n)
    ks = np.arange(0, k + 1)
    log_pmf = lf[n] - lf[ks] - lf[n - ks] + ks * math.log(share) + (n - ks) * math.log1p(-share)
    top = float(log_pmf.max())
    return float(min(1.0, math.exp(top) * np.exp(log_pmf - top).sum()))


def share_bounds(successes: int, n: int, level: float) -> tuple[float, float]:
    """Exact (Clopper-Pearson) one-sided bounds (low, high) on a share at `level` each: low
    is the share under which `successes` or more would come up with probability 1 - level,
    high the one over which `successes` or fewer would. Exact rather than Wilson's score
    interval, whose upper bound covers less than its level near 1 (0.92 for a 0.99 share
    from 100 requests at 95 %): a verdict must not be wrong more often than it says."""
    if n == 0:
        return 0.0, 1.0
    alpha = 1.0 - level

    def solve(f: Callable[[float], float]) -> float:  # f rises from < 0 to > 0 on [0, 1]
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
        return (lo + hi) / 2.0

    low = 0.0 if successes == 0 else solve(lambda s: (1.0 - _at_most(successes - 1, n, s)) - alpha)
    high = 1.0 if successes == n else solve(lambda s: alpha - _at_most(successes, n, s))
    return low, high


def judge_share(successes: int, n: int, at_least: float, level: float) -> Judgement:
    """The verdict on "the share of successes >= at_least": MET when its lower bound at
    `level` reaches it, MISSED when its upper bound falls short, else INCONCLUSIVE."""
    if n == 0:
        return Judgement(value=None, low=None, high=None, verdict=MISSED, n=0,
                         confidence=level)  # fmt: skip
    low, high = share_bounds(successes, n, level)
    verdict = MET if low >= at_least else MISSED if high < at_least else INCONCLUSIVE
    needed = None
    if verdict == INCONCLUSIVE and successes == n and at_least < 1.0:
        needed = max(n + 1, math.ceil(math.log1p(-level) / math.log(at_least) - 1e-9))
    return Judgement(value=successes / n, low=low, high=high, verdict=verdict, n=n,
                     confidence=level, needed=needed)  # fmt: skip


def point_verdict(value: float | None, target: float) -> str:
    """The point-estimate rule (`--verdict point`): met when the estimate meets the target."""
    return MET if value is not None and value <= target else MISSED


def worst(verdicts: list[str]) -> str:
    """Several checks' verdict: missed if any missed, else inconclusive if any is, else met."""
    if MISSED in verdicts:
        return MISSED
    return INCONCLUSIVE if INCONCLUSIVE in verdicts else MET


# --- Student's t --------------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return result


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), regularized."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))  # fmt: skip
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (bisection on `t_cdf`): 4.303 for p 0.975 at df 2."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"need 0 < p < 1 and df > 0 (got p={p}, df={df})")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0
