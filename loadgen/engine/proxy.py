"""Forward proxies: which one a connection goes through, and the CONNECT tunnel.

Read as curl reads them: `--proxy URL` first, else the environment, lower case before
upper case: `https_proxy`/`HTTPS_PROXY` for https targets, `http_proxy`/`HTTP_PROXY` for
http ones, then `all_proxy`/`ALL_PROXY` for both; `no_proxy`/`NO_PROXY` (which also applies
to `--proxy`) lists the hosts reached directly. `--proxy none` (or `--proxy ''`, as curl
takes it) turns every proxy off, the environment's included. The environment is read once
when the command starts (`ProxySettings.from_environment`) and carried to every process.

A proxy is spoken to in plain HTTP/1.1 (`http://[user:password@]host[:port]`, port 1080
when none is given, as curl's default). An https target is reached through a CONNECT
tunnel, with TLS inside it verified against the target's own name; an http target's
requests are sent to the proxy in absolute form (`POST http://host:port/path HTTP/1.1`).
The proxy URL's user-info becomes `Proxy-Authorization: Basic …`, a secret like every
other (`secrets`); a proxy is shown and recorded without it (`Proxy.shown`).

NO_PROXY entries (comma or space separated, case-insensitive): `*` (every host); a name,
matching itself and every subdomain (`example.com`, `.example.com`); an IP address; a CIDR
block (`10.0.0.0/8`, `fd00::/8`); any of them with `:port` to match that port only.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from loadgen.errors import ConfigError, OptionError

DEFAULT_PROXY_PORT = 1080  # curl's, when a proxy URL names no port
OFF = ("", "none")  # --proxy values that turn proxies off
ENV_NAMES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
             "no_proxy", "NO_PROXY")  # fmt: skip
MAX_CONNECT_REPLY = 64 * 1024  # a CONNECT reply's head past this is no reply


@dataclass(frozen=True, slots=True, kw_only=True)
class Proxy:
    """One forward proxy: where it listens, its credentials, and where it was named."""

    host: str
    port: int
    username: str | None = None
    password: str | None = None
    source: str = "--proxy"  # the flag or variable that named it

    @property
    def address(self) -> str:
        """host:port, IPv6 in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def shown(self) -> str:
        """The proxy as messages and run.json show it: no credentials, and where it came from."""
        return f"http://{self.address} ({self.source})"

    @property
    def url(self) -> str:
        """The proxy's URL with its credentials (for httpx and requests: never shown)."""
        if self.username is None:
            return f"http://{self.address}"
        auth = quote(self.username, safe="") + ":" + quote(self.password or "", safe="")
        return f"http://{auth}@{self.address}"

    @property
    def authorization(self) -> str | None:
        """The Proxy-Authorization header's value, or None without credentials."""
        if self.username is None:
            return None
        token = f"{self.username}:{self.password or ''}".encode()
        return "Basic " + base64.b64encode(token).decode()


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxySettings:
    """`--proxy` as given (None: not given) and the proxy variables of the environment."""

    flag: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_environment(
        cls, flag: str | None = None, environ: Mapping[str, str] | None = None
    ) -> ProxySettings:
        """The settings of `--proxy` and this process's environment."""
        env = os.environ if environ is None else environ
        return cls(flag=flag, env=tuple((k, env[k]) for k in ENV_NAMES if k in env))

    @property
    def off(self) -> bool:
        """`--proxy none`: no proxy whatever the environment says."""
        return self.flag is not None and self.flag.strip().lower() in OFF

    def _get(self, *names: str) -> tuple[str, str] | None:
        """The first of `names` set in the environment (even empty), with its value."""
        values = dict(self.env)
        for name in names:
            if name in values:
                return name, values[name]
        return None

    def no_proxy(self) -> str:
        """NO_PROXY as set (lower case first), or ''."""
        found = self._get("no_proxy", "NO_PROXY")
        return found[1] if found else ""

    def configured(self, scheme: str) -> Proxy | None:
        """The proxy for `scheme` targets before NO_PROXY, or None (ConfigError if unusable)."""
        if self.off:
            return None
        if self.flag is not None:
            return parse_proxy(self.flag, "--proxy")
        lower = f"{scheme}_proxy"
        found = self._get(lower, lower.upper()) or self._get("all_proxy", "ALL_PROXY")
        if found is None or not found[1].strip():
            return None
        return parse_proxy(found[1], found[0])

    def for_target(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy a connection to scheme://host:port goes through, or None (direct)."""
        proxy = self.configured(scheme)
        if proxy is None or bypassed(self.no_proxy(), host, port):
            return None
        return proxy

    def urls(self) -> list[str]:
        """Every proxy URL given (flag and environment), for the run's secrets."""
        values = [] if self.flag is None or self.off else [self.flag]
        values += [v for k, v in self.env if not k.lower().startswith("no_")]
        return [v if "://" in v else f"http://{v}" for v in values if v.strip()]


def parse_proxy(text: str, source: str) -> Proxy:
    """A proxy URL as curl takes it (`http://` assumed when no scheme is given)."""
    given = text.strip()
    url = given if "://" in given else f"http://{given}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _refused(source, f"{_quoted(given)} is not a proxy URL ({exc})") from None
    if parts.scheme.lower() != "http":
        raise _refused(
            source, f"{parts.scheme}:// proxies are not supported (got {_quoted(given)})",
            "loadgen speaks to a forward proxy in plain HTTP: give http://host:port",
        )  # fmt: skip
    if not parts.hostname:
        raise _refused(source, f"{_quoted(given)} names no host")
    return Proxy(
        host=parts.hostname, port=port or DEFAULT_PROXY_PORT,
        username=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        source=source,
    )  # fmt: skip


def _quoted(text: str) -> str:
    """A proxy URL as an error may quote it: without its user-info."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    netloc, slash, path = rest.partition("/")
    netloc = netloc.rpartition("@")[2]
    return repr(f"{scheme}{sep}{netloc}{slash}{path}")


def _refused(source: str, problem: str, fix: str = "") -> ConfigError:
    fix = fix or "give http://[user:password@]host:port"
    if source.startswith("--"):
        return OptionError(source, problem, fix + ", or --proxy none for no proxy")
    return ConfigError("environment", source, problem, fix + ", or unset it (or list the "
                       "target's host in NO_PROXY)")  # fmt: skip


# -- NO_PROXY ----------------------------------------------------------------------------
def bypassed(no_proxy: str, host: str, port: int) -> bool:
    """Does NO_PROXY (`no_proxy`) send a connection to host:port direct?"""
    host = host.strip("[]").rstrip(".").lower()
    address = _ip(host)
    for entry in no_proxy.replace(",", " ").split():
        if entry == "*":
            return True
        name, entry_port = _split_port(entry.lower())
        if entry_port is not None and entry_port != port:
            continue
        name = name.strip("[]").lstrip(".").rstrip(".")
        if not name:
            continue
        if "/" in name:
            if address is not None and _in_block(address, name):
                return True
        elif (entry_ip := _ip(name)) is not None:
            if address is not None and address == entry_ip:
                return True
        elif host == name or host.endswith("." + name):
            return True
    return False


def _split_port(entry: str) -> tuple[str, int | None]:
    """`name:port` or `[v6]:port` → (name, port); a bare IPv6 address keeps its colons."""
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return name, int(port) if port.isdigit() else None
    if entry.count(":") == 1:
        name, _, port = entry.partition(":")
        return name, int(port) if port.isdigit() else None
    return entry, None


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _in_block(address: ipaddress.IPv4Address | ipaddress.IPv6Address, block: str) -> bool:
    try:
        network = ipaddress.ip_network(block, strict=False)
    except ValueError:
        return False
    return address.version == network.version and address in network


# -- the CONNECT tunnel --------------------------------------------------------------------
class ProxyRefused(OSError):
    """The proxy answered a CONNECT with something other than 2xx (or not HTTP at all)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def connect_request(proxy: Proxy, host: str, port: int) -> bytes:
    """The CONNECT request that opens a tunnel to host:port."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}", "User-Agent: loadgen"]
    if (authorization := proxy.authorization) is not None:
        lines.append(f"Proxy-Authorization: {authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def connect_reply(head: bytes, proxy: Proxy, host: str, port: int) -> None:
    """Check a CONNECT reply's head (up to its blank line); ProxyRefused unless it is 2xx."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProxyRefused(f"the proxy {proxy.shown} did not answer CONNECT in HTTP "
                           f"(it began {line[:60]!r})")  # fmt: skip
    status = int(parts[1])
    if 200 <= status < 300:
        return
    reason = parts[2].strip() if len(parts) > 2 else ""
    raise ProxyRefused(
        f"the proxy {proxy.shown} refused the tunnel to {host}:{port}: HTTP {status}"
        f"{' ' + reason[:80] if reason else ''} ({refusal_hint(status, proxy)})",
        status,
    )


