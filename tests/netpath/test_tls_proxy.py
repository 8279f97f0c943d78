"""TLS and forward proxies with the real parts: nginx terminating TLS in front of the
simulator (a CA made by the test, mutual TLS, expired, misnamed and self-signed leaves) and
tinyproxy as the forward proxy. Known answers: each TLS case's exit code and what it names;
through the proxy, one CONNECT per connection loadgen opened (the preflight's and every
engine connection, warm ones included), none when NO_PROXY names the target."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner, Result

from loadgen.cli import cli
from loadgen.testing import netpath
from loadgen.testing.builders import chat_workload, workload_file

pytestmark = [pytest.mark.slow, pytest.mark.realserver]

REQUESTS = 8
PROXY_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                   "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy")  # fmt: skip


def run(tmp_path: Path, url: str, *flags: str, env: dict[str, str] | None = None) -> Result:
    """`loadgen run` of REQUESTS short chats against `url`, judged by point estimates."""
    folder = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    folder.mkdir(parents=True)
    workload = workload_file(folder, chat_workload("netpath", target="{api: openai-chat, model: sim}",
                                                   requests=REQUESTS, rate_per_s=20))  # fmt: skip
    args = ["run", str(workload), "--url", url, "--out", str(folder), "--run-id", "r", "-q",
            "--verdict", "point", "--lag-bound-ms", "1000", *flags]  # fmt: skip
    clean: dict[str, str | None] = dict.fromkeys(PROXY_VARIABLES)
    return CliRunner().invoke(cli, args, env={**clean, **(env or {})})


def run_json(result_folder: Path) -> dict[str, Any]:
    runs = sorted(result_folder.glob("run-*/r/run.json"))
    return json.loads(runs[-1].read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def parts(
    sim_url: str, test_ca: netpath.TestCA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """nginx in front of the simulator, once per TLS case: base URLs by case."""
    if netpath.find("nginx") is None:
        pytest.skip("nginx is not installed (scripts/realserver/setup.sh netpath)")
    folder = tmp_path_factory.mktemp("nginx")
    routes = {
        "trusted": netpath.ReverseProxy(upstream=sim_url, tls=test_ca.leaf("server")),
        "mtls": netpath.ReverseProxy(upstream=sim_url, tls=test_ca.leaf("server"),
                                     client_ca=test_ca.pem),
        "expired": netpath.ReverseProxy(upstream=sim_url, tls=test_ca.leaf("old", expired=True)),
        "misnamed": netpath.ReverseProxy(upstream=sim_url,
                                         tls=test_ca.leaf("misnamed", ("other.example",))),
        "self-signed": netpath.ReverseProxy(upstream=sim_url,
                                            tls=netpath.self_signed(folder / "ss")),
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(netpath.nginx(route, folder / name)).url
               for name, route in routes.items()}  # fmt: skip


@pytest.fixture(scope="module")
def client(test_ca: netpath.TestCA) -> netpath.KeyPair:
    return test_ca.leaf("client", ("client@example",))


def hashed_folder(folder: Path, pem: Path) -> Path:
    """A folder of the CA named by its subject hash, as `openssl rehash` leaves it."""
    openssl = shutil.which("openssl")
    assert openssl is not None, "openssl is installed with nginx (Debian's openssl package)"
    digest = subprocess.run([openssl, "x509", "-hash", "-noout", "-in", str(pem)],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{digest}.0").write_bytes(pem.read_bytes())
    return folder


def test_each_tls_case_against_nginx_in_front_of_the_simulator(
    parts: dict[str, str], test_ca: netpath.TestCA, client: netpath.KeyPair, tmp_path: Path
) -> None:
    """Each TLS case's known answer, the preflight and the engine on one trust: exit 0 with
    every request ok when the certificate is trusted (by --cacert, SSL_CERT_FILE,
    SSL_CERT_DIR beside SSL_CERT_FILE, --insecure, a client certificate); exit 1 naming the
    failure otherwise, with and without the preflight, and never suggesting http://."""
    ca = str(test_ca.pem)
    capath = hashed_folder(tmp_path / "capath", test_ca.pem)
    system = "/etc/ssl/certs/ca-certificates.crt"
    mtls = ["--cacert", ca, "--cert", str(client.cert), "--key", str(client.key)]
    cases: list[tuple[str, str, list[str], dict[str, str], int, str]] = [
        ("untrusted", "trusted", [], {}, 1, "failed verification: unknown issuer"),
        ("untrusted, --no-preflight", "trusted", ["--no-preflight"], {}, 1,
         "failed verification: unknown issuer"),
        ("--cacert", "trusted", ["--cacert", ca], {}, 0, ""),
        ("SSL_CERT_FILE", "trusted", [], {"SSL_CERT_FILE": ca}, 0, ""),
        ("SSL_CERT_DIR with SSL_CERT_FILE", "trusted", [],
         {"SSL_CERT_DIR": str(capath), "SSL_CERT_FILE": system}, 0, ""),
        ("mTLS without a certificate", "mtls", ["--cacert", ca], {}, 1,
         "requires a client certificate and got none: pass --cert FILE --key FILE"),
        ("mTLS with one", "mtls", mtls, {}, 0, ""),
        ("--insecure", "self-signed", ["--insecure"], {}, 0, "warning: --insecure"),
        ("expired", "expired", ["--cacert", ca], {}, 1, "failed verification: expired"),
        ("wrong name", "misnamed", ["--cacert", ca], {}, 1,
         "failed verification: name mismatch: it is not issued for 127.0.0.1"),
        ("self-signed", "self-signed", [], {}, 1, "failed verification: self-signed"),
        ("self-signed, --no-preflight", "self-signed", ["--no-preflight"], {}, 1,
         "failed verification: self-signed"),
    ]  # fmt: skip
    for name, route, flags, env, code, said in cases:
        result = run(tmp_path / name.replace(" ", "_"), parts[route], *flags, env=env)
        assert result.exit_code == code, (name, result.output)
        assert said in result.stderr, (name, result.stderr)
        assert "try --url http://" not in result.output, name
        if code == 0:
            info = run_json(tmp_path / name.replace(" ", "_"))
            assert info["target"]["tls"]["verify"] is (name != "--insecure"), name


