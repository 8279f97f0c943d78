"""The diagnostic probe: what an answer the preflight could not parse really was. A bare
POST (none of the run's headers, query or body) on a new connection made as every other
one (through the proxy, TLS verified), and the first bytes the server sends back (an
HTTP/2-only server's SETTINGS frame, say)."""

from __future__ import annotations

import asyncio

from loadgen.engine.proxy import connect_reply, connect_request
from loadgen.engine.tls import client_context
from loadgen.engine.transport.endpoint import Endpoint
from loadgen.engine.transport.request import proxy_headers, request_headers


def probe_request(endpoint: Endpoint) -> bytes:
    """What the diagnostic probe sends: an empty JSON POST to the endpoint's path, without
    its query, with loadgen's own headers only. None of the user's headers, the URL's query
    or the workload's body: whatever may carry a credential stays off the probe, whatever
    answers it."""
    path = endpoint.target.split("?", 1)[0]
    bare = Endpoint(scheme=endpoint.scheme, host=endpoint.host, port=endpoint.port, target=path,
                    proxy=endpoint.proxy)  # fmt: skip
    lines = [f"POST {bare.request_target} HTTP/1.1"]
    lines.extend(f"{k}: {v}" for k, v in request_headers(bare, 2, {}))
    lines.extend(proxy_headers(endpoint))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + b"{}"


def probe_first_bytes(endpoint: Endpoint, *, timeout_s: float) -> bytes:
    """The first bytes the server answers `probe_request` with on a new connection (b""
    when it sends none in time, or the connection fails): what an unparseable answer was.

    The connection is made as every other one (through the proxy, TLS verified with the
    run's settings): a certificate that fails verification ends the probe before anything
    is sent. Not for a running event loop (the preflight calls it between its own).
    """
    try:
        return asyncio.run(asyncio.wait_for(_probe(endpoint), timeout_s))
    except (OSError, ValueError, EOFError, asyncio.LimitOverrunError):
        return b""


async def _probe(endpoint: Endpoint) -> bytes:
    proxy = endpoint.proxy
    host, port = (proxy.host, proxy.port) if proxy is not None else (endpoint.host, endpoint.port)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if endpoint.tunnelled:
            assert proxy is not None
            writer.write(connect_request(proxy, endpoint.host, endpoint.port))
            head = await reader.readuntil(b"\r\n\r\n")
            connect_reply(head[:-4], proxy, endpoint.host, endpoint.port)
        if endpoint.scheme == "https":
            await writer.start_tls(client_context(endpoint.tls), server_hostname=endpoint.host)
        writer.write(probe_request(endpoint))
        return await reader.read(64)
    finally:
        writer.close()
