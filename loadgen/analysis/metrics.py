"""Metrics: per-request measures and distribution statistics over the records frame.

Sits between the records and the SLO audit (`analysis.slo`). Everything here is a pure,
vectorised function of a frame with `records.SCHEMA`, so the same code serves one run, a
merge of shards and a 30-day window. No I/O, no clock.

Definitions (times are int ns since the run's t0; results are float ms):

- TTFT = first_token_ns - intended_ns (from the moment the user pressed enter, so a late
  send is charged to the request: no coordinated omission). TTFT from send =
  first_token_ns - sent_ns is a diagnostic of the server alone.
- TTFVT (time to first visible token) = first_content_ns - intended_ns: for a reasoning
  model it is TTFT plus the thinking phase; without reasoning it equals TTFT (tool-call-only
  answers have none). `has_reasoning` marks requests that streamed reasoning.
- Server timings (`server_*_ms`): what the server reported about its own work (Ollama's
  durations), kept beside the client's numbers, never mixed into them.
- TPOT = (last_token_ns - first_token_ns) / (N - 1), only for N = output_tokens > 1.
- ITL = every gap between successive `chunk_ns` of one request; ITL percentiles are over
  individual gaps, never over request averages. A stream past its stamp cap contributes
  its stamped gaps; its largest ITL (`max_itl_ms`, the request's ITL check) also takes the
  largest of its unstamped ones (`unstamped_max_gap_ns`).
- E2E = last_token_ns - intended_ns; an ok response with no output token at all is
  measured to end_ns instead (its TTFT, TPOT and ITL do not exist).
- Send lag = sent_ns - intended_ns: the generator's own health, not the server's.
- output_events, output_reads: how the output arrived; coalesced: in reads of several
  events each (`analysis.delivery`): its TPOT and ITL are not the server's pace.

Percentiles, everywhere in loadgen, use the nearest-rank definition (`loadgen.percentiles`):
the p-th percentile of n values is the value at 1-based rank ceil(p/100 * n) of the sorted
values (p = 100 is the maximum). It never interpolates, so every reported percentile is a
value that was really observed. A population "with failures" adds one +inf per failed
request, ranked worst: a failure can never improve a percentile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from loadgen.analysis.confidence import t_quantile
from loadgen.analysis.delivery import events, marked, reads
from loadgen.measures import GAP, ITL, MEASURES, TOKEN, Measure
from loadgen.percentiles import nearest_rank
from loadgen.results.records import UNSTREAMED_TOKENS, Outcome, TokenSource, with_all_columns
from loadgen.results.summary import (
    AskedLoad,
    FailureRankedStats,
    GeneratorHealth,
    LagStats,
    LatencyStats,
    OutputTokens,
    StreamEnds,
    TokensPerChunk,
)
from loadgen.units import NS_PER_MS, NS_PER_S

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)

SERVER_MS_FIELDS = (
    "queue_ms", "load_ms", "prefill_ms", "decode_ms", "total_ms", "ttft_ms", "itl_ms",
)  # fmt: skip


def percentiles(values: pl.Series, ps: Sequence[float], *, failures: int = 0) -> list[float | None]:
    """Nearest-rank percentiles of `values` (nulls ignored) plus `failures` values of +inf.

    Returns +inf where the rank falls on a failure, and None for every p when the
    population is empty. Sorts once, however many percentiles are asked for.
    """
    ordered = values.drop_nulls().sort()  # free when already sorted: callers sort once
    n = ordered.len() + failures
    if n == 0:
        return [None for _ in ps]
    ranks = [nearest_rank(p, n) for p in ps]
    picked = ordered.gather([r - 1 for r in ranks if r <= ordered.len()]).to_list()
    return [float(picked[i]) if r <= ordered.len() else math.inf for i, r in enumerate(ranks)]


def round_ms(value: float | None) -> float | None:
    """A value for JSON: rounded to 3 decimals (1 µs), None when missing or +inf (a failure)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, 3)


