"""Scraping a protected /metrics: the target's credentials go to its own origin only, the
endpoint's own headers go to it, a refusal is a classified note with its fix, the client's
verdict is untouched, and no header value reaches run.json, summary.json, loadgen.log or output.

Known answers from tiny loopback servers that require one header: a scrape either carried
the exact header the server checks (it answers 200 and the scrapes count) or not (401)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from loadgen.cli import cli
from loadgen.engine.scrape import OWN, TARGET, URL_USERINFO, Scraper, origin, scrape_auth
from loadgen.engine.secrets import REDACTED
from loadgen.run.execute import RunOptions, execute
from loadgen.run.setup import client_setup
from loadgen.testing import ReceivedRequest, ScriptedServer, simple_chat
from loadgen.testing.builders import workload_file
from loadgen.workload.identity import fingerprint
from loadgen.workload.spec import load

TOKEN = "tgt-7f3a9c2e51d04b8e"  # the target's key (the requests' Bearer)
METRICS_TOKEN = "mtr-0c9e44a1b7f2d6aa"  # the metrics endpoint's own key
WORKLOAD = """\
name: scrape-auth
target: {api: openai-chat, model: m, api_key_env: LG_TEST_KEY}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 50}
    requests: 10
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 1}
"""
BODY = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n"


def _answer(status: str, body: bytes, extra: str = "") -> list[bytes]:
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n{extra}Content-Length: {len(body)}"
    return [head.encode() + b"\r\n\r\n" + body]


def _guarded(want: dict[str, str], *, chat: bool = True) -> ScriptedServer:
    """A server whose /metrics answers 200 only when every header of `want` has its value
    (else 401, as vLLM's and SGLang's key checks do), and whose chat needs the target's key."""

    def handler(request: ReceivedRequest) -> list[bytes]:
        if request.path.startswith("/metrics"):
            if all(request.headers.get(k.lower()) == v for k, v in want.items()):
                return _answer("200 OK", BODY)
            return _answer("401 Unauthorized", b'{"error": "Unauthorized"}')
        if chat and request.headers.get("authorization") != f"Bearer {TOKEN}":
            return _answer("401 Unauthorized", b'{"error": "Unauthorized"}')
        return simple_chat(1)

    return ScriptedServer(handler)


def _scrapes(server: ScriptedServer) -> list[ReceivedRequest]:
    return [r for r in server.requests if r.path.startswith("/metrics")]


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("LG_TEST_KEY", TOKEN)
    monkeypatch.setenv("LG_METRICS_TOKEN", METRICS_TOKEN)
    return


def _run(tmp_path: Path, url: str, *extra: str, workload: str = WORKLOAD) -> Result:
    path = workload_file(tmp_path, workload)
    return CliRunner().invoke(cli, ["run", str(path), "--url", url, "--out", str(tmp_path),
                                    "--run-id", "r", "--server-metrics-interval", "0.05",
                                    "--lag-bound-ms", "1000", *extra])  # fmt: skip


def _server_block(tmp_path: Path) -> dict[str, Any]:
    block: dict[str, Any] = json.loads((tmp_path / "r" / "summary.json").read_text())["server"]
    return block


def _assert_no_secret(tmp_path: Path, output: str) -> None:
    """No file of the run folder, nor what the run printed, holds a key or its base64."""
    forms = [TOKEN, METRICS_TOKEN]
    forms += [base64.b64encode(f.encode()).decode().rstrip("=") for f in forms]
    for path in (tmp_path / "r").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for form in forms:
                assert form.encode() not in data, f"{form} in {path.name}"
    for form in forms:
        assert form not in output


# --- the rule: which headers a scrape sends ---------------------------------------------------


def test_the_targets_credentials_go_only_to_its_own_origin() -> None:
    """Same scheme, host and port (default ports filled in, case folded): sent; another
    port, host or scheme: withheld. Only credential headers are inherited."""
    headers = {"Authorization": "Bearer k", "x-api-key": "k2", "anthropic-version": "1"}
    same = scrape_auth("http://GPU:80/metrics", "http://gpu", headers)
    assert same.headers == {"Authorization": "Bearer k", "x-api-key": "k2"}
    assert same.sources == {"Authorization": TARGET, "x-api-key": TARGET}
    assert (same.same_origin, same.withheld) == (True, ())
    for other in ("http://gpu:9000/metrics", "http://other/metrics", "https://gpu/metrics"):
        auth = scrape_auth(other, "http://gpu", headers)
        assert auth.headers == {}
        assert auth.withheld == ("Authorization", "x-api-key")
    assert origin("https://h/x") == ("https", "h", 443)