def test_through_tinyproxy_one_tunnel_per_connection_and_none_when_bypassed(
    parts: dict[str, str], test_ca: netpath.TestCA, sim_url: str, tmp_path: Path
) -> None:
    """HTTPS_PROXY and --proxy: exit 0, and tinyproxy saw a CONNECT to nginx for the
    preflight, its compression probe and each connection the run opened (warm ones before
    t0 included);
    NO_PROXY naming the target: exit 0 and no CONNECT; an http target: absolute-form POSTs."""
    target = parts["trusted"]
    authority = target.removeprefix("https://")
    with netpath.tinyproxy(tmp_path / "tinyproxy") as proxy:
        for how, flags, env in (
            ("env", [], {"HTTPS_PROXY": proxy.url}),
            ("flag", ["--proxy", proxy.url], {}),
        ):
            before = len(netpath.requests(proxy))
            result = run(tmp_path / how, target, "--cacert", str(test_ca.pem), *flags, env=env)
            assert result.exit_code == 0, (how, result.output)
            seen = netpath.requests(proxy)[before:]
            counts = run_json(tmp_path / how)["connections"]
            opened = counts["warm_opened"] + counts["opened_during_run"]
            assert seen == [("CONNECT", authority)] * (2 + opened), (how, seen, counts)
            shown = run_json(tmp_path / how)["target"]["proxy"]
            assert shown == f"{proxy.url} ({'HTTPS_PROXY' if how == 'env' else '--proxy'})"
        before = len(netpath.requests(proxy))
        bypass = {"HTTPS_PROXY": proxy.url, "NO_PROXY": "localhost,127.0.0.0/8"}
        result = run(tmp_path / "bypass", target, "--cacert", str(test_ca.pem), env=bypass)
        assert result.exit_code == 0, result.output
        assert netpath.requests(proxy)[before:] == []
        assert "proxy" not in run_json(tmp_path / "bypass")["target"]
        before = len(netpath.requests(proxy))
        result = run(tmp_path / "http", sim_url, env={"HTTP_PROXY": proxy.url})
        assert result.exit_code == 0, result.output
        seen = netpath.requests(proxy)[before:]
        # the run's, the preflight's and its compression probe's
        assert seen == [("POST", f"{sim_url}/v1/chat/completions")] * (2 + REQUESTS)


