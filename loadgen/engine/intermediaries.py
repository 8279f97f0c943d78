"""What an intermediary's error page says: a reverse proxy's 502/504 is not the server's.

A reverse proxy, ingress or CDN answers for the server when the server does not: 504 when
it waited too long (nginx's `proxy_read_timeout`), 502 when the server refused, reset or
closed, 503 when it has no server to send to. Its page names it (`Server: nginx`, nginx's
`<center>nginx</center>`, Envoy's `upstream request timeout`, ...). A TLS-terminating nginx
also answers 400 for the client's TLS (a missing or refused client certificate, plain HTTP
to its https port). `explain` turns such an answer into what it means and what to change;
it reads only the status, two headers and the start of the body the caller already kept.
"""

from __future__ import annotations

import re

# Who answered, from the Server or Via header or the page itself: (pattern, name).
_SIGNATURES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), name)
    for pattern, name in (
        (r"\bopenresty\b", "OpenResty (nginx)"),
        (r"\bnginx\b", "nginx"),
        (r"\benvoy\b|upstream connect error or disconnect/reset|upstream request timeout",
         "Envoy"),
        (r"\bhaproxy\b|the server didn't respond in time", "HAProxy"),
        (r"\bcloudflare\b", "Cloudflare"),
        (r"\bawselb\b", "an AWS load balancer"),
        (r"\bcloudfront\b", "CloudFront"),
        (r"\btraefik\b", "Traefik"),
        (r"\bcaddy\b", "Caddy"),
        (r"\bkong\b", "Kong"),
        (r"\bvarnish\b", "Varnish"),
        (r"\bapache\b", "Apache"),
        (r"\bsquid\b", "Squid"),
        (r"\btinyproxy\b", "tinyproxy"),
    )
)  # fmt: skip
_TIMEOUTS = {
    "nginx": "nginx's proxy_read_timeout (60 s by default)",
    "OpenResty (nginx)": "nginx's proxy_read_timeout (60 s by default)",
    "Envoy": "Envoy's route timeout (15 s by default) and stream_idle_timeout",
    "HAProxy": "HAProxy's timeout server",
    "an AWS load balancer": "the load balancer's idle timeout (60 s by default)",
    "Cloudflare": "Cloudflare's proxy read timeout (100 s)",
    "Traefik": "Traefik's responding timeouts",
    "Apache": "Apache's ProxyTimeout",
}


def who(server: str | None, via: str | None, body: str) -> str | None:
    """The intermediary an answer names (by its Server or Via header or its page), or None."""
    for text in (server or "", via or "", body[:2048]):
        for pattern, name in _SIGNATURES:
            if text and pattern.search(text):
                return name
    return None


def explain(status: int, server: str | None, via: str | None, body: str) -> str | None:
    """What a 4xx/5xx that an intermediary wrote means, and the fix; None when nothing says
    it came from one (or it means nothing in particular)."""
    low = body.lower()
    if status == 400 and "no required ssl certificate was sent" in low:
        return ("the TLS proxy in front (nginx) requires a client certificate and got none: "
                "pass --cert FILE --key FILE (mutual TLS)")  # fmt: skip
    if status == 400 and "ssl certificate error" in low:
        return ("the TLS proxy in front (nginx) refused this client's certificate (its "
                "client CA did not sign it, or it expired): pass one it accepts with "
                "--cert/--key")  # fmt: skip
    if status == 400 and "plain http request was sent to https port" in low:
        return "plain HTTP was sent to an https port: use https:// in --url"
    if status == 407:
        return ("a forward proxy asks for credentials: put them in the proxy URL "
                "(--proxy or HTTP(S)_PROXY: http://USER:PASSWORD@host:port)")  # fmt: skip
    if status not in (502, 503, 504):
        return None
    name = who(server, via, body)
    if name is None:
        return None
    timeout = _TIMEOUTS.get(name, "its upstream read timeout")
    page = f"an error page from {name}, not from the server: the proxy in front"
    if status == 504:
        return (f"{page} gave up waiting for the server; if the server is only slow (a long "
                f"prefill, a queue), raise {timeout} above its longest wait")  # fmt: skip
    if status == 502:
        return (f"{page} got no valid answer from the server (refused, reset or closed "
                f"early, or past {timeout}): check the server behind it and the proxy's "
                "error log")  # fmt: skip
    return f"{page} has no server to send to, or sheds load: check the server behind it"
