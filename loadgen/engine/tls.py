"""TLS: the one trust every connection of a run uses, and what a certificate failure means.

Every https connection loadgen makes (the engine's requests and warm connections, the
preflight and its probe, the server-metrics scraper, the cache reset, the OTLP push) is
made with the context `client_context` builds from one `TlsSettings`, so a certificate one
part accepts no other part refuses. The settings are the command line's (`--cacert`,
`--cert`/`--key`, `--insecure`) and the environment's `SSL_CERT_FILE`/`SSL_CERT_DIR`, read
once when the command starts and carried (pickled) to every process of the run.

Trust, as OpenSSL's own default and curl read it: `--cacert FILE` replaces the default
store; else `SSL_CERT_FILE` replaces the system bundle and `SSL_CERT_DIR` the system's
hashed folder, each on its own (one set leaves the other at the system's). Both are loaded
explicitly here, not left to OpenSSL's lookup at handshake time, so every process trusts
what the command was started with. A CA in the trusted set may be an intermediate (partial
chains are accepted, as curl and Python 3.13 do). `--insecure` is the only way
verification is ever turned off. ALPN offers `http/1.1` alone: loadgen speaks HTTP/1.1.

A certificate that fails verification is named by OpenSSL's verify code
(`verify_failure`): unknown issuer, self-signed, name mismatch, expired; the message says
which trust was used and how to fix it (never "try http://", which would send the
credentials in cleartext).
"""

from __future__ import annotations

import functools
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass

from loadgen.errors import ConfigError, OptionError