def test_the_endpoints_own_headers_and_url_userinfo_replace_the_targets() -> None:
    """Own headers win over the target's of the same name (whatever the case); the metrics
    URL's user-info is its Basic auth."""
    auth = scrape_auth("http://gpu/metrics", "http://gpu", {"Authorization": "Bearer t"},
                       {"authorization": "Bearer m", "X-Tenant": "a"})  # fmt: skip
    assert auth.headers == {"authorization": "Bearer m", "X-Tenant": "a"}
    assert auth.sources == {"authorization": OWN, "X-Tenant": OWN}
    basic = scrape_auth("http://ops:pw@gpu:9000/metrics", "http://gpu", {"Authorization": "t"})
    assert basic.headers == {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}
    assert basic.sources == {"Authorization": URL_USERINFO}


def test_a_redirect_to_another_origin_carries_none_of_the_headers() -> None:
    """/metrics on A redirects to B: A saw the key, B (another origin) saw none of it."""
    with _guarded({"x-api-key": METRICS_TOKEN}, chat=False) as other:

        def redirect(request: ReceivedRequest) -> list[bytes]:
            return _answer("302 Found", b"", f"Location: {other.url}/metrics\r\n")

        with ScriptedServer(redirect) as first:
            auth = scrape_auth(first.url + "/metrics", first.url, {"x-api-key": METRICS_TOKEN})
            scraper = Scraper(first.url + "/metrics", 0.05, auth=auth, timeout_s=5)
            scraper.start()
            assert scraper.first_done.wait(30)
            stats = scraper.stop()
    assert all(r.headers.get("x-api-key") == METRICS_TOKEN for r in first.requests)
    assert _scrapes(other)
    assert all("x-api-key" not in r.headers for r in _scrapes(other))
    assert stats.scrapes == 0
    assert stats.access is not None
    assert stats.access.problem_kind == "unauthorized"


# --- end to end: the run, its files and its output --------------------------------------------


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_same_origin_scrapes_carry_the_targets_key(tmp_path: Path, keys: None) -> None:
    """The key the requests carry (target.api_key_env) goes to /metrics on the same
    server, which counts every scrape; run.json names the header and its source only."""
    with _guarded({"Authorization": f"Bearer {TOKEN}"}) as server:
        result = _run(tmp_path, server.url, "--server-metrics-url", "/metrics")
        scrapes = _scrapes(server)
    assert result.exit_code == 0, result.output
    assert scrapes
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in scrapes)
    block = _server_block(tmp_path)
    assert (block["failures"], block["server"]) == (0, "vllm")
    assert block["scrapes"] == len(scrapes)
    assert block["gauges"]["queue_depth"]["max"] == 3
    assert block["access"]["headers"] == {"Authorization": "target"}
    assert block["access"]["problem"] is None
    info = json.loads((tmp_path / "r" / "run.json").read_text())["server_metrics"]
    assert info["access"] == block["access"]
    _assert_no_secret(tmp_path, result.output)


def test_another_origin_gets_no_credentials_and_a_401_says_how_to_fix(
    tmp_path: Path, keys: None
) -> None:
    """Metrics on another port: the target's key is not sent there; its 401 is classified,
    said at once and at the end with the fix; the client's verdict (exit 0) is unaffected."""
    with _guarded({}) as target, _guarded({"Authorization": f"Bearer {TOKEN}"}) as metrics:
        result = _run(tmp_path, target.url, "--server-metrics-url", metrics.url + "/metrics")
        scrapes = _scrapes(metrics)
    assert result.exit_code == 0, result.output
    assert scrapes
    assert all("authorization" not in r.headers for r in scrapes)
    block = _server_block(tmp_path)
    access = block["access"]
    assert (block["scrapes"], access["problem_kind"], access["problem_status"]) == (
        0, "unauthorized", 401)  # fmt: skip
    assert access["failed_by"] == {"unauthorized": block["failures"]}
    assert block["failures"] > 0
    assert (access["headers"], access["withheld"], access["same_origin"]) == (
        {}, ["Authorization"], False)  # fmt: skip
    problem = access["problem"]
    assert f"GET {metrics.url}/metrics → 401 Unauthorized: sent no credentials" in problem
    assert f"go only to the target's origin ({target.url})" in problem
    assert "--server-metrics-header 'Authorization: Bearer ${METRICS_TOKEN}'" in problem
    output = " ".join(result.output.split())  # rich wraps long lines
    assert "401 Unauthorized: sent no credentials" in output
    assert "server: no scrape answered · 0 scrapes" in output
    assert "SLO MET" in output
    log = (tmp_path / "r" / "loadgen.log").read_text()
    assert "401 Unauthorized" in log
    _assert_no_secret(tmp_path, result.output)


