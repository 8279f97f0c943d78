"""The run's other clients use its one TLS trust (engine.network): the server-metrics
scraper, the cache reset and the OTLP push verify with --cacert (a private CA that neither
certifi's bundle nor the system store holds), and name a certificate failure as the engine
does."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from loadgen.engine.cache_reset import reset_prefix_cache
from loadgen.engine.network import Network
from loadgen.engine.proxy import ProxySettings
from loadgen.engine.scrape import Scraper
from loadgen.engine.tls import TlsSettings
from loadgen.errors import TargetError
from loadgen.testing import ReceivedRequest, ScriptedServer, Step

METRICS = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"


def answer(request: ReceivedRequest) -> Iterator[Step]:
    body = METRICS if request.method == "GET" else b"{}"
    yield b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def trusted(ca: trustme.CA, tmp_path: Path) -> Network:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return Network(tls=TlsSettings(cacert=str(tmp_path / "ca.pem")))


@pytest.fixture
def server(ca: trustme.CA) -> Iterator[ScriptedServer]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with ScriptedServer(answer, ssl=context) as scripted:
        yield scripted


def scrape_once(url: str, network: Network) -> Scraper:
    scraper = Scraper(url, 60.0, network=network, timeout_s=5)
    scraper.start()
    assert scraper.first_done.wait(10)
    scraper.stop()
    return scraper


def test_the_scraper_verifies_with_the_runs_trust(server: ScriptedServer, trusted: Network) -> None:
    """With --cacert the https scrape is kept; with the system store it fails as a
    certificate failure named like the engine's, with the fix."""
    kept = scrape_once(f"{server.url}/metrics", trusted)
    assert kept.failures == 0
    assert kept.scrapes >= 1  # the first, and the last one `stop` takes
    refused = scrape_once(f"{server.url}/metrics", Network())
    assert set(refused.failed_by) == {"certificate"}
    assert refused.scrapes == 0
    note = refused.access().problem or ""
    assert "failed verification: unknown issuer" in note
    assert "--cacert CA.pem" in note


def test_the_cache_reset_verifies_with_the_runs_trust(
    server: ScriptedServer, trusted: Network
) -> None:
    """The reset is sent over the run's trust; an untrusted certificate stops it with the
    cause (exit 1), not with httpx's bare ConnectError."""
    said = reset_prefix_cache(server.url, {}, network=trusted)
    assert said == "POST /reset_prefix_cache: HTTP 200"
    with pytest.raises(TargetError, match="failed verification: unknown issuer"):
        reset_prefix_cache(server.url, {}, network=Network())


def test_the_otlp_push_verifies_with_the_runs_trust(ca: trustme.CA, trusted: Network) -> None:
    """The OTLP exporter's requests session takes the run's context: a collector whose
    certificate only --cacert trusts takes the push (requests' own CA bundle would refuse it)."""
    otlp = pytest.importorskip("loadgen.run.otlp")
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(len(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    collector = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    collector.socket = context.wrap_socket(collector.socket, server_side=True)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    endpoint = f"https://127.0.0.1:{collector.server_address[1]}/v1/metrics"
    push = otlp.OtlpPush(endpoint, list, interval_s=3600, network=trusted)
    try:
        assert push.push()
    finally:
        push.close()
        collector.shutdown()
        collector.server_close()
    assert len(got) >= 1
    assert push.failures == 0


def test_the_scraper_and_the_otlp_push_go_through_the_runs_proxy(trusted: Network) -> None:
    """With a proxy for http (here a recording server plays it), the scrape and the OTLP push
    are sent to it in absolute form with its credentials, as the engine's requests are."""
    otlp = pytest.importorskip("loadgen.run.otlp")
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[tuple[str, str | None]] = []

    class Proxy(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append((self.requestline, self.headers.get("Proxy-Authorization")))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = METRICS if self.command == "GET" else b""
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    env = {"http_proxy": f"http://u:pw@127.0.0.1:{proxy.server_address[1]}"}
    network = Network(tls=trusted.tls, proxies=ProxySettings.from_environment(environ=env))
    try:
        scraped = scrape_once("http://metrics.test:9400/metrics", network)
        push = otlp.OtlpPush("http://collector.test:4318/v1/metrics", list, interval_s=3600,
                             network=network)  # fmt: skip
        pushed = push.push()
        push.close()
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert scraped.failures == 0
    assert pushed
    lines = {line for line, _ in seen}
    assert "GET http://metrics.test:9400/metrics HTTP/1.1" in lines
    assert "POST http://collector.test:4318/v1/metrics HTTP/1.1" in lines
    assert {auth for _, auth in seen} == {"Basic dTpwdw=="}
