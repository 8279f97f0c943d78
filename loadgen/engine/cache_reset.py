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
(exit 1): a run that says `reset` must not run warm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import httpx

from loadgen.errors import TargetError

RESET_ENDPOINTS: dict[str, str] = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
NOT_HERE = (404, 405)  # this server has no such endpoint: try the next
RESET_TIMEOUT_S = 30.0


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
    transport: httpx.BaseTransport | None = None,
) -> str:
    """POST the reset endpoints in `reset_order` until one answers 2xx; returns what it
    said (`POST /reset_prefix_cache: HTTP 200`). TargetError when none can."""
    tried: list[str] = []
    with httpx.Client(timeout=RESET_TIMEOUT_S, transport=transport) as client:
        for path in reset_order(family):
            try:
                response = client.post(origin + path, headers=dict(headers))
            except httpx.HTTPError as exc:
                raise TargetError(redact(
                    f"cache: reset: POST {origin}{path} failed ({type(exc).__name__}: {exc}); "
                    "run with --cache cold to start cold without a reset"
                )) from None  # fmt: skip
            said = f"POST {path}: HTTP {response.status_code}"
            if response.is_success:
                return said
            if response.status_code not in NOT_HERE:
                body = " ".join(response.text.split())[:200]
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
