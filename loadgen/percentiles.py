"""The one percentile convention of loadgen: nearest rank.

The p-th percentile of n values is the value at 1-based rank ceil(p/100 * n) of the sorted
values (p = 0 and p = 100 are the minimum and the maximum). It never interpolates, so
every percentile loadgen reports is a value that was really observed, and the same
definition serves the summary (`analysis.metrics`), the mergeable histograms, time and
rolling windows, comparisons, plots, the capacity planner's fits and trace statistics.
Like `errors`, a module every package may use: it imports nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction


def nearest_rank(percentile: float, n: int) -> int:
    """The 1-based rank ceil(percentile/100 * n), clamped to [1, n], for n >= 1.

    Computed with exact fractions, so float noise (0.29 * 100 = 28.999...) cannot move a
    rank.
    """
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"percentile must be in [0, 100] (got {percentile})")
    if n < 1:
        raise ValueError(f"a percentile needs at least one value (got n={n})")
    rank = math.ceil(Fraction(str(percentile)) * n / 100)
    return min(max(rank, 1), n)
