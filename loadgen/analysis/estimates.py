"""Serving parameters read off measured runs' records, for `loadgen plan`.

`estimate` reads, from ok requests, the prefill rate (a lower-envelope fit of TTFT against
prompt tokens), the prefill-free decode step (the lower envelope of the inter-token gaps,
`decode_floor`), the service CV and the prompt and output lengths: a `Measured`, which
`loadgen.studies.planner` layers under the flags. Pure functions of records frames.

Every percentile read off records here (the envelope fits' cuts, the decode floor's lower
tail, TPOT p50, prompt and output token p50 and max, the decoding batch) is nearest rank
(`loadgen.percentiles`): an observed value, never an interpolation. The decode floor's
centre is a location estimate, the midpoint median (`_location`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import polars as pl

from loadgen.analysis.metrics import derive, percentiles
from loadgen.analysis.planning import PlanInputs
from loadgen.measures import TPOT, TTFT_FROM_SEND
from loadgen.percentiles import nearest_rank
from loadgen.results.records import Outcome

ENVELOPE_PERCENTILE = 20.0  # lower-envelope fits keep points at or below this percentile
ENVELOPE_ROUNDS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """Parameters read off ok requests' records; None when the records cannot tell, and then
    `unmeasured` says why (by PlanInputs field)."""

    requests: int
    prefill_tokens_per_s: float | None = None
    ttft_overhead_ms: float | None = None  # the fit's intercept: TTFT from send at 0 tokens
    decode_step_ms: float | None = None  # prefill-free step (see `decode_source`)
    decode_source: str | None = None  # how decode_step_ms was measured
    decode_batch: float | None = None  # the batch (sequences decoding) it was measured at
    decode_steps_by_batch: tuple[tuple[int, float], ...] = ()  # (batch, floor ms) measured
    tpot_p50_ms: float | None = None  # median TPOT: prefill chunks of others included
    decode_concurrency: float | None = None  # mean requests in flight (Little's law)
    service_cv: float | None = None  # CV of E2E from send
    prompt_tokens: float | None = None  # p50
    long_prompt_tokens: float | None = None  # max
    output_tokens: float | None = None  # mean: Little's law needs E[T_hold]
    output_tokens_p50: float | None = None
    output_tokens_max: float | None = None
    unmeasured: tuple[tuple[str, str], ...] = ()  # (PlanInputs field, why it is None)

    def as_inputs(self) -> dict[str, float | None]:
        """The fields that are also PlanInputs fields."""
        names = {f.name for f in fields(PlanInputs)}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in names}


def estimate(frames: Sequence[pl.DataFrame], class_name: str | None = None) -> Measured:
    """Estimate serving parameters from records frames (one per run), optionally one class.

    Prefill rate: slope of a lower-envelope fit of TTFT from send against prompt tokens
    (`lower_envelope_fit`), so queueing, which only ever adds time, is cut away; rate =
    1000 / slope (ms per token). Decode step: the lower envelope of ITL (`decode_floor`):
    a step that also prefills someone's chunk is longer, so the floor of the gaps is the
    decode step alone, taken at the batch the run mostly decoded at. Median TPOT (prefill
    chunks included) is kept beside it. Service CV: pstdev / mean of E2E from send. Prompt
    tokens: p50 and max (server-reported, else planned); output tokens: mean (with p50 and
    max for display).
    """
    ok = [_ok_rows(f, class_name) for f in frames]
    rows = pl.concat(ok) if ok else pl.DataFrame()
    if rows.height == 0:
        return Measured(requests=0)
    prompt = rows.get_column("prompt").cast(pl.Float64)
    fit = _prefill_fit(rows)
    tpot = rows.get_column(TPOT.column).drop_nulls()
    e2e = rows.get_column("e2e_from_send_ms").drop_nulls().to_list()
    out = rows.get_column("output_tokens").cast(pl.Float64)
    busy, span = (sum(t) for t in zip(*(_busy_span(f, class_name) for f in frames), strict=True))
    floor = decode_floor(frames, class_name)
    unmeasured = [("prefill_tokens_per_s", why) for why in [_prefill_why(prompt, fit)] if why]
    if floor is None:
        unmeasured.append(("decode_step_ms", "no ok request streamed two chunks or more"))
    return Measured(
        requests=rows.height,
        prefill_tokens_per_s=1000 / fit[0] if fit and fit[0] > 0 else None,
        ttft_overhead_ms=fit[1] if fit and fit[0] > 0 else None,
        decode_step_ms=floor.step_ms if floor else None,
        decode_source=floor.source if floor else None,
        decode_batch=floor.batch if floor else None,
        decode_steps_by_batch=floor.by_batch if floor else (),
        tpot_p50_ms=percentiles(tpot, (50.0,))[0],
        decode_concurrency=busy / span if span > 0 else None,
        service_cv=statistics.pstdev(e2e) / statistics.fmean(e2e) if len(e2e) > 1 else None,
        prompt_tokens=percentiles(prompt, (50.0,))[0],
        long_prompt_tokens=percentiles(prompt, (100.0,))[0],
        output_tokens=statistics.fmean(out.to_list()),
        output_tokens_p50=percentiles(out, (50.0,))[0],
        output_tokens_max=percentiles(out, (100.0,))[0],
        unmeasured=tuple(unmeasured),
    )


def _prefill_why(prompt: pl.Series, fit: tuple[float, float] | None) -> str | None:
    """Why the prefill fit gave no rate, or None when it did."""
    if prompt.n_unique() < 2:
        return (
            f"every prompt has the same length ({prompt[0]:,.0f} tokens): the prefill rate "
            "cannot be fitted"
        )
    if fit is None or fit[0] <= 0:
        return "TTFT does not grow with prompt length in these runs: no prefill rate to fit"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeFloor:
    """The prefill-free decode step read off the inter-token gaps."""

    step_ms: float  # the floor at the batch most steps ran at (step-weighted median)
    batch: float  # that batch: sequences decoding, counted from the records
    by_batch: tuple[tuple[int, float], ...]  # every batch with enough gaps: its floor (ms)
    steps: int  # server steps observed
    source: str


def decode_floor(frames: Sequence[pl.DataFrame], class_name: str | None) -> DecodeFloor | None:
    """The lower envelope of ITL: the decode step without any prefill chunk in it.

    Every gap between two chunks of an ok request is one decode step of the server's batch
    (per token, when a chunk carries several), plus whatever prompt chunk that step also
    prefilled for another request (chunked prefill), which only ever adds time. The gaps
    of one step (every request decoding in it sees it) count once (`_steps`), tagged with
    the batch decoding in it: the requests of the same run (every class: they share the
    server) between their first and last token at the gap's middle. Per batch with at
    least FLOOR_MIN_STEPS steps, the floor is the centre of its lowest cluster of steps
    (`_floor`; it assumes at least ENVELOPE_PERCENTILE % of them prefilled nothing), and no
    larger than any larger batch's floor (`_non_decreasing`); the decode step is the
    step-weighted median of those floors, at its batch. None without gaps.
    """
    pooled = _pooled_gaps(frames, class_name)
    if not pooled:
        return None
    by_batch = {b: _floor(g) for b, g in pooled.items() if len(g) >= FLOOR_MIN_STEPS}
    weights = {b: len(pooled[b]) for b in by_batch}
    if not by_batch:  # too few steps for any batch alone: one floor over them all
        every = [gap for g in pooled.values() for gap in g]
        batch = round(_percentile([b for b, g in pooled.items() for _ in g], 50.0))
        by_batch, weights = {batch: _floor(every)}, {batch: len(every)}
    by_batch = _non_decreasing(by_batch)
    step, at = _weighted_median([(floor, weights[b], b) for b, floor in by_batch.items()])
    return DecodeFloor(
        step_ms=step,
        batch=float(at),
        by_batch=tuple(sorted(by_batch.items())),
        steps=sum(len(g) for g in pooled.values()),
        source="lower envelope of ITL (gaps without a prefill chunk)",
    )


def _non_decreasing(floors: dict[int, float]) -> dict[int, float]:
    """Each batch's floor lowered to the lowest floor of any larger batch: a step never gets
    faster with more sequences, so a floor above a larger batch's is a batch whose steps
    mostly carried a prefill chunk (more than 1 − ENVELOPE_PERCENTILE % of them)."""
    lowest = math.inf
    out: dict[int, float] = {}
    for batch in sorted(floors, reverse=True):
        lowest = min(lowest, floors[batch])
        out[batch] = lowest
    return dict(sorted(out.items()))


def _weighted_median(items: Sequence[tuple[float, int, int]]) -> tuple[float, int]:
    """(value, tag) at the weighted median of (value, weight, tag) items."""
    ordered = sorted(items)
    total = sum(w for _, w, _ in ordered)
    running = 0
    for value, weight, tag in ordered:
        running += weight
        if running * 2 >= total:
            return value, tag
    return ordered[-1][0], ordered[-1][2]


FLOOR_MIN_STEPS = 20  # steps a batch size needs for a floor of its own


FLOOR_WINDOW = 3.0  # half-width of the floor's window, in lower-tail spreads


def _floor(gaps: Sequence[float]) -> float:
    """The centre of the lowest cluster of gaps: the steps that prefilled nothing.

    Start at the lower envelope (the median of the gaps at or below their
    ENVELOPE_PERCENTILE-th percentile), which the stamps' noise pulls low; then move to the
    median of the gaps within ±FLOOR_WINDOW × the lower tail's spread (envelope − 2nd
    percentile) until it stays put. Noise is two-sided (a late stamp lengthens one gap and
    shortens the next), prefill one-sided and further off, so this settles on the steps
    without a chunk, as far from a chunk's cluster as the noise allows.
    """
    ordered = np.sort(np.asarray(gaps, dtype=np.float64))
    centre = _location(ordered[ordered <= _percentile(ordered, ENVELOPE_PERCENTILE)])
    half = FLOOR_WINDOW * max(centre - _percentile(ordered, 2.0), 1e-6)
    for _ in range(50):
        window = ordered[(ordered >= centre - half) & (ordered <= centre + half)]
        moved = _location(window)
        if abs(moved - centre) <= 1e-9:
            break
        centre = moved
    return centre


def _pooled_gaps(frames: Sequence[pl.DataFrame], class_name: str | None) -> dict[int, list[float]]:
    pooled: dict[int, list[float]] = {}
    for frame in frames:
        for batch, gaps in _gaps_by_batch(frame, class_name).items():
            pooled.setdefault(batch, []).extend(gaps)
    return pooled


def _distinct_reads(chunks: Sequence[int], tokens: Sequence[int] | None) -> tuple[Any, Any]:
    """Chunks with the same stamp merged, their tokens summed: chunks read together (the
    client fell a token gap behind) carry one time, so the gap before them spans them all
    and the gap between them (0) is no step at all."""
    times = np.asarray(chunks, dtype=np.int64)
    counts = np.asarray(tokens, dtype=np.float64) if tokens else np.ones(len(times))
    last = np.append(np.diff(times) > 0, True)  # the last chunk of each run of equal stamps
    run = np.concatenate([[0], np.cumsum(last)[:-1]])  # run index of every chunk
    return times[last], np.bincount(run, weights=counts)


def _gaps_by_batch(frame: pl.DataFrame, class_name: str | None) -> dict[int, list[float]]:
    """Per-token ITL gaps (ms) of ok requests (of `class_name`), one per server step, by the
    decoding batch in each: the ok requests of the run between their first and last token
    at the gap's middle (tokens come at step ends, so mid-step the count is the step's
    batch, whatever the stamps' jitter at the ends)."""
    ok = frame.filter(
        (pl.col("outcome") == Outcome.OK.value) & pl.col("first_token_ns").is_not_null()
    )
    if ok.height == 0:
        return {}
    first = np.sort(ok["first_token_ns"].to_numpy())
    last = np.sort(ok.select(pl.coalesce("last_token_ns", "first_token_ns")).to_series().to_numpy())
    mine = ok if class_name is None else ok.filter(pl.col("class") == class_name)
    ends: list[np.ndarray] = []
    gaps: list[np.ndarray] = []
    for chunks, tokens in zip(mine["chunk_ns"].to_list(), mine["chunk_tokens"].to_list(),
                              strict=True):  # fmt: skip
        if chunks is None or len(chunks) < 2:
            continue
        times, per = _distinct_reads(chunks, tokens)
        if len(times) < 2:
            continue
        ends.append(times[1:])
        gaps.append(np.diff(times) / 1e6 / np.maximum(per[1:], 1))
    if not gaps:
        return {}
    end = np.concatenate(ends)
    value = np.concatenate(gaps)
    mid = end - (value * 1e6 / 2).astype(np.int64)  # mid-gap: no one's token is due
    batch = np.searchsorted(first, mid, side="right") - np.searchsorted(last, mid, side="right")
    out: dict[int, list[float]] = {}
    for step_batch, step_gap in _steps(end, value, batch):
        out.setdefault(step_batch, []).append(step_gap)
    return out


