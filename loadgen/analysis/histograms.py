"""Latency histograms: mergeable, compact summaries for live progress and time windows.

Sits beside `analysis.metrics`: the exact metrics read the records frame; a `LatencyHistogram`
is what the runner updates per record for the progress line, and what per-minute windows
and shards merge. A thin wrapper over HdrHistogram (`hdrh`): microseconds, 3 significant
digits, range 1 µs to 1 hour. Values are rounded to whole µs, so the relative error is
< 0.1 % from 1 ms up; below 1 ms the 1 µs resolution dominates.

Nothing is dropped silently (as wrk2 taught): a value above the range (a stuck request,
or +inf for a failure) is counted as `overflow` and ranks as +inf in percentiles, so an
overflow can never improve a percentile. Percentiles use the same nearest-rank definition
as `analysis.metrics` (rank ceil(p/100 * n)); the value reported for a rank is the highest value
equivalent to its bucket, so a histogram percentile never understates the exact one.

`bounds_ms` gives a percentile's one-sided order-statistic bounds (`analysis.confidence`)
from the counts alone: the ranks are exact, the values at bucket resolution, each widened
to its bucket's edge (the lower bound to the bucket's lowest value, the upper to its
highest), so the bounds never claim more than the exact ones would.

Overflows are stored inside the HdrHistogram itself, at a sentinel value above the range
(the tracked range extends to 2 hours for this), so `encode()` is plain HdrHistogram
base64 that other HdrHistogram tools can read, and `decode` recovers the overflow count.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import Self

import numpy as np
from hdrh.histogram import HdrHistogram

from loadgen.analysis.confidence import one_sided_ranks
from loadgen.percentiles import nearest_rank

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # 1 hour
SIGNIFICANT_DIGITS = 3
_OVERFLOW_US = 2 * HIGHEST_US  # where overflows are kept; never a real measurement
_TRACKED_US = _OVERFLOW_US  # the HdrHistogram's own highest trackable value


class LatencyHistogram:
    """Latencies in µs with 3 significant digits from 1 µs to 1 hour, plus an overflow count.

    Values below 1 µs are recorded as 0 µs (the resolution is 1 µs); negative or NaN
    values are a bug upstream and raise ValueError.
    """

    __slots__ = ("_hist",)

    def __init__(self) -> None:
        self._hist = HdrHistogram(LOWEST_US, _TRACKED_US, SIGNIFICANT_DIGITS)

    def record_ms(self, value: float) -> None:
        """Record one latency in ms (+inf, or anything above 1 hour, counts as overflow)."""
        self._record_us(value * 1000.0)

    def record_ns(self, value: int | float) -> None:
        """Record one latency in ns."""
        self._record_us(value / 1000.0)

    def _record_us(self, value_us: float) -> None:
        if math.isnan(value_us) or value_us < 0:
            raise ValueError(f"a latency must be >= 0 (got {value_us} µs)")
        value = _OVERFLOW_US if value_us > HIGHEST_US else round(value_us)
        self._hist.record_value(value)

    @property
    def count(self) -> int:
        """Every value recorded, overflows included."""
        return int(self._hist.get_total_count())

    @property
    def overflow(self) -> int:
        """How many values were above the range (1 hour) or +inf."""
        return int(self._hist.get_count_at_value(_OVERFLOW_US))

    def percentile_ms(self, p: float) -> float:
        """The nearest-rank p-th percentile in ms: +inf if it falls on an overflow, NaN if empty.

        Walks the buckets in value order to the bucket holding rank ceil(p/100 * count).
        """
        total = self.count
        if total == 0:
            return math.nan
        rank = nearest_rank(p, total)
        if rank > total - self.overflow:
            return math.inf
        hist = self._hist
        cumulative = list(accumulate(hist.counts[: hist.counts_len]))
        index = bisect_left(cumulative, rank)
        return int(hist.get_highest_equivalent_value(hist.get_value_from_index(index))) / 1000.0

    def merge(self, other: LatencyHistogram) -> None:
        """Add every value of `other` (overflows included) to this histogram."""
        self._hist.add(other._hist)

    def encode(self) -> str:
        """HdrHistogram's compressed base64 form (V2), overflows at a sentinel above 1 hour."""
        encoded: bytes | str = self._hist.encode()
        return encoded.decode("ascii") if isinstance(encoded, bytes) else encoded

    @classmethod
    def decode(cls, encoded: str) -> Self:
        """The histogram `encode` produced (from this class or a merge of them)."""
        histogram = cls()
        histogram._hist.decode_and_add(encoded)
        return histogram

    def record_counts_us(self, values_us: Sequence[int], counts: Sequence[int]) -> None:
        """Record each value (whole µs, 0 to 1 hour) `count` times: one call per bucket."""
        record = self._hist.record_value
        for value, count in zip(values_us, counts, strict=True):
            record(value, count)

    def add_encoded(self, encoded: str) -> None:
        """Merge an encoded histogram without building a `LatencyHistogram` for it first."""
        self._hist.decode_and_add(encoded)

    def record_overflow(self, count: int) -> None:
        """Record `count` values above the range (or +inf): they rank worst."""
        if count:
            self._hist.record_value(_OVERFLOW_US, count)

    def percentiles_ms(self, ps: Sequence[float], *, failures: int = 0) -> list[float]:
        """Nearest-rank percentiles in ms with `failures` more values ranked worst (+inf).

        Equal to `percentile_ms` for each p when failures = 0, from one cumulative sum:
        +inf where the rank falls on an overflow or a failure, NaN when empty.
        """
        total = self.count + failures
        if total == 0:
            return [math.nan for _ in ps]
        finite = self.count - self.overflow
        hist = self._hist
        cumulative = np.cumsum(np.ctypeslib.as_array(hist.counts)[: hist.counts_len])
        values = []
        for p in ps:
            rank = nearest_rank(p, total)
            if rank > finite:
                values.append(math.inf)
                continue
            index = int(np.searchsorted(cumulative, rank, side="left"))
            top = hist.get_highest_equivalent_value(hist.get_value_from_index(index))
            values.append(int(top) / 1000.0)
        return values

    def bounds_ms(
        self, ps: Sequence[float], level: float, *, failures: int = 0
    ) -> list[tuple[float | None, float | None]]:
        """Per p, the one-sided (low, high) bounds at `level` of the nearest-rank percentile
        with `failures` ranked worst, in ms: None where a bound is open (too few values to
        reach it), +inf where it falls on an overflow or a failure; (None, None) when empty.
        Ranks from `one_sided_ranks` over count + failures; a value is its bucket's lowest
        (for `low`) or highest (for `high`) equivalent value."""
        total = self.count + failures
        if total == 0:
            return [(None, None) for _ in ps]
        finite = self.count - self.overflow
        hist = self._hist
        cumulative = np.cumsum(np.ctypeslib.as_array(hist.counts)[: hist.counts_len])

        def at(rank: int, *, top: bool) -> float:
            if rank > finite:
                return math.inf
            value = hist.get_value_from_index(int(np.searchsorted(cumulative, rank, side="left")))
            edge = hist.get_highest_equivalent_value if top else hist.get_lowest_equivalent_value
            return int(edge(value)) / 1000.0

        bounds: list[tuple[float | None, float | None]] = []
        for p in ps:
            if p >= 100.0:  # the maximum bounds p100 from below only
                bounds.append((at(total, top=False), None))
                continue
            lower, upper = one_sided_ranks(total, p / 100.0, level)
            bounds.append((at(lower, top=False) if lower >= 1 else None,
                           at(upper, top=True) if upper <= total else None))  # fmt: skip
        return bounds
