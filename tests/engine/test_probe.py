"""The preflight's diagnostic probe verifies like every connection and carries no credential
(issue 39's repro: a server whose first TLS connection is trusted and closes after reading
the request, and whose later ones present an untrusted self-signed certificate)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import BodyOptions
from loadgen.engine.preflight import preflight
from loadgen.engine.secrets import Redactor
from loadgen.engine.tls import TlsSettings
from loadgen.engine.transport import make_endpoint
from loadgen.errors import TargetError
from loadgen.testing import netpath

KEY = "sk-probe-0123456789abcdef"


class Trap:
    """A TLS listener: its first connection (trusted certificate) reads the request and
    closes cleanly; every later one presents `later` and keeps what it was sent."""

    def __init__(self, first: ssl.SSLContext, later: ssl.SSLContext) -> None:
        self.contexts = (first, later)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.later_got: list[bytes] = []  # what each later connection received (b"": nothing)
        self.handled = threading.Semaphore(0)  # released as each later connection ends
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            first = self.connections == 1
            raw.settimeout(5)
            try:
                with self.contexts[0 if first else 1].wrap_socket(raw, server_side=True) as conn:
                    data = b""
                    while b"\r\n\r\n" not in data and (piece := conn.recv(65536)):
                        data += piece
                    if first:
                        conn.unwrap().close()  # close_notify: "Server disconnected"
                        continue
                    self.later_got.append(data)
                    conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            except (OSError, ssl.SSLError):
                if not first:
                    self.later_got.append(b"")
            finally:
                raw.close()
                if not first:
                    self.handled.release()

    def wait_later(self) -> list[bytes]:
        """What the later connections got, once the first of them is handled."""
        assert self.handled.acquire(timeout=10)
        return self.later_got


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def trusting(ca: trustme.CA, tmp_path: Path) -> TlsSettings:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return TlsSettings(cacert=str(tmp_path / "ca.pem"))


def serving(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


@pytest.fixture
def self_signed(tmp_path: Path) -> ssl.SSLContext:
    pair = netpath.self_signed(tmp_path / "ss")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    return context


def run_preflight(trap: Trap, tls: TlsSettings) -> str:
    endpoint = make_endpoint(f"https://127.0.0.1:{trap.port}?api-key=q-{KEY}", "/v1/chat/completions",
                             {"Authorization": f"Bearer {KEY}"}, tls=tls)  # fmt: skip
    with pytest.raises(TargetError) as refused:
        preflight(endpoint, adapter_for("openai-chat"), BodyOptions(model="m"), timeout_s=10,
                  redactor=Redactor([f"Bearer {KEY}", f"q-{KEY}"]))  # fmt: skip
    return str(refused.value)


@pytest.fixture
def traps() -> Iterator[list[Trap]]:
    made: list[Trap] = []
    yield made
    for trap in made:
        trap.sock.close()


def test_the_probe_never_reaches_an_untrusted_server(
    ca: trustme.CA, trusting: TlsSettings, self_signed: ssl.SSLContext, traps: list[Trap]
) -> None:
    """The probe's connection fails verification against the self-signed one: it receives
    nothing (before: the whole request, `Authorization: Bearer sk-…` included, and loadgen
    quoted its answer)."""
    traps.append(trap := Trap(serving(ca), self_signed))
    said = run_preflight(trap, trusting)
    assert "Server disconnected without sending a response" in said
    assert "NOT HTTP" not in said  # nothing of the untrusted server is quoted
    assert trap.wait_later() == [b""]
    assert trap.connections == 2


def test_the_probe_sends_no_credential_even_to_a_trusted_server(
    ca: trustme.CA, trusting: TlsSettings, traps: list[Trap]
) -> None:
    """To a verified server the probe sends its bare request: no Authorization, no key, no
    query; the answer is quoted as the answer to that."""
    traps.append(trap := Trap(serving(ca), serving(ca)))
    said = run_preflight(trap, trusting)
    assert "to a bare request (none of the run's headers) it answered 'NOT HTTP AT ALL" in said
    (got,) = trap.wait_later()
    assert got.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert KEY.encode() not in got
    assert b"authorization" not in got.lower()