ALPN = ["http/1.1"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsSettings:
    """How a run verifies servers and proves itself to them (a value: hashable, picklable)."""

    cacert: str | None = None  # --cacert: the only CAs trusted (PEM)
    cert: str | None = None  # --cert: the client certificate (PEM; may hold its key too)
    key: str | None = None  # --key: the client certificate's private key (PEM)
    insecure: bool = False  # --insecure: no verification at all
    env_file: str | None = None  # SSL_CERT_FILE when the command started
    env_dir: str | None = None  # SSL_CERT_DIR when the command started

    @classmethod
    def from_environment(
        cls,
        *,
        cacert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        insecure: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> TlsSettings:
        """The settings of the flags given and this process's environment."""
        env = os.environ if environ is None else environ
        return cls(cacert=cacert, cert=cert, key=key, insecure=insecure,
                   env_file=env.get("SSL_CERT_FILE") or None,
                   env_dir=env.get("SSL_CERT_DIR") or None)  # fmt: skip

    @property
    def trust(self) -> str:
        """Which CAs are trusted, in words (for messages, the terminal and run.json)."""
        if self.insecure:
            return "none: verification off (--insecure)"
        if self.cacert:
            return f"--cacert {self.cacert}"
        if self.env_file and self.env_dir:
            return f"SSL_CERT_FILE={self.env_file} and SSL_CERT_DIR={self.env_dir}"
        if self.env_file:
            return f"SSL_CERT_FILE={self.env_file} and the system's CA folder"
        if self.env_dir:
            return f"the system's CA bundle and SSL_CERT_DIR={self.env_dir}"
        return "the system store"

    @property
    def client_certificate(self) -> str | None:
        """The client certificate presented when a server asks (mutual TLS), or None."""
        return self.cert


def check_settings(settings: TlsSettings) -> None:
    """Refuse flags that contradict each other, and load the files given (ConfigError naming
    the flag or variable and the fix when one cannot be used). The system store alone is
    not loaded here: a plain-http run never needs it (it costs tens of ms)."""
    if settings.insecure and settings.cacert:
        raise OptionError("--insecure", "turns verification off, so --cacert would not be used",
                          "drop one of them: --cacert to verify with that CA")  # fmt: skip
    if settings.key and not settings.cert:
        raise OptionError("--key", "needs --cert (the certificate the key belongs to)",
                          "add --cert FILE, or drop --key")  # fmt: skip
    if settings.cacert or settings.cert or settings.env_file or settings.env_dir:
        client_context(settings)


@functools.lru_cache(maxsize=8)
def client_context(settings: TlsSettings) -> ssl.SSLContext:
    """The SSLContext of every https connection made with `settings` (one per process and
    settings: loading the system store costs tens of ms). OptionError when a file is unusable.

    Callers must not change it (it is shared); one that must (a library that sets its own
    verify mode) gets its own with `fresh_context`.
    """
    return fresh_context(settings)


def fresh_context(settings: TlsSettings) -> ssl.SSLContext:
    """A new SSLContext for `settings` (see the module docstring for what it trusts)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # TLS 1.2+, hostname checked, CERT_REQUIRED
    context.set_alpn_protocols(ALPN)
    if settings.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        _load_trust(context, settings)
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    if settings.cert:
        _load_client_certificate(context, settings.cert, settings.key)
    return context


def _load_trust(context: ssl.SSLContext, settings: TlsSettings) -> None:
    if settings.cacert:
        _load_cas(context, settings.cacert, "--cacert")
        return
    defaults = ssl.get_default_verify_paths()
    if settings.env_file:
        _load_cas(context, settings.env_file, "SSL_CERT_FILE")
    elif os.path.isfile(defaults.openssl_cafile):
        context.load_verify_locations(cafile=defaults.openssl_cafile)
    if settings.env_dir:
        folders = [f for f in settings.env_dir.split(os.pathsep) if f]
        missing = [f for f in folders if not os.path.isdir(f)]
        if missing:
            raise _refused("SSL_CERT_DIR", f"{missing[0]} is not a folder",
                           "point it at a folder of hashed CA certificates (openssl rehash "
                           "FOLDER), or unset it")  # fmt: skip
        context.load_verify_locations(capath=settings.env_dir)
    elif os.path.isdir(defaults.openssl_capath):
        context.load_verify_locations(capath=defaults.openssl_capath)


def _load_cas(context: ssl.SSLContext, path: str, source: str) -> None:
    """Trust the CA certificates of the PEM file `path` (named `source` in an error)."""
    fix = "give a PEM file of CA certificates (-----BEGIN CERTIFICATE-----)"
    try:
        context.load_verify_locations(cafile=path)
    except FileNotFoundError:
        raise _refused(source, f"{path}: no such file", fix) from None
    except ssl.SSLError as exc:
        raise _refused(source, f"{path} holds no PEM certificate ({_ssl_reason(exc)})",
                       fix) from None  # fmt: skip
    except OSError as exc:
        raise _refused(source, f"cannot read {path}: {exc.strerror or exc}", fix) from None


def _refused(source: str, problem: str, fix: str) -> ConfigError:
    """The error for a flag (`--cacert`) or an environment variable (`SSL_CERT_FILE`)."""
    if source.startswith("--"):
        return OptionError(source, problem, fix)
    return ConfigError("environment", source, problem, fix)


def _load_client_certificate(context: ssl.SSLContext, cert: str, key: str | None) -> None:
    """Load the client certificate and its key; never prompt for a passphrase."""

    def no_passphrase() -> bytes:
        raise ValueError("encrypted")

    for path, flag in ((cert, "--cert"), (key, "--key")):
        if path is not None and not os.path.isfile(path):
            raise OptionError(flag, f"{path}: no such file", "give the PEM file's path")
    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except ValueError:
        raise OptionError(
            "--key",
            f"{key or cert} is encrypted (loadgen asks for no passphrase)",
            "decrypt it for the run: openssl pkey -in KEY -out PLAIN.key",
        ) from None
    except ssl.SSLError as exc:
        where = f"{cert} and {key}" if key else cert
        raise OptionError(
            "--cert", f"{where} are not a PEM certificate and its private key "
            f"({_ssl_reason(exc)})",
            "give the client certificate with --cert and its unencrypted key with --key "
            "(both PEM; --key can be left out when the certificate file holds the key)",
        ) from None  # fmt: skip


def _ssl_reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason in words (`KEY_VALUES_MISMATCH` → `key values mismatch`)."""
    reason = getattr(exc, "reason", None) or str(exc)
    return str(reason).replace("_", " ").lower()


# -- certificate failures ---------------------------------------------------------------
# OpenSSL's X509_V_ERR_* codes (x509_vfy.h), by what they mean to the user.
UNKNOWN_ISSUER = frozenset({2, 20, 21})  # unable to get (local) issuer; cannot verify leaf
SELF_SIGNED = 18  # depth zero self-signed certificate
SELF_SIGNED_CHAIN = 19  # self-signed certificate in chain (an untrusted root was sent)
EXPIRED = 10
NOT_YET_VALID = 9
NAME_MISMATCH = frozenset({62, 63, 64})  # hostname, email, IP address mismatch
REVOKED = 23
INSECURE_HINT = (
    "--insecure skips verification (test servers only: it sends credentials to whoever answers)"
)


def find_verify_error(exc: BaseException | None) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind `exc` (httpx and httpcore wrap it)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def verify_failure(
    exc: ssl.SSLCertVerificationError, where: str, settings: TlsSettings, *, host: str = ""
) -> str:
    """What was wrong with the certificate of `where` (host:port), in the user's words, the
    trust it was checked against, and how to fix it."""
    code = exc.verify_code
    said = (exc.verify_message or exc.reason or str(exc)).rstrip(".")
    trust = settings.trust
    if code in UNKNOWN_ISSUER:
        what = f"unknown issuer: it is signed by a CA this client does not trust ({trust})"
        fix = ("pass the CA that signed it: --cacert CA.pem (or SSL_CERT_FILE / SSL_CERT_DIR, "
               "or install it in the system store)")  # fmt: skip
    elif code == SELF_SIGNED:
        what = f"self-signed: the certificate is its own issuer, and not trusted ({trust})"
        fix = "trust that certificate itself: --cacert SERVER.crt (a self-signed one is its own CA)"
    elif code == SELF_SIGNED_CHAIN:
        what = f"its chain ends in a self-signed root this client does not trust ({trust})"
        fix = "pass that root CA: --cacert ROOT.pem (or SSL_CERT_FILE / SSL_CERT_DIR)"
    elif code == EXPIRED:
        now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        what = "expired: its validity ended before now"
        fix = f"renew the server's certificate (or check this host's clock: it reads {now})"
    elif code == NOT_YET_VALID:
        now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        what = "not yet valid: its validity starts later"
        fix = f"check this host's clock (it reads {now}) and the certificate's dates"
    elif code in NAME_MISMATCH:
        what = f"name mismatch: it is not issued for {host or 'the host in --url'}"
        fix = ("use in --url a host name the certificate names, or have the server present "
               f"a certificate that names {host or 'that host'}")  # fmt: skip
    elif code == REVOKED:
        what, fix = "revoked by its issuer", "the server needs a new certificate"
    else:
        what, fix = said, "check the server's certificate and --cacert"
    return (
        f"the TLS certificate of {where} failed verification: {what} (OpenSSL: {said}); "
        f"fix: {fix}; {INSECURE_HINT}"
    )


# TLS alerts a server sends when it refuses this client's certificate (mutual TLS).
CLIENT_CERT_ALERTS = {
    "CERTIFICATE_REQUIRED": "the server requires a client certificate (mutual TLS) and got none",
    "BAD_CERTIFICATE": "the server refused this client's certificate",
    "UNKNOWN_CA": "the server does not trust the CA that signed this client's certificate",
    "CERTIFICATE_UNKNOWN": "the server refused this client's certificate",
    "CERTIFICATE_EXPIRED": "the server says this client's certificate has expired",
}
HTTP2_ONLY = (
    "the server refused the ALPN offer of http/1.1 (no_application_protocol): it speaks only "
    "HTTP/2 there, and loadgen speaks HTTP/1.1: point --url at its HTTP/1.1 listener, or at "
    "a proxy in front that speaks HTTP/1.1"
)


def _alert(upper: str, name: str) -> bool:
    """Does an exception's text (upper case) carry TLS alert `name`?"""
    return f"ALERT_{name}" in upper or f"ALERT {name.replace('_', ' ')}" in upper


def handshake_refusal(text: str, settings: TlsSettings) -> str | None:
    """What a TLS alert from the server (in an exception's text) means, with the fix: this
    client's certificate refused (mutual TLS), or http/1.1 refused by an HTTP/2-only
    server; None when it is about something else."""
    upper = text.upper()
    if _alert(upper, "NO_APPLICATION_PROTOCOL"):
        return HTTP2_ONLY
    for alert, what in CLIENT_CERT_ALERTS.items():
        if _alert(upper, alert):
            given = f" (sent: --cert {settings.cert})" if settings.cert else ""
            return (f"{what}{given}: pass --cert FILE --key FILE, a certificate the server's "
                    "client CA signed")  # fmt: skip
    return None
