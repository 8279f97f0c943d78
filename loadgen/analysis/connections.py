"""Which connection each request used, and what it did to its latency (summary `connections`).

A request written on a connection opened for it (`new`) carries the TCP (and TLS)
handshake in its send lag and TTFT; one on a connection warmed before t0 (`warm`) or kept
alive from an earlier request (`reused`) does not. The block puts the three side by side,
so a run with `--warm-connections 0` (or a server that closes connections) shows what
connection setup costs, and a warm run shows that none of it reached a latency.
"""

from __future__ import annotations

import polars as pl

from loadgen.analysis.metrics import lag_stats
from loadgen.results.records import Outcome
from loadgen.results.summary import ConnectionKind, ConnectionUse

KINDS = ("new", "warm", "reused")


def connection_use(frame: pl.DataFrame) -> ConnectionUse | None:
    """Requests, send lag and TTFT per connection kind; None for records without the column."""
    if "connection" not in frame.columns or frame.get_column("connection").null_count() == len(
        frame
    ):
        return None
    kinds = {kind: _kind(frame.filter(pl.col("connection") == kind)) for kind in KINDS}
    return ConnectionUse(new=kinds["new"], warm=kinds["warm"], reused=kinds["reused"])


def _kind(rows: pl.DataFrame) -> ConnectionKind:
    ms = pl.Float64
    send_lag = rows.select(((pl.col("sent_ns") - pl.col("intended_ns")).cast(ms) / 1e6).alias("v"))
    ok = rows.filter(pl.col("outcome") == Outcome.OK.value)
    ttft = ok.select(((pl.col("first_token_ns") - pl.col("intended_ns")).cast(ms) / 1e6).alias("v"))
    return ConnectionKind(
        requests=rows.height,
        send_lag_ms=lag_stats(send_lag.get_column("v")),
        ttft_ms=lag_stats(ttft.get_column("v")),
    )
