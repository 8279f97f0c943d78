"""Forward proxies (engine.proxy): the environment read as curl reads it, NO_PROXY, the
CONNECT framing, and the engine's connections through a scripted proxy (a tunnel for https,
absolute-form requests for http), warm ones included."""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.engine.preflight import check_connection, preflight
from loadgen.engine.proxy import (
    Proxy,
    ProxyRefused,
    ProxySettings,
    bypassed,
    connect_reply,
    connect_request,
    parse_proxy,
)
from loadgen.engine.tls import TlsSettings
from loadgen.engine.transport import (
    KERNEL_STAMPS_AVAILABLE,
    Pool,
    encode_request,
    make_endpoint,
    probe_request,
)
from loadgen.errors import ConfigError, OptionError, TargetError
from loadgen.results.records import Outcome
from loadgen.testing import (
    PlanFactory,
    ScriptedServer,
    engine_config,
    netpath,
    run_through,
    simple_chat,
)


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "direct"),
    [
        ("", "api.example.com", 443, False),
        ("*", "api.example.com", 443, True),
        ("example.com", "example.com", 443, True),
        ("example.com", "api.example.com", 443, True),  # a name matches its subdomains
        (".example.com", "api.example.com", 443, True),
        (".example.com", "example.com", 443, True),  # as curl since 7.86
        ("example.com", "badexample.com", 443, False),  # a suffix only on a dot
        ("EXAMPLE.com", "Api.Example.COM.", 443, True),  # case and a trailing dot
        ("a.test, example.com", "x.example.com", 443, True),  # comma and space separated
        ("a.test example.com", "x.example.com", 443, True),
        ("10.1.2.3", "10.1.2.3", 80, True),
        ("10.1.2.3", "10.1.2.4", 80, False),
        ("10.0.0.0/8", "10.200.0.1", 80, True),  # CIDR
        ("10.0.0.0/8", "11.0.0.1", 80, False),
        ("127.0.0.0/8", "localhost", 80, False),  # a block matches addresses, not names
        ("fd00::/8", "fd12::1", 443, True),
        ("::1", "::1", 443, True),
        ("[::1]", "[::1]", 443, True),
        ("example.com:8443", "example.com", 8443, True),  # with a port: that port only
        ("example.com:8443", "example.com", 443, False),
        ("[::1]:8443", "::1", 8443, True),
    ],
)
def test_no_proxy_entries(no_proxy: str, host: str, port: int, direct: bool) -> None:
    """NO_PROXY: *, names with their subdomains, IPs, CIDR blocks, optional ports."""
    assert bypassed(no_proxy, host, port) is direct


def settings(flag: str | None = None, **env: str) -> ProxySettings:
    return ProxySettings.from_environment(flag, environ=env)


def test_the_environment_is_read_as_curl_reads_it() -> None:
    """Scheme's variable, lower case first, then ALL_PROXY; --proxy first; none turns every
    proxy off; NO_PROXY applies to --proxy too; an empty variable is no proxy."""
    both = settings(https_proxy="http://low:1", HTTPS_PROXY="http://up:2", HTTP_PROXY="http://p:3")
    assert both.for_target("https", "h", 443) == Proxy(host="low", port=1, source="https_proxy")
    assert both.for_target("http", "h", 80) == Proxy(host="p", port=3, source="HTTP_PROXY")
    fallback = settings(ALL_PROXY="http://all:4", http_proxy="http://only-http:5")
    assert fallback.for_target("https", "h", 443) == Proxy(host="all", port=4, source="ALL_PROXY")
    flag = settings("http://flag:6", HTTPS_PROXY="http://env:7", no_proxy="h")
    assert flag.for_target("https", "other", 443) == Proxy(host="flag", port=6)
    assert flag.for_target("https", "h", 443) is None
    for off in ("none", "", "NONE"):
        assert settings(off, HTTPS_PROXY="http://env:7").for_target("https", "h", 443) is None
    assert settings(HTTPS_PROXY="").for_target("https", "h", 443) is None
    assert settings(no_proxy="a", NO_PROXY="h").no_proxy() == "a"  # lower case first


def test_a_proxy_url_as_curl_takes_it() -> None:
    """No scheme means http://, no port means 1080, user-info is percent-decoded."""
    assert parse_proxy("proxy.internal:3128", "--proxy") == Proxy(host="proxy.internal", port=3128)
    assert parse_proxy("http://proxy", "HTTPS_PROXY").port == 1080
    creds = parse_proxy("http://us%40er:p%3Ass@[::1]:8080", "--proxy")
    assert (creds.host, creds.port, creds.username, creds.password) == (
        "::1",
        8080,
        "us@er",
        "p:ss",
    )
    assert creds.address == "[::1]:8080"
    assert creds.shown == "http://[::1]:8080 (--proxy)"
    assert creds.authorization == "Basic " + base64.b64encode(b"us@er:p:ss").decode()


