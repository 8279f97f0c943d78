"""One TLS trust (engine.tls): what the context trusts, what it offers, what it presents, and
what a certificate failure is called, each against a real handshake on loopback."""

from __future__ import annotations

import datetime
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from loadgen.engine.tls import (
    TlsSettings,
    check_settings,
    fresh_context,
    handshake_refusal,
    verify_failure,
)
from loadgen.errors import ConfigError, OptionError
from loadgen.testing import netpath


class Listener:
    """A loopback TLS listener that completes handshakes with `context` and keeps what the
    client negotiated (ALPN) or failed with."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.alpn: list[str | None] = []
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            raw.settimeout(5)
            try:
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    self.alpn.append(conn.selected_alpn_protocol())
                    conn.recv(1)
            except (OSError, ssl.SSLError) as exc:
                self.errors.append(str(exc))

    def close(self) -> None:
        self.sock.close()


def serving(leaf: trustme.LeafCert, *, client_ca: trustme.CA | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    leaf.configure_cert(context)
    context.set_alpn_protocols(["h2", "http/1.1"])
    if client_ca is not None:
        client_ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@pytest.fixture
def listen() -> Iterator[list[Listener]]:
    started: list[Listener] = []
    yield started
    for listener in started:
        listener.close()


def handshake(listeners: list[Listener], server: ssl.SSLContext, settings: TlsSettings,
              host: str = "127.0.0.1") -> ssl.SSLSocket:  # fmt: skip
    """A client handshake with `settings` against a listener serving `server`."""
    listener = Listener(server)
    listeners.append(listener)
    raw = socket.create_connection(("127.0.0.1", listener.port), timeout=5)
    try:
        return fresh_context(settings).wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pem")
    ca_pem = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    client = ca.issue_cert("client@example")
    cert, key = folder / "client.crt", folder / "client.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    client.private_key_pem.write_to_path(str(key))
    combined = folder / "client-and-key.pem"
    combined.write_bytes(cert.read_bytes() + key.read_bytes())
    return {"ca": ca_pem, "cert": cert, "key": key, "combined": combined, "folder": folder}


def test_the_default_trust_is_the_system_store_and_a_private_ca_is_unknown(
    ca: trustme.CA, listen: list[Listener]
) -> None:
    """With no flag and no variable, the system's CAs are loaded and a private CA's leaf
    fails as an unknown issuer (OpenSSL's code 20)."""
    defaults = ssl.get_default_verify_paths()
    if not Path(defaults.openssl_cafile).is_file():
        pytest.skip(f"no system CA bundle at {defaults.openssl_cafile}")
    assert fresh_context(TlsSettings()).cert_store_stats()["x509_ca"] > 0
    with pytest.raises(ssl.SSLCertVerificationError) as failed:
        handshake(listen, serving(ca.issue_cert("127.0.0.1")), TlsSettings())
    assert failed.value.verify_code == 20


def test_cacert_replaces_the_default_store(files: dict[str, Path], ca: trustme.CA,
                                           listen: list[Listener]) -> None:  # fmt: skip
    """--cacert trusts its file's CAs alone (as curl and httpx take it)."""
    settings = TlsSettings(cacert=str(files["ca"]))
    assert fresh_context(settings).cert_store_stats()["x509_ca"] == 1
    with handshake(listen, serving(ca.issue_cert("127.0.0.1")), settings) as conn:
        assert conn.version() in ("TLSv1.2", "TLSv1.3")


def test_alpn_offers_http_1_1_alone(files: dict[str, Path], ca: trustme.CA,
                                    listen: list[Listener]) -> None:  # fmt: skip
    """A server offering h2 first still negotiates http/1.1: loadgen speaks nothing else."""
    settings = TlsSettings(cacert=str(files["ca"]))
    with handshake(listen, serving(ca.issue_cert("127.0.0.1")), settings) as conn:
        assert conn.selected_alpn_protocol() == "http/1.1"


def hashed_folder(folder: Path, pem: Path) -> Path:
    """A folder of one CA named by its subject hash, as `openssl rehash` makes it."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed (it names the hashed file)")
    digest = subprocess.run([openssl, "x509", "-hash", "-noout", "-in", str(pem)],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    folder.mkdir()
    (folder / f"{digest}.0").write_bytes(pem.read_bytes())
    return folder


def test_ssl_cert_dir_is_honoured_when_ssl_cert_file_is_set_too(
    files: dict[str, Path], ca: trustme.CA, listen: list[Listener], tmp_path: Path
) -> None:
    """SSL_CERT_FILE (here: a bundle without the CA) and SSL_CERT_DIR (holding it) are both
    loaded, as OpenSSL's own default takes them; httpx used the file alone and failed."""
    other = trustme.CA()
    other_pem = tmp_path / "other.pem"
    other.cert_pem.write_to_path(str(other_pem))
    folder = hashed_folder(tmp_path / "capath", files["ca"])
    env = {"SSL_CERT_FILE": str(other_pem), "SSL_CERT_DIR": str(folder)}
    settings = TlsSettings.from_environment(environ=env)
    assert (settings.env_file, settings.env_dir) == (str(other_pem), str(folder))
    with handshake(listen, serving(ca.issue_cert("127.0.0.1")), settings) as conn:
        assert conn.version()
    with pytest.raises(ssl.SSLCertVerificationError):  # the file alone does not trust it
        handshake(listen, serving(ca.issue_cert("127.0.0.1")),
                  TlsSettings(env_file=str(other_pem), env_dir=str(tmp_path)))  # fmt: skip


def test_insecure_accepts_any_certificate_and_any_name(listen: list[Listener]) -> None:
    """--insecure turns off the chain and the name check: a self-signed leaf for another name."""
    leaf = trustme.CA().issue_cert("not-this-host.example")
    with handshake(listen, serving(leaf), TlsSettings(insecure=True)) as conn:
        assert conn.getpeercert() == {}  # nothing verified, nothing parsed


@pytest.mark.parametrize("key", ["key", None], ids=["cert-and-key", "one-file"])
def test_a_client_certificate_is_presented_when_asked(
    files: dict[str, Path], ca: trustme.CA, listen: list[Listener], key: str | None
) -> None:
    """--cert/--key (or one file holding both) complete a handshake that requires one."""
    cert = files["cert"] if key else files["combined"]
    settings = TlsSettings(cacert=str(files["ca"]), cert=str(cert),
                           key=str(files[key]) if key else None)  # fmt: skip
    server = serving(ca.issue_cert("127.0.0.1"), client_ca=ca)
    with handshake(listen, server, settings) as conn:
        conn.sendall(b"x")
    assert not listen[-1].errors


def test_without_a_client_certificate_the_server_refuses_and_says_so(
    files: dict[str, Path], ca: trustme.CA, listen: list[Listener]
) -> None:
    """A server requiring a client certificate ends the connection with an alert, which
    reads as what it is."""
    server = serving(ca.issue_cert("127.0.0.1"), client_ca=ca)
    settings = TlsSettings(cacert=str(files["ca"]))
    conn = handshake(listen, server, settings)  # TLS 1.3: the refusal comes at the first read
    with conn, pytest.raises(ssl.SSLError) as refused:
        conn.recv(1)  # (a write first could meet the closed socket's RST and lose the alert)
    said = handshake_refusal(str(refused.value), settings)
    assert said is not None
    assert "requires a client certificate" in said
    assert "--cert" in said


EXPIRED = datetime.datetime(2000, 1, 2, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("case", "named", "fix"),
    [
        ("unknown issuer", "unknown issuer", "--cacert CA.pem"),
        ("self-signed", "self-signed", "--cacert SERVER.crt"),
        ("expired", "expired", "renew the server's certificate"),
        (
            "wrong name",
            "name mismatch: it is not issued for 127.0.0.1",
            "host name the certificate names",
        ),
    ],
)
def test_each_certificate_failure_is_named_with_its_fix(
    case: str, named: str, fix: str, files: dict[str, Path], ca: trustme.CA,
    listen: list[Listener], tmp_path: Path,
) -> None:  # fmt: skip
    """Unknown issuer, self-signed, expired and a wrong name each say which, the trust used
    and the fix; none suggests plain http (it would send the credentials in cleartext)."""
    trusted = TlsSettings(cacert=str(files["ca"]))
    if case == "unknown issuer":
        server, settings = serving(trustme.CA().issue_cert("127.0.0.1")), trusted
    elif case == "self-signed":
        pair = netpath.self_signed(tmp_path)
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(pair.cert, pair.key)
        settings = TlsSettings()
    elif case == "expired":
        leaf = ca.issue_cert("127.0.0.1", not_before=EXPIRED - datetime.timedelta(days=1),
                             not_after=EXPIRED)  # fmt: skip
        server, settings = serving(leaf), trusted
    else:
        server, settings = serving(ca.issue_cert("other.example")), trusted
    with pytest.raises(ssl.SSLCertVerificationError) as failed:
        handshake(listen, server, settings)
    said = verify_failure(failed.value, "127.0.0.1:8443", settings, host="127.0.0.1")
    assert said.startswith("the TLS certificate of 127.0.0.1:8443 failed verification: ")
    assert named in said
    assert fix in said
    assert settings.trust in said or case in ("expired", "wrong name")
    assert "http://" not in said


def test_contradictory_or_unusable_settings_are_refused_with_the_flag_named(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """Bad TLS input is an error naming the flag or variable and the fix, never a prompt for
    a passphrase or a traceback."""
    encrypted = tmp_path / "encrypted.key"
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the encrypted key")
    subprocess.run(["openssl", "pkey", "-in", str(files["key"]), "-aes256", "-passout",
                    "pass:x", "-out", str(encrypted)], check=True)  # fmt: skip
    other_key = tmp_path / "other.key"
    trustme.CA().issue_cert("x").private_key_pem.write_to_path(str(other_key))
    cases = [
        (TlsSettings(insecure=True, cacert=str(files["ca"])), "--insecure", "would not be used"),
        (TlsSettings(key=str(files["key"])), "--key", "needs --cert"),
        (TlsSettings(cacert=str(tmp_path / "missing.pem")), "--cacert", "no such file"),
        (TlsSettings(cacert=str(files["key"])), "--cacert", "holds no PEM certificate"),
        (TlsSettings(cert=str(files["cert"]), key=str(encrypted)), "--key", "is encrypted"),
        (TlsSettings(cert=str(files["cert"]), key=str(other_key)), "--cert", "mismatch"),
        (TlsSettings(env_file=str(tmp_path / "missing.pem")), "SSL_CERT_FILE", "no such file"),
        (TlsSettings(env_dir=str(tmp_path / "nowhere")), "SSL_CERT_DIR", "is not a folder"),
    ]
    for settings, where, problem in cases:
        with pytest.raises(ConfigError) as refused:
            check_settings(settings)
        assert isinstance(refused.value, OptionError) == where.startswith("--")
        assert refused.value.key == where, refused.value
        assert problem in refused.value.problem, refused.value


def test_an_http2_only_server_refusing_http_1_1_is_named() -> None:
    """The no_application_protocol alert (an HTTP/2-only server refusing the ALPN offer of
    http/1.1) reads as that, with the fix; other alerts are not taken for it."""
    said = handshake_refusal(
        "[SSL: TLSV1_ALERT_NO_APPLICATION_PROTOCOL] tlsv1 alert no application protocol",
        TlsSettings(),
    )
    assert said is not None
    assert "speaks only HTTP/2" in said
    assert handshake_refusal("[SSL: TLSV1_ALERT_PROTOCOL_VERSION] alert", TlsSettings()) is None


def test_the_trust_in_words() -> None:
    """What the terminal, the messages and run.json say was trusted."""
    assert TlsSettings().trust == "the system store"
    assert TlsSettings(cacert="ca.pem").trust == "--cacert ca.pem"
    assert TlsSettings(insecure=True).trust == "none: verification off (--insecure)"
    assert TlsSettings(env_file="f").trust == "SSL_CERT_FILE=f and the system's CA folder"
    assert TlsSettings(env_file="f", env_dir="d").trust == "SSL_CERT_FILE=f and SSL_CERT_DIR=d"
