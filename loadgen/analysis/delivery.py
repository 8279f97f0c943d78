"""Delivery: how each stream's output arrived at the client, and which streams arrived
coalesced, so that a pace the server never showed is not judged as its pace.

Beside `analysis.metrics`, below the SLO audit. The records keep, per request, its output
events (`chunk_ns` holds one stamp per event) and the network reads that carried them
(`output_reads`; every event of one read carries that read's stamp, so equal stamps are
one read). Two ratios follow:

- tokens per event: the server's own chunking (vLLM's `--stream-interval`, a server that
  coalesces deltas): one read per event, several tokens each. ITL is then per event.
- events per read: bytes held back between the server and the client (a buffering proxy,
  ingress, CDN or gateway; compression that waits for a full block), or written in bursts
  by the server itself: many events arrive in one read, their gaps read 0 and the gap
  before them holds the wait.

A stream is **coalesced** when at least half of its output reads carried
`COALESCED_EVENTS` (4) or more events each. Why 4, and why half of its reads: on a direct
path each event is written as it is generated, g apart; a read carries k events only when
whoever reads (the client, or a process forwarding the bytes) was late by (k − 1)·g. For
half of a stream's reads to carry 4 or more, the reader must have been late by 3 token gaps
on every other read: 65 ms at the simulator's 21.6 ms TPOT, 15 ms at 5 ms a token (200
tokens/s, faster than anyone reads), where a run whose generator kept up was late past its
lag bound (5 ms) on at most 1 % of its sends. With each read late by 3g or more with
probability q, independently, a stream of R reads is called coalesced with probability
P(Binomial(R, q) ≥ R/2) (`direct_false_share`): 2.4e-8 for q = 1 % and R = 10, 6e-24 for
R = 32. A stall of the client or of the box (a descheduled process: 100–500 ms on a loaded
2-core host) makes one big read among small ones, which moves no median (and such a
stream's TPOT, first to last event, both on time, is still the server's; its ITL shows the
burst as it came). Buffering moves
every read: a B-byte block carries B / s events (s = 150–400 bytes a chat event: 10–27 per
4 KiB), a whole response all of them. A stall longer than most of a stream looks like a
whole response and is called coalesced: its pace was not seen either.

The audit (`analysis.slo`) does not take a coalesced stream's TPOT or ITL as the server's
pace: they are judged as unknown (ranked worst for the upper bound, best for the lower), so
a class whose streams are mostly coalesced is INCONCLUSIVE on TPOT and ITL, and a few among
many direct streams change nothing the rest establish. A workload that says its path
buffers (`target.path_buffers`, `--path-buffers`) is judged as observed: the pace its users
see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from loadgen.measures import ITL, TPOT
from loadgen.results.records import Outcome
from loadgen.results.summary import Delivery

COALESCED_EVENTS = 4  # a read carrying this many events or more is a coalesced read


def read_sizes(chunk_ns: pl.Expr) -> pl.Expr:
    """The events each read carried, in order: the run lengths of equal stamps."""
    return chunk_ns.list.eval(pl.element().rle().struct.field("len"))


def coalesced(chunk_ns: pl.Expr | None = None) -> pl.Expr:
    """True for a stream at least half of whose output reads carried `COALESCED_EVENTS` or
    more events each (false without output). A list operation on every stamp: `marked`
    runs it only on the streams that can be coalesced."""
    stamps = pl.col("chunk_ns") if chunk_ns is None else chunk_ns
    sizes = read_sizes(stamps)
    big = sizes.list.eval(pl.element() >= COALESCED_EVENTS).list.sum()
    return ((stamps.list.len() >= COALESCED_EVENTS) & (big * 2 >= sizes.list.len())).fill_null(
        False
    )


def reads() -> pl.Expr:
    """The reads that carried a request's output: the recorded count, else (records before
    it was kept) the distinct stamps of its events."""
    counted = pl.col("output_reads").fill_null(0)
    distinct = pl.col("chunk_ns").list.n_unique().fill_null(0)
    return pl.when(counted > 0).then(counted).otherwise(distinct)


def events() -> pl.Expr:
    """A request's output events: the recorded count, else the stamps kept."""
    stamps = pl.col("chunk_ns").list.len().fill_null(0)
    counted = pl.col("output_events").fill_null(0)
    return pl.when(counted > 0).then(counted).otherwise(stamps)


def marked(frame: pl.DataFrame, rows: pl.DataFrame) -> pl.Series:
    """`coalesced` for each of `rows` (the per-request rows of `frame`, in its order, with
    `output_events` and `output_reads`). Half of a stream's reads at K events or more means
    events ≥ K/2 × reads: only streams with that many events per read have their stamps
    looked at (none on a direct path: it costs a direct run nothing)."""
    n_events, n_reads = pl.col("output_events"), pl.col("output_reads")
    candidate = (n_events >= COALESCED_EVENTS) & (2 * n_events >= COALESCED_EVENTS * n_reads)
    mask = rows.select(candidate.fill_null(False)).to_series()
    flags = pl.Series("coalesced", [False] * rows.height, dtype=pl.Boolean)
    if mask.any():
        found = frame.filter(mask).select(coalesced()).to_series()
        flags = flags.scatter(mask.arg_true(), found)
    return flags


