"""Where TTFT went: each request's TTFT split by the server's account of it, per class.

Sits beside the SLO audit (`analysis.slo`): `per_request` adds each request's parts to its
row (`with_split`), `audit_class` summarises a class's (`ttft_split`), and the terminal, the
report, the checks' JUnit/Markdown and `capacity` read the summary's block; `compare` puts
two sides' side by side (`split_changes`).

The seed's arithmetic, TTFT = t_queue + t_prefill, seen from the client, whose TTFT runs
from the intended send time to the first output token it read. Five parts, which add up to
the client's TTFT exactly (ms, per ok request whose server said its queue and prefill):

- send_lag = TTFT − TTFT from send: the client's own wait before the request's bytes went
  (the generator's lateness, an in-flight cap, connecting);
- outside = TTFT from send − server TTFT: outside the engine (the network and proxies, the
  server's HTTP parsing and validation before its arrival stamp, detokenizing and the
  write of the first token after it);
- intake = server TTFT − queue − prefill: the server's own time from the request's arrival
  to its queue (rendering the template, tokenizing); 0 where the server gives no
  arrival-based TTFT (server TTFT is then queue + prefill);
- queue: waiting to be scheduled (vLLM: scheduled − queued);
- prefill: the first token − scheduled (prompt processing).

The server's fields come from the request's span where one was joined (`joined`: per
record, the `records.ServerTimings` names, whoever read them), else from its stream
(`records.server_timings`): one source per request, never a mix of the two clocks.

A percentile's split is over the requests whose TTFT ranks nearest it: the nearest-rank
request and `BAND` of the population either side, at least `MIN_HALF` (ranks r − h … r + h,
h = max(⌊BAND · n⌋, 2), within the population), each part's mean over them, so the parts
add up to the band's mean TTFT, a figure within the band's TTFTs. The breaching requests'
split is the means over the split requests whose TTFT was over the class's TTFT threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import polars as pl

from loadgen.measures import TTFT, TTFT_FROM_SEND
from loadgen.percentiles import nearest_rank
from loadgen.results.records import Outcome
from loadgen.results.summary import NO_SPLIT, TTFT_PARTS, SplitPoint, TtftSplit
from loadgen.workload.spec import SloTargets

BAND = 0.005  # a percentile's band: half a percent of the requests either side of its rank,
MIN_HALF = 2  # and at least 2 either side: one request's split is no percentile's
POINTS = (50.0, 90.0, 99.0)
SPAN, STREAM = "span", "stream"  # where a request's server fields came from
SOURCE = "split_source"  # the per-request column: SPAN, STREAM or null (not split)
SERVER_FIELDS = ("queue_ms", "prefill_ms", "ttft_ms")  # the ServerTimings the split reads


def part_column(part: str) -> str:
    """A part's per-request column in `per_request`'s rows: `split_queue_ms`."""
    return f"split_{part}"


PART_COLUMNS = tuple(part_column(p) for p in TTFT_PARTS)


def with_split(rows: pl.DataFrame, joined: pl.DataFrame | None = None) -> pl.DataFrame:
    """`rows` (`metrics.derive`'s, with the stream's `server_*_ms`) with each request's TTFT
    parts (`PART_COLUMNS`, null where it is not split) and their source (`SOURCE`).

    `joined`: per record, the server's fields from its joined span (`request_id` and the
    `SERVER_FIELDS` names; a row with none of them is no span), preferred to the stream's.
    A request is split when it ended ok with a TTFT and the server said queue and prefill.
    """
    fields = {name: pl.col(f"server_{name}") for name in SERVER_FIELDS}
    said = pl.any_horizontal(v.is_not_null() for v in fields.values())
    source: pl.Expr = pl.when(said).then(pl.lit(STREAM))
    if joined is not None:
        spans = joined.select(
            "request_id", *(pl.col(n).cast(pl.Float64).alias(f"span_{n}") for n in SERVER_FIELDS)
        )
        rows = rows.join(spans, on="request_id", how="left", maintain_order="left")
        has_span = pl.any_horizontal(pl.col(f"span_{n}").is_not_null() for n in SERVER_FIELDS)
        fields = {n: pl.when(has_span).then(pl.col(f"span_{n}")).otherwise(v)
                  for n, v in fields.items()}  # fmt: skip
        source = pl.when(has_span).then(pl.lit(SPAN)).otherwise(source)
    queue, prefill = fields["queue_ms"], fields["prefill_ms"]
    server_ttft = pl.coalesce(fields["ttft_ms"], queue + prefill)
    ttft, from_send = pl.col(TTFT.column), pl.col(TTFT_FROM_SEND.column)
    split = (
        (pl.col("outcome") == Outcome.OK.value)
        & ttft.is_not_null()
        & from_send.is_not_null()
        & queue.is_not_null()
        & prefill.is_not_null()
    )
    parts = {
        "send_lag_ms": ttft - from_send,
        "outside_ms": from_send - server_ttft,
        "intake_ms": (fields["ttft_ms"] - queue - prefill).fill_null(0.0),
        "queue_ms": queue,
        "prefill_ms": prefill,
    }
    assert tuple(parts) == TTFT_PARTS
    out = rows.with_columns(
        *(pl.when(split).then(expr).alias(part_column(name)) for name, expr in parts.items()),
        pl.when(split).then(source).alias(SOURCE),
    )
    return out.drop([f"span_{n}" for n in SERVER_FIELDS], strict=False)


def ttft_split(
    rows: pl.DataFrame, *, threshold_ms: float | None = None, percentile: float | None = None
) -> TtftSplit:
    """A class's split from its rows (`with_split`'s): at p50, p90, p99 and at `percentile`
    (its TTFT target's), and over the split requests whose TTFT was over `threshold_ms`."""
    ok = rows.filter(pl.col("outcome") == Outcome.OK.value)
    if SOURCE not in ok.columns:
        ok = with_split(ok)
    split = ok.filter(pl.col(SOURCE).is_not_null()).sort(TTFT.column)
    if split.height == 0:
        return replace(NO_SPLIT, ok=ok.height)
    over = split.filter(pl.col(TTFT.column) > threshold_ms) if threshold_ms is not None else None
    return TtftSplit(
        requests=split.height,
        ok=ok.height,
        from_spans=int((split.get_column(SOURCE) == SPAN).sum()),
        p50=at_percentile(split, POINTS[0]),
        p90=at_percentile(split, POINTS[1]),
        p99=at_percentile(split, POINTS[2]),
        at_target=None if percentile is None else at_percentile(split, percentile),
        breaching=None if over is None or over.height == 0 else mean_split(over, None),
    )


def band(n: int, percentile: float) -> tuple[int, int]:
    """The 0-based [start, stop) of the sorted rows a percentile's split averages: the
    nearest-rank row and max(⌊BAND · n⌋, MIN_HALF) rows either side, within [0, n)."""
    rank = nearest_rank(percentile, n)
    half = max(math.floor(BAND * n), MIN_HALF)
    return max(rank - 1 - half, 0), min(rank + half, n)


def at_percentile(split: pl.DataFrame, percentile: float) -> SplitPoint:
    """The split at one percentile of `split`'s TTFT (rows sorted by TTFT)."""
    start, stop = band(split.height, percentile)
    return mean_split(split.slice(start, stop - start), percentile)


def mean_split(rows: pl.DataFrame, percentile: float | None) -> SplitPoint:
    """Each part's mean over `rows` (split rows, at least one), to the µs; their sum is the
    rows' mean TTFT, stated as the sum of the rounded parts (no rounding gap between them)."""
    means = {part: round(_mean(rows, part_column(part)), 3) + 0.0 for part in TTFT_PARTS}  # no -0.0
    return SplitPoint(
        percentile=percentile,
        requests=rows.height,
        ttft_ms=round(sum(means.values()), 3),
        **means,
        cause=max(means, key=lambda part: means[part]),
    )


def _mean(rows: pl.DataFrame, column: str) -> float:
    value = rows.get_column(column).mean()
    assert isinstance(value, float)
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitChange:
    """Where one class's TTFT went on both sides of `compare`, at the TTFT target's
    percentile (p90 when none). Information, never a verdict: the TTFT checks judge TTFT;
    this says which part moved it."""

    class_name: str
    percentile: float
    baseline: SplitPoint | None  # None: that side's server said no request's queue and prefill
    current: SplitPoint | None
    baseline_requests: int  # the requests split on each side
    current_requests: int


def split_changes(
    baseline: pl.DataFrame, current: pl.DataFrame, shared: Sequence[str],
    slos: Mapping[str, SloTargets],
) -> tuple[SplitChange, ...]:  # fmt: skip
    """Per shared class whose server said on either side, its split on both (`baseline`
    and `current`: each side's `per_request` rows)."""
    changes = []
    for name in shared:
        targets = slos.get(name, SloTargets())
        p = targets.percentile if targets.ttft_ms is not None else POINTS[1]
        base, cur = (ttft_split(rows.filter(pl.col("class") == name), percentile=p)
                     for rows in (baseline, current))  # fmt: skip
        if base.requests or cur.requests:
            changes.append(SplitChange(class_name=name, percentile=p, baseline=base.at_target,
                                       current=cur.at_target, baseline_requests=base.requests,
                                       current_requests=cur.requests))  # fmt: skip
    return tuple(changes)
