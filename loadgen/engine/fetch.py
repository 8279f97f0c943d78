"""Bounded HTTP requests for the side channels: `--cache reset` and server-metrics scrapes.

Off the hot path (the engine's streams use `transport`; the preflight has its own cancel
scope). httpx's timeouts are per operation: its read timeout restarts on every read, so a
server trickling a byte a second held a request for ever. Here one deadline covers the
whole request (connecting, the answer's head and its body), as an anyio cancel scope, and
the body is read up to a cap and no further (a 400 MB refusal read whole took 1.6 GiB).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import anyio
import httpx

MAX_ERROR_BYTES = 2048  # of an error response's body (status >= 300): enough to say why


@dataclass(frozen=True, slots=True)
class Fetched:
    """A response: its status, headers, and its body up to the cap (`cut`: more came)."""

    status: int
    headers: httpx.Headers
    body: bytes
    cut: bool


async def fetch(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    deadline_s: float | None,
    max_bytes: int,
    max_error_bytes: int = MAX_ERROR_BYTES,
    headers: Mapping[str, str] | None = None,
) -> Fetched:
    """`method url` within `deadline_s` in all (None: the caller's cancel scope bounds it),
    its body read to `max_bytes` (to `max_error_bytes` for a status >= 300); the rest is
    never read (the connection closes).

    Raises TimeoutError past the deadline, httpx.HTTPError as httpx does.
    """
    with anyio.fail_after(deadline_s):
        async with client.stream(method, url, headers=headers) as response:
            cap = max_bytes if response.status_code < 300 else max_error_bytes
            body = bytearray()
            async for piece in response.aiter_bytes():
                body += piece[: cap + 1 - len(body)]
                if len(body) > cap:
                    break
    cut = len(body) > cap
    del body[cap:]  # in place: a body near the cap is copied once, into bytes
    return Fetched(response.status_code, response.headers, bytes(body), cut)