STEP_MATCH = 0.05  # gaps ending within this share of a gap of each other end one step


def _steps(end: Any, gap: Any, batch: Any) -> list[tuple[int, float]]:
    """One (batch, gap) per server step: every request decoding in a step sees the same gap
    end at about the same time, so gaps whose ends lie within STEP_MATCH of a gap of the
    first are one observation (their median), not B of them."""
    order = np.argsort(end, kind="stable")
    end, gap, batch = end[order], gap[order], batch[order]
    steps: list[tuple[int, float]] = []
    start = 0
    for i in range(1, len(end) + 1):
        if i == len(end) or end[i] - end[start] > STEP_MATCH * gap[start] * 1e6:
            steps.append((int(_location(batch[start:i])), _location(gap[start:i])))
            start = i
    return steps


def _ok_rows(frame: pl.DataFrame, class_name: str | None) -> pl.DataFrame:
    """ok requests' prompt tokens, TTFT from send, TPOT, E2E from send and output tokens."""
    if class_name is not None:
        frame = frame.filter(pl.col("class") == class_name)
    measures = derive(frame).select(TTFT_FROM_SEND.column, TPOT.column, "output_tokens")
    end_ns = pl.coalesce("last_token_ns", "end_ns") - pl.col("sent_ns")
    extra = frame.select(
        pl.coalesce("prompt_tokens", "prompt_tokens_target").alias("prompt"),
        (end_ns.cast(pl.Float64) / 1e6).alias("e2e_from_send_ms"),
        (pl.col("outcome") == Outcome.OK.value).alias("is_ok"),
    )
    rows = pl.concat([measures, extra], how="horizontal")
    return rows.filter(pl.col("is_ok") & pl.col(TTFT_FROM_SEND.column).is_not_null()).drop("is_ok")


