"""Failures an intermediary causes are said as seen: a proxy's error page named as the
proxy's, a close after silence said with its silence, a stream cut before its first token
said with what arrived; each with the proxy's timeout to look at."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.engine.intermediaries import explain, who
from loadgen.engine.preflight import preflight
from loadgen.engine.transport import lost_reason, make_endpoint
from loadgen.errors import TargetError
from loadgen.results.records import Outcome
from loadgen.testing import (
    CLOSE,
    PlanFactory,
    ReceivedRequest,
    ScriptedServer,
    Step,
    chat_chunk,
    chunk,
    head,
    run_engine,
)
from loadgen.workload.spec import Deadlines

NGINX_504 = (
    b"<html>\r\n<head><title>504 Gateway Time-out</title></head>\r\n<body>\r\n<center><h1>"
    b"504 Gateway Time-out</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n</body>\r\n"
    b"</html>\r\n"
)


@pytest.mark.parametrize(
    ("status", "server", "via", "body", "says"),
    [
        (
            504,
            None,
            None,
            NGINX_504.decode(),
            "from nginx, not from the server: the proxy in front gave up waiting",
        ),
        (504, "nginx/1.22.1", None, "", "nginx's proxy_read_timeout (60 s by default)"),
        (
            502,
            "envoy",
            None,
            "upstream connect error or disconnect/reset before headers",
            "from Envoy",
        ),
        (504, None, "1.1 varnish", "", "from Varnish"),
        (503, "awselb/2.0", None, "", "has no server to send to"),
        (
            400,
            None,
            None,
            "<title>400 No required SSL certificate was sent</title>",
            "--cert FILE --key FILE",
        ),
        (
            400,
            None,
            None,
            "<center>The SSL certificate error</center>",
            "refused this client's certificate",
        ),
        (400, None, None, "The plain HTTP request was sent to HTTPS port", "use https:// in --url"),
        (407, None, None, "", "put them in the proxy URL"),
    ],
)
def test_an_intermediarys_answer_is_explained(
    status: int, server: str | None, via: str | None, body: str, says: str
) -> None:
    """Status, Server/Via and the page name the intermediary and the fix."""
    note = explain(status, server, via, body)
    assert note is not None
    assert says in note


@pytest.mark.parametrize(
    ("status", "server", "body"),
    [(504, "uvicorn", '{"detail": "timeout"}'), (502, None, ""), (500, "nginx", NGINX_504.decode()),
     (400, None, '{"error": "bad model"}')],
)  # fmt: skip
def test_a_servers_own_answer_is_not_blamed_on_a_proxy(
    status: int, server: str | None, body: str
) -> None:
    """Without a proxy's name (or for a status a proxy does not write for the server), no note."""
    assert explain(status, server, None, body) is None
    assert who("uvicorn", None, body) is None or status == 500


def test_a_close_after_silence_is_said_with_its_silence() -> None:
    """A close after a second or more of silence says how long, and names a proxy's read
    timeout; a prompt close stays "connection closed by server"."""
    endpoint = make_endpoint("http://h:1", "/v1/chat/completions", {})
    assert lost_reason(None, 200_000_000, True, endpoint) == "connection closed by server"
    said = lost_reason(None, 5_030_000_000, True, endpoint)
    assert said.startswith("silence for 5.0 s after the last read, then the connection closed")
    assert "proxy_read_timeout" in said
    assert "after the request was sent" in lost_reason(None, 60_000_000_000, False, endpoint)


SILENCE_S = 1.2  # past QUIET_CLOSE_S (1 s), and short: the test takes about this long


def cut_after_silence(request: ReceivedRequest) -> Iterator[Step]:
    """What a proxy's read timeout does to a stream: the head and a role chunk, then silence,
    then a close in the middle of the chunked body."""
    yield head()
    yield chunk(chat_chunk(role="assistant"))
    yield SILENCE_S
    yield CLOSE


def test_a_stream_cut_after_silence_says_so_in_the_record() -> None:
    """The engine's record says the silence and the proxy's timeout (before: "connection
    closed by server")."""
    plans = PlanFactory(deadlines=Deadlines(first_token_s=30, stall_s=30, total_s=60)).at(0)
    with ScriptedServer(cut_after_silence) as server:
        (record,) = run_engine(plans, server.url)
    assert record.outcome is Outcome.STREAM_ERROR
    assert record.error is not None
    assert record.error.startswith("silence for 1.")
    assert "then the connection closed" in record.error
    assert "proxy_read_timeout" in record.error


def test_a_stream_cut_before_its_first_token_says_so_in_the_preflight() -> None:
    """The preflight says what arrived, the silence and the proxy's timeout (before: httpx's
    "peer closed connection without sending complete message body")."""
    with ScriptedServer(cut_after_silence) as server:
        endpoint = make_endpoint(server.url, "/v1/chat/completions", {})
        with pytest.raises(TargetError) as refused:
            preflight(endpoint, adapter_for("openai-chat"), BodyOptions(model="m"), timeout_s=30)
    said = str(refused.value)
    assert "the stream broke before its first generated token: HTTP 200" in said
    assert "the last 1." in said
    assert "proxy_read_timeout" in said


def gateway_timeout(request: ReceivedRequest) -> Iterator[Step]:
    yield (b"HTTP/1.1 504 Gateway Time-out\r\nServer: nginx/1.22.1\r\nContent-Type: text/html"
           b"\r\nContent-Length: %d\r\n\r\n" % len(NGINX_504) + NGINX_504)  # fmt: skip


def test_a_proxys_504_page_is_named_in_the_record_and_the_preflight() -> None:
    """nginx's 504 page: the record's error and the preflight say it is the proxy's, with its
    timeout to raise."""
    with ScriptedServer(gateway_timeout) as server:
        (record,) = run_engine(PlanFactory().at(0), server.url)
        endpoint = make_endpoint(server.url, "/v1/chat/completions", {})
        with pytest.raises(TargetError) as refused:
            preflight(endpoint, adapter_for("openai-chat"), BodyOptions(model="m"), timeout_s=30)
    assert record.outcome is Outcome.HTTP_ERROR
    assert record.http_status == 504
    for said in (record.error or "", str(refused.value)):
        assert "an error page from nginx, not from the server" in said, said
        assert "proxy_read_timeout" in said
