"""Ask the server to empty its prefix cache, before a `cache: reset` run or capacity step.

Part of a run's setup, after the preflight (whose request would otherwise be cached) and
before t0. Servers that offer it (docs/cache-warmth.md):

| server | endpoint | note |
|---|---|---|
| vLLM | `POST /reset_prefix_cache` | served only when started with `VLLM_SERVER_DEV_MODE=1` |
| SGLang | `POST /flush_cache` | refused (HTTP 400) while requests are running |
| `loadgen sim` | `POST /reset_prefix_cache` | empties its prefix cache, keeps its counters |

When the run knows the server's kind (the first scrape of its /metrics), that server's
endpoint is asked first; else vLLM's, then SGLang's. A 404 or 405 from one tries the next;
any other answer is final. No endpoint, or a refusal, is an error before any traffic
(exit 1): a run that says `reset` must not run warm. The whole reset (every endpoint asked)
has `RESET_TIMEOUT_S`, however slowly the server answers (`engine.fetch`: a total deadline,
not httpx's per-read one), and a refusal's body is read to 2 KiB, of which 200 characters
are quoted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from urllib.parse import urlsplit

import anyio
import httpx

from loadgen.engine.fetch import MAX_ERROR_BYTES, fetch
from loadgen.engine.network import Network
from loadgen.engine.tls import find_verify_error, verify_failure
from loadgen.errors import TargetError

RESET_ENDPOINTS: dict[str, str] = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
NOT_HERE = (404, 405)  # this server has no such endpoint: try the next
RESET_TIMEOUT_S = 30.0  # for the whole reset: connecting, every answer and its body


def reset_order(family: str | None) -> list[str]:
    """The endpoints to try, the server's own first when its kind is known."""
    paths = list(RESET_ENDPOINTS.values())
    own = RESET_ENDPOINTS.get(family or "")
    return [own, *(p for p in paths if p != own)] if own else paths


def reset_prefix_cache(
    origin: str,
    headers: Mapping[str, str],
    *,
    family: str | None = None,
    redact: Callable[[str], str] = str,
    transport: httpx.AsyncBaseTransport | None = None,
    deadline_s: float | None = None,
    network: Network | None = None,
) -> str:
    """POST the reset endpoints in `reset_order` until one answers 2xx, all within
    `deadline_s` (`RESET_TIMEOUT_S` by default); returns what it said (`POST
    /reset_prefix_cache: HTTP 200`). TargetError when none can. The requests go as the
    run's (`network`: its TLS trust and proxy)."""
    deadline_s = RESET_TIMEOUT_S if deadline_s is None else deadline_s
    network = network if network is not None else Network()
    ask = partial(_ask, origin, dict(headers), family, redact, transport, network)
    try:
        return anyio.run(ask, deadline_s, backend="asyncio")
    except TimeoutError:
        raise TargetError(
            f"cache: reset: {origin} did not answer the prefix-cache reset within "
            f"{deadline_s:g} s (all of it: connecting, the answer and its body); run with "
            "--cache cold to start cold without a reset"
        ) from None


async def _ask(
    origin: str,
    headers: dict[str, str],
    family: str | None,
    redact: Callable[[str], str],
    transport: httpx.AsyncBaseTransport | None,
    network: Network,
    deadline_s: float,
) -> str:
    tried: list[str] = []
    options = network.httpx_options(origin)
    with anyio.fail_after(deadline_s):
        async with httpx.AsyncClient(timeout=deadline_s, transport=transport, **options) as client:
            for path in reset_order(family):
                try:
                    got = await fetch(client, "POST", origin + path, headers=headers,
                                      deadline_s=None, max_bytes=MAX_ERROR_BYTES)  # fmt: skip
                except httpx.HTTPError as exc:
                    why = f"{type(exc).__name__}: {exc}"
                    if (failed := find_verify_error(exc)) is not None:
                        host = urlsplit(origin).hostname or ""
                        why = verify_failure(failed, origin.split("://", 1)[-1], network.tls,
                                             host=host)  # fmt: skip
                    raise TargetError(redact(
                        f"cache: reset: POST {origin}{path} failed ({why}); run with --cache "
                        "cold to start cold without a reset"
                    )) from None  # fmt: skip
                said = f"POST {path}: HTTP {got.status}"
                if 200 <= got.status < 300:
                    return said
                if got.status not in NOT_HERE:
                    body = " ".join(got.body.decode("utf-8", "replace").split())[:200]
                    raise TargetError(redact(
                        f"cache: reset: {origin} refused to reset its prefix cache ({said}"
                        f"{': ' + body if body else ''}); run with --cache cold to start cold "
                        "without a reset"
                    ))  # fmt: skip
                tried.append(said)
    raise TargetError(
        f"cache: reset: {origin} offers no prefix-cache reset ({'; '.join(tried)}): vLLM "
        "serves POST /reset_prefix_cache only when started with VLLM_SERVER_DEV_MODE=1, "
        "SGLang serves POST /flush_cache; start the server so, or run with --cache cold"
    )