def test_a_refused_endpoint_is_said_before_the_first_request(tmp_path: Path, keys: None) -> None:
    """The first scrape's outcome is awaited before t0: the note is printed before any
    request is sent, not only at the end."""
    with _guarded({}) as target, _guarded({"Authorization": "Bearer x"}) as metrics:
        log = io.StringIO()
        spec = load(workload_file(tmp_path, WORKLOAD))
        options = RunOptions(url=target.url, out_dir=tmp_path, run_id="r",
                             server_metrics_url=metrics.url + "/metrics",
                             server_metrics_interval_s=0.05, lag_bound_ms=1000.0)  # fmt: skip
        result = execute(spec, options, log=log)
    assert result.exit_code == 0
    text = log.getvalue()
    note = "server metrics: 1 of 1 scrapes failed; the latest: GET "
    assert note in text
    assert "the run goes on, its client figures unaffected" in text
    assert text.index(note) < text.index("[")  # before the first progress line


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_explicit_metrics_headers_are_sent_from_the_flag_and_the_file(
    tmp_path: Path, keys: None
) -> None:
    """--server-metrics-header, and target.server_metrics_headers, with ${VAR}: the other
    origin gets exactly that header and answers; its value is in no file."""
    want = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    (tmp_path / "flag").mkdir()
    (tmp_path / "file").mkdir()
    with _guarded({}) as target, _guarded(want) as metrics:
        flag = _run(
            tmp_path / "flag",
            target.url,
            "--server-metrics-url",
            metrics.url + "/metrics",
            "--server-metrics-header",
            "Authorization: Bearer ${LG_METRICS_TOKEN}",
        )
        in_file = WORKLOAD.replace(
            "api_key_env: LG_TEST_KEY}",
            f"api_key_env: LG_TEST_KEY, server_metrics_url: '{metrics.url}/metrics',\n"
            "         server_metrics_headers: {Authorization: 'Bearer ${LG_METRICS_TOKEN}'}}",
        )
        from_file = _run(tmp_path / "file", target.url, workload=in_file)
        scrapes = _scrapes(metrics)
    for result, folder in ((flag, tmp_path / "flag"), (from_file, tmp_path / "file")):
        assert result.exit_code == 0, result.output
        block = _server_block(folder)
        assert (block["failures"], block["server"]) == (0, "vllm")
        assert block["scrapes"] > 0
        assert block["access"]["headers"] == {"Authorization": "server_metrics_headers"}
        assert block["access"]["withheld"] == ["Authorization"]  # the target's: not sent
        _assert_no_secret(folder, result.output)
        spec = json.loads((folder / "r" / "run.json").read_text())["workload"]["spec"]
        assert spec["target"]["server_metrics_headers"] == (
            [] if folder.name == "flag" else ["Authorization"]
        )  # names only
    assert scrapes
    assert all(r.headers["authorization"] == want["Authorization"] for r in scrapes)


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_refused_credentials_and_a_forbidden_endpoint_are_named(tmp_path: Path, keys: None) -> None:
    """The target's key sent and refused: the note names the header and its source; a 403
    says the endpoint refuses with it, and how to get past it."""
    with _guarded({"Authorization": "Bearer other"}) as server:
        refused = _run(tmp_path, server.url, "--server-metrics-url", "/metrics", "-q")
    assert refused.exit_code == 0, refused.output
    problem = _server_block(tmp_path)["access"]["problem"]
    assert "→ 401 Unauthorized: the endpoint refused the credentials sent " in problem
    assert "(Authorization (from target))" in problem
    _assert_no_secret(tmp_path, refused.output)

    def forbidden(request: ReceivedRequest) -> list[bytes]:
        if request.path == "/metrics":
            return _answer("403 Forbidden", b"no")
        return simple_chat(1)

    (tmp_path / "b").mkdir()
    with ScriptedServer(forbidden) as server:
        result = _run(tmp_path / "b", server.url, "--server-metrics-url", "/metrics", "-q")
    assert result.exit_code == 0, result.output
    access = _server_block(tmp_path / "b")["access"]
    assert (access["problem_kind"], access["problem_status"]) == ("forbidden", 403)
    assert (
        "→ 403 Forbidden: the endpoint refuses to serve its metrics with the "
        in (access["problem"])
    )
    assert "scrape the server itself, past its gateway" in access["problem"]