def latency_stats(values_ms: pl.Series) -> LatencyStats:
    """p50/p90/p95/p99/max/mean/count of completed requests' values in ms (None when empty)."""
    present = values_ms.drop_nulls()
    p50, p90, p95, p99, peak = (round_ms(v) for v in percentiles(present, (*PERCENTILES, 100.0)))
    mean = present.mean() if present.len() else None
    return LatencyStats(
        p50=p50, p90=p90, p95=p95, p99=p99, max=peak,
        mean=round_ms(float(mean)) if isinstance(mean, int | float) else None,
        count=present.len(),
    )  # fmt: skip


def latency_stats_with_failures(values_ms: pl.Series, *, failures: int) -> FailureRankedStats:
    """p50/p90/p95/p99/max with `failures` ranked worst; None where a percentile is a failure.

    `count` is the whole population (values + failures); `failures` how many of them failed.
    """
    present = values_ms.drop_nulls()
    points = percentiles(present, (*PERCENTILES, 100.0), failures=failures)
    p50, p90, p95, p99, peak = (round_ms(v) for v in points)
    return FailureRankedStats(
        p50=p50, p90=p90, p95=p95, p99=p99, max=peak, count=present.len() + failures,
        failures=failures,
    )  # fmt: skip


def derive(frame: pl.DataFrame) -> pl.DataFrame:
    """One row per record with its measures in ms (null where a moment never happened).

    Measures are kept for every outcome (partial output of a failure is data); the
    populations in the summary select by outcome. Row order is the frame's. Each measure of
    `measures.MEASURES` gives its one value per request (`Measure.per_request`), in the
    table's order. `lag_ms` is the generator's lateness (see `generator_health`);
    `send_lag_ms` adds what happened between dispatch and the request bytes (in-flight
    cap, connecting).
    """
    frame = with_all_columns(frame)  # records of older runs lack the newer columns
    rows = frame.select(
        "request_id",
        "class",
        "outcome",
        *(_ms(_per_request_ns(m)).alias(m.per_request) for m in MEASURES),
        _ms(_lag_ns()).alias("lag_ms"),
        _ms(pl.col("sent_ns") - pl.col("intended_ns")).alias("send_lag_ms"),
        "output_tokens",
        pl.col("first_reasoning_ns").is_not_null().alias("has_reasoning"),
        *(
            pl.col("server_timings").struct.field(name).alias(f"server_{name}")
            for name in SERVER_MS_FIELDS
        ),
        "prompt_tokens",
        "cached_prompt_tokens",
        events().alias("output_events"),
        reads().alias("output_reads"),
    )
    return rows.with_columns(marked(frame, rows))


def _per_request_ns(measure: Measure) -> pl.Expr:
    """A measure's one value per request in ns (see `measures`): end − start; per token
    divided by N − 1 (N > 1 only); a gap measure's largest gap, with the largest of the
    gaps past the stamp cap (`unstamped_max_gap_ns`)."""
    if measure.per == GAP:
        stamped = _gaps_ns(pl.col(measure.end)).list.max()
        return pl.max_horizontal(stamped, "unstamped_max_gap_ns")
    end = pl.col(measure.end)
    if measure.end_if_none is not None:
        is_ok = pl.col("outcome") == Outcome.OK.value
        end = pl.when(is_ok).then(pl.coalesce(measure.end, measure.end_if_none)).otherwise(end)
    span = end - pl.col(measure.start)
    if measure.per == TOKEN:
        n_tokens = pl.col("output_tokens")
        return pl.when(n_tokens > 1).then(span / (n_tokens - 1))
    return span


def _ms(ns: pl.Expr) -> pl.Expr:
    """An ns expression as float ms."""
    return ns.cast(pl.Float64) / NS_PER_MS


def _gaps_ns(chunk_ns: pl.Expr) -> pl.Expr:
    """The list of gaps between successive chunk times (list arithmetic: faster than diff)."""
    return chunk_ns.list.slice(1) - chunk_ns.list.head(chunk_ns.list.len() - 1)