def test_tinyproxy_with_basic_auth_takes_the_urls_credentials_and_refuses_without(
    parts: dict[str, str], test_ca: netpath.TestCA, tmp_path: Path
) -> None:
    """With user:password in the proxy URL the tunnel opens (the password in no file of the
    run); without, exit 1 naming the 407 and the fix, for the preflight and --no-preflight."""
    target = parts["trusted"]
    with netpath.tinyproxy(tmp_path / "tinyproxy", basic_auth=("ops", "hunter2-proxy")) as proxy:
        with_auth = proxy.url.replace("://", "://ops:hunter2-proxy@")
        result = run(tmp_path / "auth", target, "--cacert", str(test_ca.pem), "--proxy", with_auth)
        assert result.exit_code == 0, result.output
        for path in (tmp_path / "auth").rglob("*"):
            if path.is_file():
                assert b"hunter2-proxy" not in path.read_bytes(), path
        for flags in ([], ["--no-preflight"]):
            result = run(tmp_path / "none", target, "--cacert", str(test_ca.pem), "--proxy",
                         proxy.url, *flags)  # fmt: skip
            assert result.exit_code == 1, result.output
            assert "refused the tunnel" in result.stderr
            assert "HTTP 407" in result.stderr
            assert "http://USER:PASSWORD@host:port" in result.stderr


def llama_server_manifest() -> dict[str, str]:
    """llama-server as scripts/realserver/setup.sh built it; skip (fail under CI) without it."""
    root = os.environ.get("LOADGEN_CACHE") or str(Path.home() / ".cache" / "loadgen")
    path = Path(root) / "realserver" / "llama-server.json"
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"llama-server is not set up ({path}); CI is set", pytrace=False)
        pytest.skip(f"llama-server is not set up: no {path} (scripts/realserver/setup.sh)")
    info: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
    return info


@pytest.mark.usefixtures("need_nginx")
def test_a_real_server_behind_nginx_tls(test_ca: netpath.TestCA, tmp_path: Path) -> None:
    """llama.cpp's llama-server (one thread, the tiny model) behind nginx terminating TLS:
    trusted by --cacert, every request ok (exit 0 at the median); untrusted, exit 1 with the
    cause, before any request reaches it."""
    info = llama_server_manifest()
    port = netpath.free_port()
    cmd = [info["bin"], "-m", info["model"], "--alias", "sim", "--host", "127.0.0.1",
           "--port", str(port), "-t", "1", "-np", "4", "-c", "4096"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    folder = tmp_path / "llama-server"
    folder.mkdir()
    log = (folder / "server.log").open("wb")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                              start_new_session=True)  # fmt: skip
    try:
        netpath.wait_for_http(f"http://127.0.0.1:{port}/health", server)
        route = netpath.ReverseProxy(
            upstream=f"http://127.0.0.1:{port}", tls=test_ca.leaf("server")
        )
        with netpath.nginx(route, tmp_path / "nginx") as front:
            trusted = run(tmp_path / "trusted", front.url, "--cacert", str(test_ca.pem))
            untrusted = run(tmp_path / "untrusted", front.url)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert trusted.exit_code == 0, trusted.output
    (records,) = (tmp_path / "trusted").glob("run-*/r/records.parquet")
    assert pl.read_parquet(records)["outcome"].to_list() == ["ok"] * REQUESTS
    assert run_json(tmp_path / "trusted")["target"]["tls"]["trust"] == f"--cacert {test_ca.pem}"
    assert untrusted.exit_code == 1, untrusted.output
    assert "unknown issuer" in untrusted.stderr, untrusted.output