def test_a_missing_path_and_a_dead_port_are_classified(tmp_path: Path) -> None:
    """A 404 names the servers' metrics paths; nothing listening is a connect failure."""
    with ScriptedServer(lambda r: _answer("404 Not Found", b"")) as server:
        scraper = Scraper(server.url + "/metrics", 0.05, timeout_s=5)
        scraper.start()
        assert scraper.first_done.wait(30)
        stats = scraper.stop()
    assert stats.access is not None
    assert (stats.access.problem_kind, stats.access.problem_status) == ("not_found", 404)
    assert "no metrics at this path" in (stats.access.problem or "")
    dead = Scraper("http://127.0.0.1:9/metrics", 0.05, timeout_s=0.5)
    dead.start()
    stats = dead.stop()
    assert stats.access is not None
    assert stats.access.problem_kind == "connect"
    assert stats.access.failed_by == {"connect": stats.failures}


# --- the workload's key: checked, and not part of the identity --------------------------------


def test_a_literal_secret_in_the_file_is_refused_and_an_unset_var_is_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """server_metrics_headers.Authorization must come from ${VAR}; an unset VAR says which."""
    literal = WORKLOAD.replace(
        "api_key_env: LG_TEST_KEY}",
        "server_metrics_url: /metrics, server_metrics_headers: {Authorization: 'Bearer abc123'}}",
    )
    result = CliRunner().invoke(cli, ["run", str(workload_file(tmp_path, literal)), "--dry-run"])
    assert result.exit_code == 1
    assert "server_metrics_headers.Authorization" in result.output
    assert "secrets must not be written in the workload file" in result.output
    assert "Traceback" not in result.output
    monkeypatch.delenv("LG_UNSET_VAR", raising=False)
    monkeypatch.setenv("LG_TEST_KEY", TOKEN)
    result = CliRunner().invoke(
        cli,
        [
            "run",
            str(workload_file(tmp_path, WORKLOAD)),
            "--dry-run",
            "--server-metrics-url",
            "/metrics",
            "--server-metrics-header",
            "X-Key: ${LG_UNSET_VAR}",
        ],
    )
    assert result.exit_code == 1, result.output
    assert "--server-metrics-header 'X-Key: ${LG_UNSET_VAR}': LG_UNSET_VAR is not set" in (
        result.output
    )
    assert "Traceback" not in result.output
    alone = CliRunner().invoke(cli, ["run", str(workload_file(tmp_path, WORKLOAD)), "--dry-run",
                                     "--server-metrics-header", "X-Key: 1"])  # fmt: skip
    assert alone.exit_code == 1
    assert "--server-metrics-header: scrapes nothing: no metrics URL" in alone.output
    bad = CliRunner().invoke(cli, ["run", str(workload_file(tmp_path, WORKLOAD)), "--dry-run",
                                   "--server-metrics-header", "no-colon"])  # fmt: skip
    assert bad.exit_code != 0
    assert "--server-metrics-header" in bad.output


def test_metrics_headers_do_not_change_the_workload_identity(tmp_path: Path) -> None:
    """How the server is scraped is not the traffic: the fingerprint stays the same."""
    plain = load(workload_file(tmp_path, WORKLOAD, "a.yaml"))
    scraped = load(workload_file(tmp_path, WORKLOAD.replace(
        "api_key_env: LG_TEST_KEY}", "api_key_env: LG_TEST_KEY, "
        "server_metrics_headers: {X-Tenant: a}}"), "b.yaml"))  # fmt: skip
    assert scraped.target.server_metrics_headers == {"X-Tenant": "a"}
    assert fingerprint(plain) == fingerprint(scraped)


def test_every_process_redacts_the_metrics_endpoints_secrets(tmp_path: Path, keys: None) -> None:
    """The redactor a run's processes share hides the endpoint's own header values (as
    read from the environment) and its URL's user-info, as it hides the target's key."""
    spec = load(workload_file(tmp_path, WORKLOAD))
    options = RunOptions(
        server_metrics_url="http://ops:pw-5e1d7c9a@gpu:9000/metrics",
        server_metrics_headers={"X-Gateway": "Bearer ${LG_METRICS_TOKEN}"},
    )
    redactor = client_setup(spec, options)[2]
    text = redactor.redact(f"a {METRICS_TOKEN} b pw-5e1d7c9a c {TOKEN}")
    assert text == f"a {REDACTED} b {REDACTED} c {REDACTED}"