def _busy_span(frame: pl.DataFrame, class_name: str | None) -> tuple[float, float]:
    """(Σ time in flight, first send → last end) in ns over every sent request of a run."""
    if class_name is not None:
        frame = frame.filter(pl.col("class") == class_name)
    times = frame.select(
        pl.col("sent_ns").alias("start"), pl.coalesce("end_ns", "last_token_ns").alias("end")
    ).drop_nulls()
    if times.height == 0:
        return 0.0, 0.0
    start, end = times.get_column("start"), times.get_column("end")
    span = times.select(pl.col("end").max() - pl.col("start").min()).item()
    return float((end - start).sum()), float(span)


def _prefill_fit(rows: pl.DataFrame) -> tuple[float, float] | None:
    x = rows.get_column("prompt").cast(pl.Float64).to_list()
    y = rows.get_column(TTFT_FROM_SEND.column).to_list()
    return lower_envelope_fit(x, y)


def lower_envelope_fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float] | None:
    """(slope, intercept) of the line under the cloud: a cheap low-quantile regression.

    Fit least squares, keep the points whose residual is at or below the 20th percentile of
    the residuals, refit; repeat a few times. Points that only ever gained time (queued
    behind others) drop out, the unqueued floor remains. None when x does not vary.
    """
    xs, ys = list(x), list(y)
    if len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, ys)
    for _ in range(ENVELOPE_ROUNDS):
        residuals = [b - (slope * a + intercept) for a, b in zip(xs, ys, strict=True)]
        cut = _percentile(residuals, ENVELOPE_PERCENTILE)
        kept = [(a, b) for a, b, r in zip(xs, ys, residuals, strict=True) if r <= cut]
        if len({a for a, _ in kept}) < 2 or len(kept) == len(xs):
            break
        xs, ys = [a for a, _ in kept], [b for _, b in kept]
        slope, intercept = statistics.linear_regression(xs, ys)
    return slope, intercept


def _location(values: Any) -> float:
    """The centre of a cluster of values: their median, the mean of the two middle ones
    for an even count. A location estimate, not a reported percentile: the iterations of
    `_floor` recentre on it, and the lower of the two middle values would walk them down."""
    return float(np.median(values))


def _percentile(values: Sequence[float] | Any, percentile: float) -> float:
    """The nearest-rank percentile of a non-empty list or array (`loadgen.percentiles`)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    return float(ordered[nearest_rank(percentile, len(ordered)) - 1])
