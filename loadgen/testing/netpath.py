"""Real parts of the network path for tests: a certificate authority, nginx as a reverse
proxy, tinyproxy as a forward proxy.

Users' servers sit behind TLS, reverse proxies, ingresses and forward proxies that buffer,
compress, terminate and tunnel. These start the real ones on loopback, each with a config
the test writes into its own folder (Debian's `nginx-light` and `tinyproxy` packages, which
`scripts/realserver/setup.sh netpath` installs): no system service, no file outside that
folder. The certificates come from `trustme` (a test CA and its leaves, client ones for
mutual TLS) and `cryptography` (a self-signed leaf).

`find` returns a binary's path or None; the tests decide whether a missing part skips or
fails (it fails under CI, as every real-server test does).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

STARTUP_S = 60.0  # a busy box's bound: nginx and tinyproxy listen in ms, the simulator in ~1 s
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")  # nginx lives there; not on every PATH


def find(binary: str) -> str | None:
    """The path of `binary` (on PATH or in an sbin folder), or None when it is not installed."""
    found = shutil.which(binary)
    if found:
        return found
    for folder in SBIN:
        path = Path(folder) / binary
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- certificates ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate (its chain, PEM) and its private key (PEM), as files."""

    cert: Path
    key: Path


class TestCA:
    """A certificate authority made for one test folder; every file it writes is there."""

    __test__ = False  # not a pytest test class

    def __init__(self, folder: Path, name: str = "loadgen test CA") -> None:
        import trustme

        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._ca = trustme.CA(organization_name=name)
        self.pem = folder / "ca.pem"  # what --cacert / SSL_CERT_FILE take
        self._ca.cert_pem.write_to_path(str(self.pem))

    def leaf(
        self,
        name: str,
        identities: Sequence[str] = ("127.0.0.1", "localhost", "::1"),
        *,
        expired: bool = False,
    ) -> KeyPair:
        """A certificate for `identities` (server or client use), valid now unless
        `expired` (it ended a day ago)."""
        not_after = None
        not_before = None
        if expired:
            now = datetime.datetime.now(datetime.UTC)
            not_before, not_after = now - datetime.timedelta(days=30), now - datetime.timedelta(1)
        leaf = self._ca.issue_cert(
            *identities, common_name=name, not_before=not_before, not_after=not_after
        )
        pair = KeyPair(cert=self.folder / f"{name}.crt", key=self.folder / f"{name}.key")
        pair.cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(str(pair.key))
        return pair


def self_signed(folder: Path, name: str = "self-signed") -> KeyPair:
    """A leaf certificate signed by its own key, for 127.0.0.1 and localhost."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    names = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(names, critical=False)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(cert=folder / f"{name}.crt", key=folder / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pair


# -- processes ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Started:
    """A part listening on loopback: its URL, port, folder and log, and its process."""

    url: str
    port: int
    folder: Path
    log: Path
    process: subprocess.Popen[bytes]

    def log_text(self) -> str:
        """What it has logged so far."""
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def _serving(cmd: list[str], *, port: int, folder: Path, log: Path, url: str) -> Iterator[Started]:
    """Start `cmd` in its own process group, wait until `port` accepts, stop it after."""
    with (folder / "stdout.log").open("wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True
        )
    started = Started(url=url, port=port, folder=folder, log=log, process=process)
    try:
        deadline = time.monotonic() + STARTUP_S
        while not _accepts(port):
            if process.poll() is not None or time.monotonic() > deadline:
                said = (folder / "stdout.log").read_text(errors="replace") + started.log_text()
                raise RuntimeError(f"{cmd[0]} did not start (exit {process.poll()}):\n{said}")
            time.sleep(0.02)
        yield started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_http(url: str, process: subprocess.Popen[bytes], startup_s: float = 120.0) -> None:
    """Wait until GET `url` answers 200 (a real server's health endpoint once its model is
    loaded); RuntimeError when `process` exits first or `startup_s` passes."""
    import httpx

    deadline = time.monotonic() + startup_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 within {startup_s:g} s")
        time.sleep(0.2)


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def simulator(folder: Path, *flags: str) -> Iterator[Started]:
    """`loadgen sim` on a free loopback port as the upstream (ten times faster than real
    time unless `flags` give a `--speed`), in a process of its own, until the block ends."""
    port = free_port()
    speed = [] if "--speed" in flags else ["--speed", "10"]
    cmd = [sys.executable, "-m", "loadgen", "sim", "--port", str(port), "--model", "sim",
           *speed, *flags]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "stdout.log"
    with _serving(cmd, port=port, folder=folder, log=log, url=f"http://127.0.0.1:{port}") as s:
        yield s


# -- nginx -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ReverseProxy:
    """How nginx stands in front of the upstream, as a user's ingress would.

    `buffering` is nginx's `proxy_buffering` (on is nginx's default: it reads the upstream
    into `buffer_size` buffers and writes to the client as they fill or the response ends);
    `gzip` compresses event streams and JSON for clients that accept it (`gzip_types`);
    `tls` terminates TLS with that certificate; `client_ca` then asks for a client
    certificate signed by it (mutual TLS); `read_timeout_s` is how long nginx waits for the
    upstream between two reads before it closes the client's response.
    """

    upstream: str  # http://127.0.0.1:PORT
    buffering: bool = False
    buffer_size: str = "4k"
    gzip: bool = False
    tls: KeyPair | None = None
    client_ca: Path | None = None
    read_timeout_s: float = 60.0
    extra_location: str = ""  # nginx directives added to the location, verbatim


def nginx_conf(route: ReverseProxy, *, port: int, folder: Path) -> str:
    """The nginx.conf for `route`, every path inside `folder`."""
    upstream = re.sub(r"^https?://", "", route.upstream).rstrip("/")
    user = "user root;" if os.geteuid() == 0 else ""  # else its workers cannot read `folder`
    tls = ""
    if route.tls is not None:
        tls = f"ssl_certificate {route.tls.cert};\n    ssl_certificate_key {route.tls.key};"
        if route.client_ca is not None:
            tls += f"\n    ssl_client_certificate {route.client_ca};\n    ssl_verify_client on;"
    gzip = "off"
    if route.gzip:
        gzip = (
            "on;\n    gzip_proxied any;\n    gzip_min_length 0;\n"
            "    gzip_types text/event-stream application/x-ndjson application/json"
        )
    temp = folder / "tmp"
    return f"""{user}
worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/error.log info;
events {{ worker_connections 4096; }}
http {{
  access_log {folder}/access.log;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  fastcgi_temp_path {temp}/fastcgi;
  uwsgi_temp_path {temp}/uwsgi;
  scgi_temp_path {temp}/scgi;
  upstream backend {{ server {upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port}{" ssl" if route.tls else ""};
    {tls}
    gzip {gzip};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering {"on" if route.buffering else "off"};
      proxy_buffer_size {route.buffer_size};
      proxy_buffers 8 {route.buffer_size};
      proxy_read_timeout {route.read_timeout_s:g}s;
      {route.extra_location}
    }}
  }}
}}
"""


@contextlib.contextmanager
def nginx(route: ReverseProxy, folder: Path) -> Iterator[Started]:
    """nginx in front of `route.upstream` on a free loopback port, until the block ends."""
    binary = find("nginx")
    if binary is None:
        raise FileNotFoundError("nginx is not installed (scripts/realserver/setup.sh netpath)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tmp").mkdir(exist_ok=True)
    port = free_port()
    conf = folder / "nginx.conf"
    conf.write_text(nginx_conf(route, port=port, folder=folder), encoding="utf-8")
    scheme = "https" if route.tls else "http"
    cmd = [binary, "-p", str(folder), "-c", str(conf), "-e", str(folder / "error.log")]
    log = folder / "error.log"
    with _serving(cmd, port=port, folder=folder, log=log, url=f"{scheme}://127.0.0.1:{port}") as s:
        yield s


# -- tinyproxy ---------------------------------------------------------------------------
@contextlib.contextmanager
def tinyproxy(folder: Path, *, basic_auth: tuple[str, str] | None = None) -> Iterator[Started]:
    """tinyproxy, a forward proxy (CONNECT tunnels for https, absolute-form requests for
    http), on a free loopback port; `requests(started)` lists what it was asked."""
    binary = find("tinyproxy")
    if binary is None:
        raise FileNotFoundError("tinyproxy is not installed (scripts/realserver/setup.sh netpath)")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = folder / "tinyproxy.log"
    lines = [
        f"Port {port}",
        "Listen 127.0.0.1",
        "Timeout 600",
        f'LogFile "{log}"',
        "LogLevel Connect",
        f'PidFile "{folder}/tinyproxy.pid"',
        "MaxClients 1024",
        "Allow 127.0.0.1",
    ]
    if basic_auth is not None:
        lines.append(f"BasicAuth {basic_auth[0]} {basic_auth[1]}")
    conf = folder / "tinyproxy.conf"
    conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cmd = [binary, "-d", "-c", str(conf)]
    with _serving(cmd, port=port, folder=folder, log=log, url=f"http://127.0.0.1:{port}") as s:
        yield s


_REQUEST = re.compile(r"Request \(file descriptor \d+\): (\S+) (\S+) HTTP/")


def requests(proxy: Started) -> list[tuple[str, str]]:
    """What the forward proxy was asked, in order: ("CONNECT", "host:port") for a tunnel,
    (method, absolute URL) for a plain-http request."""
    return [(m.group(1), m.group(2)) for m in _REQUEST.finditer(proxy.log_text())]