def _lag_ns() -> pl.Expr:
    """How late the generator started a request: dispatched (else sent) - intended."""
    return pl.coalesce("dispatched_ns", "sent_ns") - pl.col("intended_ns")


def itl_gaps_ms(frame: pl.DataFrame, class_name: str) -> pl.Series:
    """Every inter-chunk gap of every ok request of one class, in ms, sorted ascending.

    Sorted here, once, in integer ns (faster than floats): a run of 1M requests holds tens
    of millions of gaps. One class at a time, so no class label is repeated per gap.
    """
    wanted = (pl.col("outcome") == Outcome.OK.value) & (pl.col("class") == class_name)
    gaps_ns = (
        frame.lazy()
        .filter(wanted)
        .select(_gaps_ns(pl.col(ITL.end)).explode().drop_nulls().sort().alias(ITL.column))
        .collect()
        .get_column(ITL.column)
    )
    return (gaps_ns.cast(pl.Float64) / NS_PER_MS).set_sorted()


def output_token_stats(output_tokens: pl.Series) -> OutputTokens:
    """mean/p50/max/total of output tokens (callers pass completed requests' counts)."""
    p50 = percentiles(output_tokens, (50.0,))[0]
    mean = output_tokens.mean() if output_tokens.len() else None
    peak = output_tokens.max() if output_tokens.len() else None
    return OutputTokens(
        mean=round(float(mean), 3) if isinstance(mean, int | float) else None,
        p50=int(p50) if p50 is not None else None,
        max=int(peak) if isinstance(peak, int | float) else None,
        total=int(output_tokens.sum()),
    )


def tokens_per_chunk(frame: pl.DataFrame) -> dict[str, TokensPerChunk]:
    """mean and max tokens carried per output chunk, over the chunks of ok requests, by class.

    1.0 means one token per chunk (ITL is then a per-token gap); more means the server
    coalesced or speculated, and ITL figures are per chunk, not per token.
    """
    tokens = pl.col("chunk_tokens")
    per_class = (
        frame.lazy()
        .filter(pl.col("outcome") == Outcome.OK.value)
        .group_by("class")
        .agg(
            tokens.list.sum().sum().alias("tokens"),
            tokens.list.len().sum().alias("chunks"),
            tokens.list.max().max().alias("max"),
        )
        .collect()
    )
    return {
        str(row["class"]): TokensPerChunk(
            mean=round(row["tokens"] / row["chunks"], 3) if row["chunks"] else None,
            max=int(row["max"]) if row["max"] is not None else None,
        )
        for row in per_class.iter_rows(named=True)
    }


def stream_ends(frame: pl.DataFrame) -> dict[str, StreamEnds]:
    """Per class: stop reasons, stopped-early counts and the sources of N over the requests
    that streamed some output; truncated over all of them (a cut may come before any
    output). See `summary.StreamEnds`."""
    frame = with_all_columns(frame)
    ends = {}
    for (name,), whole in sorted(frame.partition_by("class", as_dict=True).items()):
        part = whole.filter(pl.col("first_token_ns").is_not_null())
        reasons = part.get_column("finish_reason").fill_null("none").value_counts(sort=True)
        sources = part.get_column("token_source").value_counts(sort=True)
        n_from = {str(k): int(v) for k, v in sources.iter_rows()}
        usage = n_from.get(TokenSource.USAGE.value, 0)
        ends[str(name)] = StreamEnds(
            finish_reasons={str(k): int(v) for k, v in reasons.iter_rows()},
            truncated=int((whole.get_column("outcome") == Outcome.TRUNCATED.value).sum()),
            stopped_early=int(part.get_column("stopped_early").fill_null(False).sum()),
            n_from=n_from,
            n_from_usage_share=round(usage / part.height, 6) if part.height else None,
            n_counted=any(n_from.get(s.value, 0) for s in (TokenSource.TEXT, TokenSource.CHUNKS)),
            itl_summarised=int((part.get_column("unstamped_chunks").fill_null(0) > 0).sum()),
            **_usage_evidence(whole),
        )
    return ends


