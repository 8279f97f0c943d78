"""A request as HTTP/1.1 bytes: the header lines every POST loadgen sends (the engine's and
the preflight's are the same bytes), in origin form, or absolute form with the proxy's
credentials when it goes to an http proxy."""

from __future__ import annotations

from collections.abc import Mapping

from loadgen.engine.transport.endpoint import Endpoint, host_header


def request_headers(
    endpoint: Endpoint, body_bytes: int, extra: Mapping[str, str]
) -> list[tuple[str, str]]:
    """The headers of every POST loadgen sends, in order: the engine's requests and the
    preflight's are the same bytes (Accept-Encoding only when the endpoint's headers carry
    it: `target.accept_encoding`, `--accept-encoding`). A proxy's own header
    (`Proxy-Authorization`) is the connection's: `encode_request` adds it."""
    headers = [
        ("Host", host_header(endpoint)),
        ("Content-Type", "application/json"),
        ("Accept", "text/event-stream"),
        ("Content-Length", str(body_bytes)),
        ("User-Agent", "loadgen"),
    ]
    headers.extend(endpoint.headers.items())
    headers.extend(extra.items())
    return headers


def encode_request(
    endpoint: Endpoint, body: bytes, extra: Mapping[str, str], target: str | None = None
) -> bytes:
    """A POST request with a JSON body to `target` (default: the endpoint's), as bytes (in
    absolute form, with the proxy's credentials, when it goes to an http proxy)."""
    line_target = endpoint.line_target(endpoint.target if target is None else target)
    lines = [f"POST {line_target} HTTP/1.1"]
    lines.extend(f"{k}: {v}" for k, v in request_headers(endpoint, len(body), extra))
    lines.extend(proxy_headers(endpoint))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def proxy_headers(endpoint: Endpoint) -> list[str]:
    """`Proxy-Authorization` for a request sent to an http proxy (a tunnel's is in its
    CONNECT, never inside TLS)."""
    proxy = endpoint.proxy
    if proxy is None or endpoint.scheme == "https" or proxy.authorization is None:
        return []
    return [f"Proxy-Authorization: {proxy.authorization}"]
