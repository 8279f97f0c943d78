"""The streaming HTTP/1.1 client of the engine: lean asyncio protocols and a connection pool.

Why not httpx for the stream: measured on a 2-core machine with 20 ms token gaps, one
`httpx.AsyncClient` collapses at 256 concurrent streams (its pool does work proportional
to the number of connections on every event: ~400 chunks/s, timestamp error p99 ≈ 0.5 s),
and many small clients cost ~65 µs of CPU per chunk. This package costs a fraction of that:
the arrival time of every read is stamped in `data_received`, before anything is parsed,
and the body is handed to the exchange without a task switch. httpx stays the client for
the preflight and anything that is not the hot path.

The exchange (the caller) sees four callbacks: `on_head`, `on_body`, `on_end` and
`on_lost`; this package only frames HTTP (status line, headers, chunked, Content-Length or
close-delimited bodies) and keeps idle keep-alive connections for reuse. Its modules, along
httpcore's lines:

| module | what it holds |
|---|---|
| `interfaces` | the seams: `ExchangeSink`, `Link`, `Connector`, `WarmReport` |
| `endpoint` | `Endpoint` and the URL helpers (`make_endpoint`, `split_url`, `host_header`) |
| `request` | a request's HTTP/1.1 bytes (`encode_request`, `request_headers`) |
| `http11` | one connection and its response parsing (`Connection`, `Inflating`): the hot path |
| `codings` | the content codings loadgen inflates (`accepted_codings`, `compression_note`) |
| `stamped` | the kernel-stamped socket of plain-HTTP connections (`StampedSocket`) |
| `connect` | how a connection is opened: TLS, a proxy's tunnel (`Dialer`, `connect_failure`) |
| `pool` | idle connections, warming before t0, the drain of stamped reads (`Pool`) |
| `probe` | the preflight's diagnostic probe (`probe_first_bytes`) |

Connection set-up is the endpoint's: https with the run's one TLS context (`engine.tls`),
and, behind a forward proxy (`engine.proxy`), a CONNECT tunnel with TLS inside it for
https, or the proxy's own socket (kernel-stamped like a direct one) and absolute-form
requests for http. Why a connection could not be opened, or ended mid-response, is said
in words (`connect_failure`, `lost_reason`): which certificate check failed, what the
proxy answered, how long the silence was before a close.
"""

from __future__ import annotations

from loadgen.engine.transport.codings import INFLATED, accepted_codings, compression_note
from loadgen.engine.transport.connect import Dialer, connect_failure
from loadgen.engine.transport.endpoint import Endpoint, host_header, make_endpoint, split_url
from loadgen.engine.transport.http11 import (
    HTTP2_ANSWER,
    MAX_HEAD_BYTES,
    Connection,
    Inflating,
    http2_frame,
    lost_reason,
)
from loadgen.engine.transport.interfaces import Connector, ExchangeSink, Link, WarmReport
from loadgen.engine.transport.pool import Pool
from loadgen.engine.transport.probe import probe_first_bytes, probe_request
from loadgen.engine.transport.request import encode_request, request_headers
from loadgen.engine.transport.stamped import (
    KERNEL_STAMPS_AVAILABLE,
    StampedSocket,
    keep_kernel_timestamping_on,
)

__all__ = [
    "HTTP2_ANSWER", "INFLATED", "KERNEL_STAMPS_AVAILABLE", "MAX_HEAD_BYTES", "Connection",
    "Connector", "Dialer", "Endpoint", "ExchangeSink", "Inflating", "Link", "Pool",
    "StampedSocket", "WarmReport", "accepted_codings", "compression_note", "connect_failure",
    "encode_request", "host_header", "http2_frame", "keep_kernel_timestamping_on", "lost_reason",
    "make_endpoint", "probe_first_bytes", "probe_request", "request_headers", "split_url",
]  # fmt: skip