def _usage_evidence(part: pl.DataFrame) -> dict[str, int]:
    """Usage that disagrees with the events that arrived (and how often it claimed more),
    and usage problems, over one class's records (`summary.StreamEnds`)."""
    usage, counted = pl.col("usage_output_tokens"), pl.col("counted_output_tokens")
    has = usage.is_not_null() & (counted > 0)
    over = has & (usage > counted + UNSTREAMED_TOKENS)
    disagrees = over | (has & (usage < counted))
    not_taken = has & (pl.col("token_source") != TokenSource.USAGE.value)
    row = part.select(
        disagrees.sum().alias("usage_disagrees"),
        over.sum().alias("usage_over_counted"),
        pl.col("usage_problem").is_not_null().sum().alias("usage_problems"),
        not_taken.sum().alias("usage_not_taken"),
    ).row(0, named=True)
    return {k: int(v or 0) for k, v in row.items()}


def run_duration_s(frame: pl.DataFrame) -> float:
    """max(end) - min(intended_ns) over the whole frame, in s; 0.0 for an empty frame.

    A record without end_ns falls back to its latest known moment (last token, first
    token, send, intended), so an interrupted run still has a duration; a `not_sent`
    record (the run stopped before its time) has no moment at all and does not extend it.
    """
    if frame.height == 0:
        return 0.0
    end = pl.coalesce("end_ns", "last_token_ns", "first_token_ns", "sent_ns", "intended_ns")
    happened = pl.col("outcome") != Outcome.NOT_SENT.value
    span = frame.select(end.filter(happened).max() - pl.col("intended_ns").min()).item()
    return max(int(span), 0) / NS_PER_S if span is not None else 0.0


def rate_per_s(times_ns: pl.Series) -> float | None:
    """Events per second over the span of their times: (n - 1) / (max - min).

    n - 1 intervals fit in the span of n events, so n evenly spaced events at rate r give
    exactly r. None when n <= 1 or all times are equal (no span to divide by).
    """
    present = times_ns.drop_nulls()
    if present.len() <= 1:
        return None
    span_ns = int(present.max()) - int(present.min())  # type: ignore[arg-type]  # non-empty ints
    if span_ns <= 0:
        return None
    return (present.len() - 1) * NS_PER_S / span_ns


TREND_LEVEL = 0.999  # one-sided: a client keeping up is called short about once in 1,000


@dataclass(frozen=True, slots=True)
class LagTrend:
    """The least-squares slope of the send lag on the intended time (seconds of lag gained
    per second of schedule) and its one-sided lower bound at TREND_LEVEL from the scatter
    about the line (Student's t, n − 2 degrees of freedom)."""

    slope: float
    low: float


def lag_trend(intended_ns: pl.Series, lags_ms: pl.Series) -> LagTrend | None:
    """0 for a client that keeps up, however late each send is; > 0 for one that falls
    further behind as the run goes on. Its lower bound keeps a few late stragglers of a
    short run (one 24 ms send of five over 80 ms is a 4 % slope) from reading as a client
    that cannot keep up. None with fewer than 3 sends or no span."""
    both = pl.DataFrame({"t": intended_ns, "lag": lags_ms}).drop_nulls()
    if both.height < 3:
        return None
    t_s = both.get_column("t").cast(pl.Float64).to_numpy() / NS_PER_S
    lag_s = both.get_column("lag").cast(pl.Float64).to_numpy() / 1000.0
    dt = t_s - t_s.mean()
    spread = float((dt**2).sum())
    if spread <= 0:
        return None
    slope = float((dt * (lag_s - lag_s.mean())).sum()) / spread
    residuals = lag_s - lag_s.mean() - slope * dt
    error = math.sqrt(float((residuals**2).sum()) / (both.height - 2) / spread)
    return LagTrend(slope=slope, low=slope - t_quantile(TREND_LEVEL, both.height - 2) * error)