@pytest.mark.parametrize(
    ("given", "source", "kind", "said"),
    [
        (
            "socks5://user:hunter2@p:1080",
            "ALL_PROXY",
            ConfigError,
            "socks5:// proxies are not supported",
        ),
        (
            "https://user:hunter2@p:443",
            "--proxy",
            OptionError,
            "https:// proxies are not supported",
        ),
        ("http://user:hunter2@:3128", "HTTPS_PROXY", ConfigError, "names no host"),
        ("http://user:hunter2@p:99999", "--proxy", OptionError, "is not a proxy URL"),
    ],
)
def test_a_proxy_that_cannot_be_used_is_refused_without_its_password(
    given: str, source: str, kind: type[ConfigError], said: str
) -> None:
    """An unusable proxy names the flag or variable and the fix, and never shows its password."""
    with pytest.raises(kind) as refused:
        parse_proxy(given, source)
    assert refused.value.key == source
    assert said in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_connect_framing() -> None:
    """CONNECT host:port with Host, and Proxy-Authorization only when the URL has credentials;
    a 2xx reply opens the tunnel, anything else is a refusal with the fix."""
    plain = Proxy(host="p", port=3128)
    assert connect_request(plain, "api.example.com", 443) == (
        b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n"
        b"User-Agent: loadgen\r\n\r\n"
    )
    auth = Proxy(host="p", port=3128, username="u", password="pw")
    assert connect_request(auth, "::1", 8443).startswith(b"CONNECT [::1]:8443 HTTP/1.1\r\n")
    assert b"Proxy-Authorization: Basic dTpwdw==\r\n" in connect_request(auth, "h", 1)
    connect_reply(b"HTTP/1.1 200 Connection established", plain, "h", 443)
    connect_reply(b"HTTP/1.0 200 OK\r\nProxy-agent: x", plain, "h", 443)
    with pytest.raises(ProxyRefused, match=r"HTTP 407 .*put them in the proxy URL") as refused:
        connect_reply(b"HTTP/1.1 407 Proxy Authentication Required", plain, "h", 443)
    assert refused.value.status == 407
    with pytest.raises(ProxyRefused, match="did not accept the user and password"):
        connect_reply(b"HTTP/1.1 407 Proxy Authentication Required", auth, "h", 443)
    with pytest.raises(ProxyRefused, match=r"HTTP 403 .*NO_PROXY"):
        connect_reply(b"HTTP/1.1 403 Forbidden", plain, "h", 443)
    with pytest.raises(ProxyRefused, match="did not answer CONNECT in HTTP"):
        connect_reply(b"SSH-2.0-OpenSSH", plain, "h", 443)


