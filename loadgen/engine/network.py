"""The run's network settings, TLS and forward proxies, as each kind of client takes them.

One `Network` per command (`--cacert`, `--cert`/`--key`, `--insecure`, `--proxy` and the
environment, read once), carried to every process of the run. The engine's own client
takes them on its `Endpoint` (`transport.make_endpoint`); the httpx clients (the preflight,
the scraper, the cache reset) get `httpx_options`; the OTLP push, which the OpenTelemetry
SDK sends with requests, gets `requests_session`. None of them reads the environment on
its own (`trust_env` off), so no part trusts, or proxies, differently from another.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from loadgen.engine.proxy import Proxy, ProxySettings
from loadgen.engine.tls import TlsSettings, client_context, fresh_context


@dataclass(frozen=True, slots=True, kw_only=True)
class Network:
    """TLS and proxy settings of one command (a value: picklable, hashable)."""

    tls: TlsSettings = field(default_factory=TlsSettings)
    proxies: ProxySettings = field(default_factory=ProxySettings)

    def direct(self) -> Network:
        """These settings with no proxy at all (the built-in simulator, on loopback)."""
        return replace(self, proxies=ProxySettings(flag="none"))

    def proxy_for(self, url: str) -> Proxy | None:
        """The proxy a connection to `url` goes through (None: direct). ConfigError when the
        proxy given for it is unusable."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port or (443 if scheme == "https" else 80)
        return self.proxies.for_target(scheme, parts.hostname or "", port)

    def httpx_options(self, url: str, *, redirects: bool = False) -> dict[str, Any]:
        """httpx `Client`/`AsyncClient` keyword arguments for requests to `url` (and, with
        `redirects`, wherever it redirects: a TLS context even for an http URL)."""
        scheme = "https" if redirects else urlsplit(url).scheme.lower()
        return httpx_options(scheme, self.tls, self.proxy_for(url))

    def requests_session(self, url: str) -> Any:
        """A `requests.Session` for requests to `url`: this TLS trust (a context of its own:
        urllib3 sets its verify mode on the context it is given) and this proxy."""
        import requests
        from requests.adapters import HTTPAdapter

        context = fresh_context(self.tls)

        class _Adapter(HTTPAdapter):
            def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
                kwargs["ssl_context"] = context
                super().init_poolmanager(*args, **kwargs)

            def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
                conn.cert_reqs = context.verify_mode  # no CA bundle of requests' own

        session = requests.Session()
        session.trust_env = False
        session.verify = not self.tls.insecure
        session.mount("https://", _Adapter())
        proxy = self.proxy_for(url)
        if proxy is not None:
            session.proxies = {urlsplit(url).scheme.lower(): proxy.url}
        return session


def httpx_options(scheme: str, tls: TlsSettings, proxy: Proxy | None) -> dict[str, Any]:
    """httpx keyword arguments: the run's TLS context for https (plain http gets none:
    httpx would build one eagerly, ~16 ms), the proxy, and nothing from the environment."""
    options: dict[str, Any] = {"trust_env": False}
    options["verify"] = client_context(tls) if scheme == "https" else False
    if proxy is not None:
        options["proxy"] = proxy.url
    return options
