"""Where requests go: the `Endpoint` (scheme, host, port, request target, fixed headers, the
TLS settings and the proxy on the way) and the URL helpers that make one from `--url`."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

from loadgen.engine.proxy import Proxy
from loadgen.engine.tls import TlsSettings
from loadgen.workload.spec import redact_url


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """Where requests go: scheme, host, port, the request target path and fixed headers;
    the TLS settings of an https endpoint and the forward proxy on the way, if any."""

    scheme: str
    host: str
    port: int
    # The run's path + query, as sent on the request line, unless the adapter makes each
    # request's from it (`Adapter.target`: a model in the path).
    target: str
    headers: Mapping[str, str] = field(default_factory=dict)
    tls: TlsSettings = field(default_factory=TlsSettings)
    proxy: Proxy | None = None  # None: connections go straight to host:port

    @property
    def origin(self) -> str:
        """scheme://host:port (no credentials, no path), for messages and run.json."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def tunnelled(self) -> bool:
        """https through a proxy: a CONNECT tunnel, TLS inside it."""
        return self.proxy is not None and self.scheme == "https"

    @property
    def request_target(self) -> str:
        """The request line's target for the endpoint's own path (`line_target`)."""
        return self.line_target(self.target)

    def line_target(self, target: str) -> str:
        """The request line's target for `target` (a path and query on this endpoint): the
        path, or the absolute URL for an http proxy."""
        if self.proxy is None or self.scheme == "https":
            return target
        return f"http://{host_header(self)}{target}"


def split_url(url: str) -> SplitResult:
    """Parse a base URL; raise ValueError with a fixable message when it is not http(s)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"URL must look like http://host:port (got {redact_url(url)!r})")
    return parts


def make_endpoint(
    url: str, path: str, headers: Mapping[str, str], *, tls: TlsSettings | None = None,
    proxy: Proxy | None = None,
) -> Endpoint:  # fmt: skip
    """An endpoint from a base URL and the request path; URL user-info becomes Basic auth."""
    parts = split_url(url)
    base = parts.path.rstrip("/")
    if base and path.startswith(base + "/"):
        full = path  # the URL already holds the path's prefix, e.g. .../v1
    elif base.endswith(path):
        full = base  # the URL is the full endpoint
    elif base.endswith("/v1") and path.startswith("/v1/"):
        full = base + path[3:]
    else:
        full = base + path
    if parts.query:  # the URL's query after the path's own (`?alt=sse` in an API's path)
        full += f"{'&' if '?' in full else '?'}{parts.query}"
    target = full
    all_headers = dict(headers)
    if parts.username is not None:
        creds = f"{parts.username}:{parts.password or ''}".encode()
        all_headers.setdefault("Authorization", "Basic " + base64.b64encode(creds).decode())
    scheme = parts.scheme
    port = parts.port or (443 if scheme == "https" else 80)
    return Endpoint(
        scheme=scheme, host=parts.hostname or "", port=port, target=target, headers=all_headers,
        tls=tls or TlsSettings(), proxy=proxy,
    )  # fmt: skip


def host_header(endpoint: Endpoint) -> str:
    """The Host header's value: host, and the port unless it is the scheme's default."""
    default_port = 443 if endpoint.scheme == "https" else 80
    host = endpoint.host if ":" not in endpoint.host else f"[{endpoint.host}]"
    return host if endpoint.port == default_port else f"{host}:{endpoint.port}"
