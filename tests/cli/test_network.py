"""`run` with TLS and proxies from the command line: one trust for the preflight and the
engine, a certificate failure exit 1 even without the preflight, --insecure said and
recorded, a proxy named in run.json without its credentials, bad flags refused early."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from click.testing import CliRunner, Result

from loadgen.cli import cli
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, workload_file

REQUESTS = 6
PREFLIGHT = 2  # the preflight and its compression probe (the OpenAI SDK's Accept-Encoding)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_pem(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
def tls_server(ca: trustme.CA) -> Iterator[ScriptedServer]:
    """A streaming server on https://127.0.0.1 with a leaf of the module's private CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    with ScriptedServer(lambda r: simple_chat(3), ssl=context) as server:
        yield server


def invoke(tmp_path: Path, url: str, *flags: str, env: dict[str, str] | None = None) -> Result:
    tmp_path.mkdir(parents=True, exist_ok=True)
    workload = workload_file(tmp_path, chat_workload("net", requests=REQUESTS))
    args = ["run", str(workload), "--url", url, "--out", str(tmp_path / "out"), "--run-id", "r",
            "-q", "--lag-bound-ms", "1000", "--verdict", "point", *flags]  # fmt: skip
    clean = dict.fromkeys(("SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"))  # fmt: skip
    return CliRunner().invoke(cli, args, env={**clean, **(env or {})})


def run_json(tmp_path: Path) -> dict[str, object]:
    return json.loads((tmp_path / "out" / "r" / "run.json").read_text())  # type: ignore[no-any-return]


def test_an_untrusted_certificate_is_exit_1_with_its_cause_even_without_the_preflight(
    tls_server: ScriptedServer, tmp_path: Path
) -> None:
    """Unknown issuer, with and without --no-preflight: exit 1 naming it and --cacert, no
    request sent, never "SLO MISSED" from a run of connect_errors (main: exit 2)."""
    for flags in ([], ["--no-preflight"]):
        result = invoke(tmp_path, tls_server.url, *flags)
        assert result.exit_code == 1, result.output
        assert "failed verification: unknown issuer" in result.stderr
        assert "--cacert CA.pem" in result.stderr
        assert "http://" not in result.stderr
        assert "nothing was sent" in result.stderr
    assert not tls_server.requests


def test_cacert_is_the_one_trust_of_the_preflight_and_the_engine(
    tls_server: ScriptedServer, ca_pem: Path, tmp_path: Path
) -> None:
    """--cacert: the preflight and every request verify with it; run.json records the trust."""
    result = invoke(tmp_path, tls_server.url, "--cacert", str(ca_pem))
    assert result.exit_code == 0, result.output
    assert len(tls_server.requests) == REQUESTS + PREFLIGHT  # the preflight's too
    target = run_json(tmp_path)["target"]
    assert isinstance(target, dict)
    assert target["tls"] == {"verify": True, "trust": f"--cacert {ca_pem}",
                             "client_certificate": None}  # fmt: skip
    assert "proxy" not in target