def delivery(rows: pl.DataFrame, *, path_buffers: bool = False) -> Delivery:
    """One class's delivery block over its ok requests that streamed output (`rows`: its
    `slo.per_request` rows, with `output_events`, `output_reads`, `coalesced`)."""
    streams = rows.filter((pl.col("outcome") == Outcome.OK.value) & (pl.col("output_events") > 0))
    if streams.height == 0:
        return Delivery(path_buffers=path_buffers)
    row = streams.select(
        pl.col("output_reads").sum().alias("reads"),
        pl.col("output_events").sum().alias("events"),
        (pl.col("output_events") / pl.col("output_reads")).max().alias("most"),
        pl.col("output_tokens").sum().alias("tokens"),
        pl.col("coalesced").sum().alias("coalesced"),
        pl.col("output_tokens").filter(pl.col("coalesced")).sum().alias("coalesced_tokens"),
    ).row(0, named=True)
    n_reads, n_events, tokens = int(row["reads"]), int(row["events"]), int(row["tokens"])
    return Delivery(
        streams=streams.height,
        reads=n_reads,
        events=n_events,
        events_per_read=_ratio(n_events, n_reads, 3),
        events_per_read_max=round(float(row["most"]), 3) if row["most"] is not None else None,
        tokens_per_event=_ratio(tokens, n_events, 3),
        coalesced=int(row["coalesced"]),
        coalesced_share=_ratio(int(row["coalesced"]), streams.height, 6),
        coalesced_token_share=_ratio(int(row["coalesced_tokens"] or 0), tokens, 6),
        coalesced_at_events=COALESCED_EVENTS,
        path_buffers=path_buffers,
    )


def _ratio(top: int, bottom: int, digits: int) -> float | None:
    return round(top / bottom, digits) if bottom else None


@dataclass(frozen=True, slots=True)
class Unpaced:
    """A class's TPOT and ITL as the checks judge them when some streams arrived coalesced:
    the values of the other streams, and how many are unknown (`analysis.slo`).

    `tpot_ms`: sorted TPOT of ok requests not coalesced; `tpot_unknown`: coalesced ones
    with a TPOT (N > 1). `itl_ms`: sorted gaps of ok requests not coalesced, over
    `itl_streams` requests; `itl_unknown` coalesced requests with gaps, `itl_unknown_gaps`
    their gaps."""

    tpot_ms: pl.Series
    tpot_unknown: int
    itl_ms: pl.Series
    itl_streams: int
    itl_unknown: int
    itl_unknown_gaps: int
    coalesced: int  # the class's coalesced streams
    streams: int  # its ok requests that streamed output
    observed: bool = False  # the path is declared to buffer: judged as observed, said so

    def unknown(self, metric: str) -> int:
        """Unknown values of `metric` (the paced measures, TPOT and ITL; 0 for the others)."""
        return {TPOT.column: self.tpot_unknown, ITL.column: self.itl_unknown}.get(metric, 0)

    def values(self, metric: str) -> pl.Series:
        """The sorted values of `metric` the checks take as the server's pace."""
        return self.tpot_ms if metric == TPOT.column else self.itl_ms


def unpaced(rows: pl.DataFrame, part: pl.DataFrame, *, observed: bool = False) -> Unpaced:
    """The split of one class's TPOT and ITL (`rows`: its `slo.per_request` rows, with
    `coalesced`; `part`: its records, in the same order); `observed`: the path is declared
    to buffer, and the checks take every value as observed, saying so."""
    ok = rows.get_column("outcome") == Outcome.OK.value
    flagged = rows.get_column("coalesced") & ok
    tpot = rows.filter(ok).select(TPOT.column, "coalesced").drop_nulls(TPOT.column)
    stamps = pl.col(ITL.end)
    gaps = part.filter(ok).select(
        rows.filter(ok).get_column("coalesced"),
        (stamps.list.slice(1) - stamps.list.head(stamps.list.len() - 1)).alias("gaps"),
    ).filter(pl.col("gaps").list.len() > 0)  # fmt: skip
    known, unknown = gaps.filter(~pl.col("coalesced")), gaps.filter(pl.col("coalesced"))
    gaps_ns = known.get_column("gaps").explode().drop_nulls().sort()
    return Unpaced(
        tpot_ms=tpot.filter(~pl.col("coalesced")).get_column(TPOT.column).sort(),
        tpot_unknown=int(tpot.get_column("coalesced").sum()),
        itl_ms=(gaps_ns.cast(pl.Float64) / 1e6).set_sorted(),
        itl_streams=known.height,
        itl_unknown=unknown.height,
        itl_unknown_gaps=int(unknown.get_column("gaps").list.len().sum()),
        coalesced=int(flagged.sum()),
        streams=int((ok & (rows.get_column("output_events") > 0)).sum()),
        observed=observed,
    )


def direct_false_share(reads: int, late_share: float) -> float:
    """The chance a direct stream of `reads` output reads is called coalesced when each read
    is, independently, late enough to carry `COALESCED_EVENTS` events with probability
    `late_share`: P(Binomial(reads, late_share) >= reads / 2)."""
    if late_share <= 0.0 or late_share >= 1.0:
        return 0.0 if late_share <= 0.0 else 1.0
    need = math.ceil(reads / 2)
    logs = [
        math.lgamma(reads + 1) - math.lgamma(k + 1) - math.lgamma(reads - k + 1)
        + k * math.log(late_share) + (reads - k) * math.log1p(-late_share)
        for k in range(need, reads + 1)
    ]  # fmt: skip
    return float(sum(math.exp(v) for v in logs))