# -- through a scripted proxy -------------------------------------------------------------
class RelayProxy:
    """A forward proxy on loopback: answers CONNECT with `status` (200: then relays bytes
    both ways), and keeps every request head it was asked."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.asked: list[bytes] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> RelayProxy:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tunnels(self) -> list[str]:
        return [h.split(b" ")[1].decode() for h in self.asked if h.startswith(b"CONNECT ")]

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.asked.append(head)
            target = head.split(b" ")[1].decode()
            if self.status != 200:
                writer.write(f"HTTP/1.1 {self.status} No\r\nContent-Length: 0\r\n\r\n".encode())
                return
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, TlsSettings]:
    """A server context for 127.0.0.1 and the client settings that trust its CA."""
    ca = trustme.CA()
    folder = tmp_path_factory.mktemp("ca")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    return server, TlsSettings(cacert=str(folder / "ca.pem"))


@pytest.fixture
def tls_server(tls: tuple[ssl.SSLContext, TlsSettings]) -> Iterator[ScriptedServer]:
    with ScriptedServer(lambda r: simple_chat(3), ssl=tls[0]) as server:
        yield server


def test_https_goes_through_one_tunnel_per_connection_warm_ones_included(
    tls_server: ScriptedServer, tls: tuple[ssl.SSLContext, TlsSettings]
) -> None:
    """Every connection to an https target behind a proxy is a CONNECT tunnel with TLS
    inside it (verified against the target's name); warm ones are opened through it before
    t0, and the requests on them are ok."""
    with RelayProxy() as proxy:
        endpoint = make_endpoint(tls_server.url, "/v1/chat/completions", {}, tls=tls[1],
                                 proxy=parse_proxy(proxy.url, "--proxy"))  # fmt: skip
        pool = Pool(endpoint)
        records = run_through(PlanFactory().at(0, 0, 0.05, 0.1), pool, engine_config(), warm=2)
    assert [r.outcome for r in records] == [Outcome.OK] * 4
    port = tls_server.port
    assert proxy.tunnels() == [f"127.0.0.1:{port}"] * pool.opened
    assert pool.warm_opened == 2
    assert not pool.kernel_stamps
    assert {r.connection for r in records[:2]} == {"warm"}
    assert all(r.path == "/v1/chat/completions" for r in tls_server.requests)  # origin form


def test_http_requests_go_to_the_proxy_in_absolute_form_with_its_credentials() -> None:
    """An http target behind a proxy: each request goes to the proxy with the absolute URL
    and Proxy-Authorization (here a scripted server plays the proxy and answers itself),
    on a kernel-stamped socket to the proxy."""
    with ScriptedServer(lambda r: simple_chat(2)) as proxy:
        endpoint = make_endpoint("http://origin.test:8000", "/v1/chat/completions", {},
                                 proxy=parse_proxy(f"http://u:pw@127.0.0.1:{proxy.port}",
                                                   "HTTP_PROXY"))  # fmt: skip
        pool = Pool(endpoint)
        records = run_through(PlanFactory().at(0, 0.05), pool, engine_config())
    assert [r.outcome for r in records] == [Outcome.OK] * 2
    seen = proxy.requests[0]
    assert seen.path == "http://origin.test:8000/v1/chat/completions"
    assert seen.headers["host"] == "origin.test:8000"
    assert seen.headers["proxy-authorization"] == "Basic " + base64.b64encode(b"u:pw").decode()
    assert pool.kernel_stamps is KERNEL_STAMPS_AVAILABLE  # http: stamped, to the proxy


def test_a_proxy_that_refuses_the_tunnel_is_named_with_its_fix(
    tls_server: ScriptedServer, tls: tuple[ssl.SSLContext, TlsSettings]
) -> None:
    """407 from the proxy: each request fails connect_error saying so (never the password);
    the check `run --no-preflight` makes before t0 and the preflight both stop there."""
    with RelayProxy(status=407) as proxy:
        given = proxy.url.replace("://", "://user:hunter2@")
        endpoint = make_endpoint(tls_server.url, "/v1/chat/completions", {}, tls=tls[1],
                                 proxy=parse_proxy(given, "HTTPS_PROXY"))  # fmt: skip
        records = run_through(PlanFactory().at(0), Pool(endpoint), engine_config())
        with pytest.raises(TargetError) as checked:
            check_connection(endpoint, timeout_s=10)
        with pytest.raises(TargetError) as preflighted:
            preflight(endpoint, adapter_for("openai-chat"), BodyOptions(model="m"), timeout_s=10)
    (record,) = records
    assert record.outcome is Outcome.CONNECT_ERROR
    for said in (record.error or "", str(checked.value), str(preflighted.value)):
        assert f"the proxy http://127.0.0.1:{proxy.port} (HTTPS_PROXY) refused the tunnel" in said
        assert "HTTP 407" in said
        assert "did not accept the user and password" in said
        assert "hunter2" not in said
    assert not tls_server.requests


def test_the_probe_carries_no_credential(tmp_path: Path) -> None:
    """The diagnostic probe's request: the path without its query, loadgen's own headers,
    an empty body; not the user's headers, the key, the query or the URL's user-info."""
    endpoint = make_endpoint("https://user:pw@h.test/v1?api-key=k3y", "/chat/completions",
                             {"Authorization": "Bearer sk-1", "X-Tenant-Key": "t-2"})  # fmt: skip
    probe = probe_request(endpoint).decode()
    assert probe.startswith("POST /v1/chat/completions HTTP/1.1\r\nHost: h.test\r\n")
    assert probe.endswith("\r\n\r\n{}")
    for secret in ("sk-1", "t-2", "k3y", "Authorization", "cHc", "user"):
        assert secret not in probe, secret
    behind = make_endpoint("http://h.test", "/v1/chat/completions", {"Authorization": "Bearer sk-1"},
                           proxy=Proxy(host="p", port=1, username="u", password="pw"))  # fmt: skip
    probe = probe_request(behind).decode()
    assert probe.startswith("POST http://h.test/v1/chat/completions HTTP/1.1\r\n")
    assert "Proxy-Authorization: Basic dTpwdw==" in probe
    assert "sk-1" not in probe
    request = encode_request(behind, b"{}", {}).decode()  # the engine's own: both headers
    assert "Authorization: Bearer sk-1" in request
    assert "Proxy-Authorization" in request


def test_a_proxy_that_is_not_there_is_named_not_the_target() -> None:
    """Nothing listens at the proxy's address: the preflight and each record name the proxy."""
    port = netpath.free_port()
    endpoint = make_endpoint("http://origin.test:8000", "/v1/chat/completions", {},
                             proxy=parse_proxy(f"127.0.0.1:{port}", "--proxy"))  # fmt: skip
    with pytest.raises(TargetError) as refused:
        preflight(endpoint, adapter_for("openai-chat"), BodyOptions(model="m"), timeout_s=10)
    assert str(refused.value).startswith(
        f"cannot connect to the proxy http://127.0.0.1:{port} (--proxy): "
    )
    (record,) = run_through(PlanFactory().at(0), Pool(endpoint), engine_config())
    assert record.outcome is Outcome.CONNECT_ERROR
    assert f"(through the proxy http://127.0.0.1:{port} (--proxy))" in (record.error or "")
