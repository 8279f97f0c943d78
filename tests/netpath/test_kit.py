"""The network-path kit itself: nginx terminates TLS (and asks for a client certificate),
compresses when told, and tinyproxy tunnels, each as the tests configure it."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from loadgen.testing import netpath

pytestmark = [pytest.mark.slow, pytest.mark.realserver]

BODY = {"model": "sim", "stream": True, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip


def trusting(ca: netpath.TestCA) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca.pem))


@pytest.mark.usefixtures("need_nginx")
def test_nginx_terminates_tls_for_a_client_that_trusts_the_test_ca(
    sim_url: str, test_ca: netpath.TestCA, tmp_path: Path
) -> None:
    """Through nginx with the CA's leaf, a client trusting the CA gets the simulator's stream
    (gzip when it asks for it); one that trusts only the system store is refused."""
    route = netpath.ReverseProxy(upstream=sim_url, tls=test_ca.leaf("server"), gzip=True)
    with netpath.nginx(route, tmp_path / "nginx") as proxy:
        got = httpx.post(f"{proxy.url}/v1/chat/completions", json=BODY, verify=trusting(test_ca),
                         headers={"Accept-Encoding": "gzip"})  # fmt: skip
        assert got.status_code == 200
        assert got.headers.get("content-encoding") == "gzip"
        assert '"finish_reason":"length"' in got.text.replace(" ", "")
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.post(f"{proxy.url}/v1/chat/completions", json=BODY)


@pytest.mark.usefixtures("need_nginx")
def test_nginx_asks_for_a_client_certificate_signed_by_the_ca(
    sim_url: str, test_ca: netpath.TestCA, tmp_path: Path
) -> None:
    """With `client_ca`, nginx answers a client without a certificate 400 and streams to one
    whose certificate the CA signed."""
    route = netpath.ReverseProxy(upstream=sim_url, tls=test_ca.leaf("server"),
                                 client_ca=test_ca.pem)  # fmt: skip
    client = test_ca.leaf("client", ("client@example",))
    with netpath.nginx(route, tmp_path / "nginx") as proxy:
        url = f"{proxy.url}/v1/chat/completions"
        assert httpx.post(url, json=BODY, verify=trusting(test_ca)).status_code == 400
        context = trusting(test_ca)
        context.load_cert_chain(str(client.cert), str(client.key))
        assert httpx.post(url, json=BODY, verify=context).status_code == 200


@pytest.mark.usefixtures("need_tinyproxy")
def test_tinyproxy_logs_every_request_it_forwards(sim_url: str, tmp_path: Path) -> None:
    """tinyproxy forwards an absolute-form request and a CONNECT tunnel, and `requests`
    reads both from its log."""
    with netpath.tinyproxy(tmp_path / "proxy") as proxy:
        assert httpx.post(f"{sim_url}/v1/chat/completions", json=BODY,
                          proxy=proxy.url).status_code == 200  # fmt: skip
        with pytest.raises(httpx.HTTPError):  # nothing listens there: the tunnel fails
            httpx.get(f"https://127.0.0.1:{netpath.free_port()}/", proxy=proxy.url)
        asked = netpath.requests(proxy)
    assert asked[0] == ("POST", f"{sim_url}/v1/chat/completions")
    assert asked[1][0] == "CONNECT"