def refusal_hint(status: int, proxy: Proxy) -> str:
    """What a proxy's refusal means and how to fix it."""
    if status == 407:
        if proxy.username is None:
            return (
                "it asks for credentials: put them in the proxy URL, http://USER:PASSWORD@host:port"
            )
        return "it did not accept the user and password of the proxy URL"
    if status == 403:
        return ("its rules forbid this destination or port (e.g. tinyproxy's ConnectPort, "
                "squid's SSL_ports): allow it there, or list the host in NO_PROXY")  # fmt: skip
    if status in (502, 503, 504):
        return "it could not reach the target: check --url, and the proxy's own route to it"
    return "see the proxy's log"


async def open_tunnel(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, proxy: Proxy, host: str, port: int
) -> None:
    """Ask the proxy, on `sock` (connected to it, non-blocking), for a tunnel to host:port
    and read its reply; ProxyRefused when it declines. Reads only the reply's head: a proxy
    sends nothing after it until the client speaks."""
    await loop.sock_sendall(sock, connect_request(proxy, host, port))
    head = b""
    while b"\r\n\r\n" not in head:
        data = await loop.sock_recv(sock, 4096)
        if not data:
            raise ProxyRefused(f"the proxy {proxy.shown} closed the connection instead of "
                               f"answering CONNECT {host}:{port}")  # fmt: skip
        head += data
        if len(head) > MAX_CONNECT_REPLY:
            raise ProxyRefused(f"the proxy {proxy.shown}'s CONNECT reply is over 64 KiB")
    head, _, rest = head.partition(b"\r\n\r\n")
    connect_reply(head, proxy, host, port)
    if rest:
        raise ProxyRefused(f"the proxy {proxy.shown} sent bytes after its CONNECT reply, "
                           "before the TLS handshake")  # fmt: skip