def test_ssl_cert_file_and_ssl_cert_dir_are_both_honoured(
    tls_server: ScriptedServer, ca_pem: Path, tmp_path: Path
) -> None:
    """SSL_CERT_FILE naming another CA and SSL_CERT_DIR holding this one: the run is
    verified (main: the preflight's httpx ignored SSL_CERT_DIR, exit 1)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command names the hashed file")
    digest = subprocess.run([openssl, "x509", "-hash", "-noout", "-in", str(ca_pem)],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    folder = tmp_path / "capath"
    folder.mkdir()
    (folder / f"{digest}.0").write_bytes(ca_pem.read_bytes())
    other = tmp_path / "other.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    env = {"SSL_CERT_FILE": str(other), "SSL_CERT_DIR": str(folder)}
    result = invoke(tmp_path, tls_server.url, env=env)
    assert result.exit_code == 0, result.output
    tls = run_json(tmp_path)["target"]["tls"]  # type: ignore[index]
    assert tls["trust"] == f"SSL_CERT_FILE={other} and SSL_CERT_DIR={folder}"


def test_insecure_is_said_on_the_terminal_and_recorded(
    tls_server: ScriptedServer, tmp_path: Path
) -> None:
    """--insecure runs against the untrusted certificate, warns even under -q, and run.json
    says verify: false."""
    result = invoke(tmp_path, tls_server.url, "--insecure")
    assert result.exit_code == 0, result.output
    assert "warning: --insecure: TLS certificates are not verified" in result.stderr
    tls = run_json(tmp_path)["target"]["tls"]  # type: ignore[index]
    assert tls["verify"] is False


def test_a_proxy_is_named_in_run_json_and_its_password_nowhere(tmp_path: Path) -> None:
    """http through --proxy (a scripted server plays the proxy): requests in absolute form,
    run.json names the proxy without its user-info, and the password is in no file."""
    with ScriptedServer(lambda r: simple_chat(3)) as proxy:
        given = f"http://ops:hunter2-proxy@127.0.0.1:{proxy.port}"
        result = invoke(tmp_path, "http://origin.test:8000", "--proxy", given)
    assert result.exit_code == 0, result.output
    assert {r.path for r in proxy.requests} == {"http://origin.test:8000/v1/chat/completions"}
    target = run_json(tmp_path)["target"]
    assert target["proxy"] == f"http://127.0.0.1:{proxy.port} (--proxy)"  # type: ignore[index]
    for path in (tmp_path / "out" / "r").iterdir():
        if path.is_file():
            assert b"hunter2-proxy" not in path.read_bytes(), path.name


def test_the_environment_proxy_and_no_proxy_are_taken(tmp_path: Path) -> None:
    """HTTP_PROXY sends the run through the proxy; NO_PROXY naming the target sends it
    direct; --proxy none ignores the variable."""
    with ScriptedServer(lambda r: simple_chat(3)) as proxy, \
            ScriptedServer(lambda r: simple_chat(3)) as origin:  # fmt: skip
        env = {"HTTP_PROXY": proxy.url}
        assert invoke(tmp_path / "a", origin.url, env=env).exit_code == 0
        assert len(proxy.requests) == REQUESTS + PREFLIGHT
        assert not origin.requests
        env_bypass = {**env, "NO_PROXY": "localhost,127.0.0.0/8"}
        assert invoke(tmp_path / "b", origin.url, env=env_bypass).exit_code == 0
        assert invoke(tmp_path / "c", origin.url, "--proxy", "none", env=env).exit_code == 0
        assert len(proxy.requests) == REQUESTS + PREFLIGHT
        assert len(origin.requests) == 2 * (REQUESTS + PREFLIGHT)


@pytest.mark.parametrize(
    ("flags", "env", "said"),
    [
        (
            ["--proxy", "socks5://127.0.0.1:1080"],
            {},
            "--proxy: socks5:// proxies are not supported",
        ),
        (
            [],
            {"HTTPS_PROXY": "https://u:pw@p:1"},
            "HTTPS_PROXY: https:// proxies are not supported",
        ),
        (["--cacert", "/nonexistent/ca.pem"], {}, "--cacert: /nonexistent/ca.pem: no such file"),
        (["--insecure", "--cacert", "x.pem"], {}, "--insecure: turns verification off"),
        (["--key", "k.pem"], {}, "--key: needs --cert"),
        (
            [],
            {"SSL_CERT_FILE": "/nonexistent.pem"},
            "SSL_CERT_FILE: /nonexistent.pem: no such file",
        ),
    ],
)
def test_unusable_network_settings_are_exit_1_before_anything_is_sent(
    flags: list[str], env: dict[str, str], said: str, tmp_path: Path
) -> None:
    """Run and its --dry-run refuse alike, naming the flag or variable."""
    for dry in (["--dry-run"], []):
        result = invoke(tmp_path, "https://127.0.0.1:9", *flags, *dry, env=env)
        assert result.exit_code == 1, result.output
        assert said in result.stderr, result.stderr
        assert "Traceback" not in result.output
        assert "pw" not in result.stderr


@pytest.mark.slow  # the built-in simulator's start-up: ~2 s on 2 cores
def test_the_built_in_simulator_is_never_reached_through_a_proxy(tmp_path: Path) -> None:
    """Without --url, a proxy variable (here naming a port nothing listens on) reaches none
    of the run's connections to the simulator: requests, scrapes, the cache reset."""
    from loadgen.testing import netpath

    tmp_path.mkdir(parents=True, exist_ok=True)
    workload = workload_file(tmp_path, chat_workload("sim", requests=REQUESTS, target=None))
    dead = f"http://127.0.0.1:{netpath.free_port()}"
    args = ["run", str(workload), "--out", str(tmp_path / "out"), "--run-id", "r", "-q",
            "--verdict", "point", "--lag-bound-ms", "1000", "--server-metrics-url", "/metrics",
            "--cache", "reset"]  # fmt: skip
    result = CliRunner().invoke(cli, args, env={"HTTP_PROXY": dead, "http_proxy": dead})
    assert result.exit_code == 0, result.output
    info = run_json(tmp_path)
    assert "proxy" not in info["target"]  # type: ignore[operator]
    assert info["server_metrics"]["failures"] == 0  # type: ignore[index]
    assert info["cache"]["reset"] == "POST /reset_prefix_cache: HTTP 200"  # type: ignore[index]


def test_the_dry_run_behind_a_proxy_checks_that_the_proxy_answers(tmp_path: Path) -> None:
    """--dry-run connects to the proxy (the target may be reachable only through it): valid
    when the proxy accepts, exit 1 naming the proxy when nothing listens there."""
    from loadgen.testing import netpath

    with ScriptedServer(lambda r: simple_chat(1)) as proxy:
        result = invoke(tmp_path / "up", "http://only-via-proxy.test:8000", "--dry-run",
                        "--proxy", proxy.url)  # fmt: skip
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # the console wraps the line
    assert f"its proxy {proxy.url} (--proxy) accepts connections" in said
    assert not proxy.requests  # a TCP connect, nothing sent
    dead = f"http://127.0.0.1:{netpath.free_port()}"
    result = invoke(tmp_path / "down", "http://only-via-proxy.test:8000", "--dry-run",
                    "--proxy", dead)  # fmt: skip
    assert result.exit_code == 1, result.output
    assert f"cannot connect to the proxy {dead} (--proxy)" in result.stderr