def _shortfall(slope: float) -> float:
    """1 − achieved / scheduled for a lag growing `slope` s per s: 1 − 1 / (1 + slope); a
    slope (or a bound on one) below −0.5 reads as −0.5: far ahead, and finite."""
    return round(1 - 1 / (1 + max(slope, -0.5)), 6)


def generator_health(
    frame: pl.DataFrame,
    *,
    planned: int,
    lag_bound_ms: float | None = None,
    requested_rate_per_s: float | None = None,
    asked: Mapping[str, AskedLoad] | None = None,
) -> GeneratorHealth:
    """How well the generator kept to its schedule: lag, and scheduled vs achieved rate.

    lag = dispatched_ns - intended_ns (sent_ns where a record has no dispatch time): how
    late the scheduler started each request. `lag_ms` is over the requests the schedule
    placed (single requests and the first turn of a session, trajectory or batch): a later
    turn's intended time is the previous turn's end plus a think time, so its lag is the
    client's reaction time, reported on its own as `chained_lag_ms` (and included in that
    turn's TTFT). `send_lag_ms` (sent - intended) also holds waits for an in-flight slot and
    connecting, which are charged to the requests, not to the generator. Requests never
    started have no lag. Rates (see `rate_per_s`): scheduled over the intended times of every
    record; achieved = scheduled / (1 + the lag's trend over the scheduled sends,
    `lag_trend`), so `rate_shortfall` = 1 - achieved / scheduled, and `rate_shortfall_low`
    its one-sided lower bound from the trend's.

    `fell_behind` here is only what needs no verdict: a request that failed in the client
    itself (`client_error`: no file descriptor, no local port), or a lag p99 above
    `lag_bound_ms` when one is given. Whether the client's time could have changed the
    verdict is `analysis.health.judge_client`'s, once the classes are judged.
    """
    chained = pl.col("turn").fill_null(0) > 0 if "turn" in frame.columns else pl.lit(False)
    lags = frame.select(
        _ms(_lag_ns()).alias("lag"),
        _ms(pl.col("sent_ns") - pl.col("intended_ns")).alias("send_lag"),
        pl.col("intended_ns"),
        chained.alias("chained"),
    )
    client_errors = int((frame.get_column("outcome") == Outcome.CLIENT_ERROR.value).sum())
    placed = lags.filter(~pl.col("chained"))
    scheduled = placed.get_column("lag")
    reaction = lags.filter(pl.col("chained")).get_column("lag")
    target = rate_per_s(frame.get_column("intended_ns"))
    trend = lag_trend(placed.get_column("intended_ns"), scheduled)
    achieved = None if target is None or trend is None else target / (1 + trend.slope)
    lag = lag_stats(scheduled)
    over = lag_bound_ms is not None and lag.p99 is not None and lag.p99 > lag_bound_ms
    return GeneratorHealth(
        planned=planned,
        sent=int(frame.get_column("sent_ns").is_not_null().sum()),
        recorded=frame.height,
        retries=int(frame.get_column("retries").fill_null(0).sum()),
        lag_ms=lag,
        send_lag_ms=lag_stats(lags.get_column("send_lag")),
        chained_lag_ms=lag_stats(reaction),
        target_rate_per_s=round(target, 3) if target is not None else None,
        achieved_rate_per_s=round(achieved, 3) if achieved is not None else None,
        client_errors=client_errors,
        fell_behind=client_errors > 0 or over,
        lag_bound_ms=lag_bound_ms,
        requested_rate_per_s=None
        if requested_rate_per_s is None
        else round(requested_rate_per_s, 3),
        asked=dict(asked or {}),
        rate_shortfall=None if trend is None else _shortfall(trend.slope),
        rate_shortfall_low=None if trend is None else _shortfall(trend.low),
    )


def lag_stats(lags_ms: pl.Series) -> LagStats:
    """Nearest-rank p50, p99 and the max of lags in ms (nulls, never-started, left out)."""
    p50, p99, peak = (round_ms(v) for v in percentiles(lags_ms, (50.0, 99.0, 100.0)))
    return LagStats(p50=p50, p99=p99, max=peak)
