"""Checks of a workload's values that more than the file uses: the command line checks its
flags with them (`--url`, `--header`, `--server-metrics-url`), and the run its headers.

Each `*_problem` function returns what is wrong (a sentence a message can carry) or "";
`check_schedule` raises a `ConfigError`, on the file and again after `--rate`,
`--requests`, `--duration`. Here too: which headers are secrets (`is_secret_header`, the
one definition `engine.secrets`, the preflight and the logs use), which carry credentials
(`CREDENTIAL_NAMES`, what a scrape sends to the target's origin), and `redact_url`, the one
way a URL is shown anywhere.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import unquote, urlsplit, urlunsplit

from loadgen.errors import ConfigError
from loadgen.workload.model import (
    CLIENT_CODINGS,
    CONTENT_CODINGS,
    MAX_PERIODS,
    MAX_RATE_PER_S,
    MAX_SPAN_S,
    SPAN_WHY,
    ClassSpec,
    WorkloadSpec,
)

# Header names that carry credentials: their values are secrets (`engine.secrets` redacts
# them, a scrape sends the target's only to its origin, a metrics header so named must read
# its value from the environment). The API key's own headers (Bearer `Authorization`,
# Anthropic's `x-api-key`, Azure's `api-key`) are a few of them that `target.headers` may
# not set at all: the key comes from `target.api_key_env`.
CREDENTIAL_NAMES = re.compile(r"authorization|api[-_]?key|token|secret|cookie", re.IGNORECASE)
API_KEY_HEADERS = frozenset({"authorization", "x-api-key", "api-key"})  # lower case
# Header names known to carry nothing secret (lower case): every other header value given on
# the command line (`--header`) or in the workload (`target.headers`) is a secret, redacted
# from every output, whatever its name (`Ocp-Apim-Subscription-Key`, `X-Functions-Key`,
# `X-Auth-Key`, `X-Password` are credentials no pattern of names would catch). Content
# negotiation, tracing and request ids, and the APIs' own version and beta switches.
HARMLESS_HEADERS = frozenset({
    "accept", "accept-charset", "accept-encoding", "accept-language", "cache-control",
    "connection", "content-type", "host", "pragma", "user-agent", "x-request-id",
    "x-correlation-id", "traceparent", "tracestate", "anthropic-version", "anthropic-beta",
    "openai-beta",
})  # fmt: skip
# Query parameters whose values a URL shows (`redact_url`); every other value is hidden.
HARMLESS_QUERY = frozenset({"api-version"})
REDACTED = "<redacted>"
ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # `${VAR}` in a header value
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 field-name characters
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def is_secret_header(name: str) -> bool:
    """True unless `name` is one of `HARMLESS_HEADERS`: its value is then a secret."""
    return name.lower() not in HARMLESS_HEADERS


def redact_url(url: str) -> str:
    """`url` as any output may show it: user-info as `<redacted>@`, every query value
    `<redacted>` but those of `HARMLESS_QUERY` (`api-version`), no fragment. A path with a
    query (`target.path`) is shown the same way. The one function every URL shown passes
    through (messages, logs, run.json, the terminal)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a bad IPv6 literal: hide everything past the scheme's //
        scheme, sep, _ = url.partition("//")
        return f"{scheme}{sep}{REDACTED}" if sep else REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    elif "@" in parts.path and not netloc:  # `user:key@host:8000`, no scheme
        return f"{REDACTED}@{url.rpartition('@')[2]}"
    query = "&".join(_redacted_pair(pair) for pair in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def _redacted_pair(pair: str) -> str:
    """`name=value` of a query with the value hidden unless the name is harmless (a bare
    `token` with no `=` may be a key itself: hidden)."""
    name, sep, _ = pair.partition("=")
    if not sep:
        return REDACTED if pair else pair
    return pair if unquote(name).lower() in HARMLESS_QUERY else f"{name}={REDACTED}"


ACCEPT_ENCODING_FIX = (
    f"name codings loadgen inflates as they arrive ({', '.join(CONTENT_CODINGS)}), e.g. "
    f"'{', '.join(CLIENT_CODINGS)}' as the OpenAI SDK sends, or 'none'"
)


def accept_encoding_codings(value: object) -> tuple[str, ...]:
    """The codings of an Accept-Encoding setting: a comma-separated string or a list of
    names, each one of CONTENT_CODINGS, in order, once each; `none` (or nothing) is ().
    ValueError saying what is wrong."""
    if isinstance(value, str):
        names = [part.strip().lower() for part in value.split(",")]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        names = [str(v).strip().lower() for v in value]
    else:
        raise ValueError(
            f"must be true, false, a list or a comma-separated string, got {value!r:.60}"
        )
    names = [n for n in names if n and n != "none"]
    for name in names:
        if name not in CONTENT_CODINGS:
            raise ValueError(f"{name!r:.40} is not a coding loadgen inflates as it arrives")
    return tuple(dict.fromkeys(names))


def number_text(value: float) -> str:
    """A number as a person writes it: `2,678,400`, `0.5`, `1e-12`."""
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:g}"


def check_schedule(spec: WorkloadSpec, after: str = "") -> None:
    """Every class's schedule fits the ranges (`MAX_SPAN_S`, `MAX_RATE_PER_S`, periods):
    checked on the file and again after the command line's overrides (`after` names them).

    A class bounded by `requests` spans about start_s + (requests − 1) / mean rate; one
    bounded by `duration_s` spans start_s + duration_s. The plans check the real times.
    """
    for name, cls in spec.classes.items():
        key = f"classes.{name}"
        arrival = cls.arrival
        rates = [arrival.rate_per_s, arrival.on_rate_per_s, arrival.off_rate_per_s]
        rates += [rate for rate, _ in arrival.steps]
        if max(rates) > MAX_RATE_PER_S:
            problem = f"a rate of {number_text(max(rates))} req/s{after} is over the limit"
            fix = f"at most {number_text(MAX_RATE_PER_S)} req/s"
            raise ConfigError(spec.source, f"{key}.arrival", problem, fix)
        span = _expected_span_s(cls)
        if span > MAX_SPAN_S:
            rate = arrival.mean_rate_per_s
            how = (f"{number_text(cls.requests)} requests at {number_text(rate)} req/s"
                   if cls.requests and rate and cls.duration_s is None
                   else "its schedule")  # fmt: skip
            raise ConfigError(
                spec.source, key, f"{how}{after} would span ~{_span_text(span)} s: "
                f"more than {number_text(MAX_SPAN_S)} s ({SPAN_WHY})",
                "raise the rate or lower requests / duration_s / start_s",
            )  # fmt: skip
        if arrival.process == "onoff":
            periods = span / (arrival.on_mean_s + arrival.off_mean_s)
            if periods > MAX_PERIODS:
                raise ConfigError(
                    spec.source, f"{key}.arrival", f"~{number_text(round(periods))} on/off "
                    f"periods over its ~{number_text(round(span))} s span (limit "
                    f"{number_text(MAX_PERIODS)})", "lengthen on_mean_s / off_mean_s",
                )  # fmt: skip


def _span_text(span_s: float) -> str:
    """Whole seconds, unless that would round down to the limit it exceeds."""
    return f"{span_s:,.0f}" if round(span_s) > MAX_SPAN_S else f"{span_s:,.2f}"


def _expected_span_s(cls: ClassSpec) -> float:
    """Seconds from t0 to the class's last intended arrival, on average (0 if unknown)."""
    start = cls.arrival.start_s
    if cls.duration_s is not None:
        return start + cls.duration_s
    rate = cls.arrival.mean_rate_per_s
    if cls.requests is None or cls.concurrency is not None or not rate:
        return start
    if cls.arrival.process == "ramp":
        return start + sum(d for _, d in cls.arrival.steps)
    return start + (cls.requests - 1) / rate


def metrics_url_problem(url: str) -> str:
    """What is wrong with a server-metrics URL (absolute, or a path on the target), or ""."""
    if url.startswith("/"):
        return path_problem(url)
    problem = url_problem(url)
    return f"{problem}, or a path such as /metrics on the target" if problem else ""


def url_problem(url: object) -> str:
    """What is wrong with a base URL (scheme, host, port), or "" if nothing."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return f"must look like http://host:port or https://host:port (got {_shown(url)!r:.80})"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port that is not a number in 0-65535, a bad IPv6 literal
        return f"is not a valid URL ({exc}), e.g. http://127.0.0.1:8000 (got {_shown(url)!r:.80})"
    if not parts.hostname:
        return f"has no host, e.g. http://127.0.0.1:8000 (got {_shown(url)!r:.80})"
    if port == 0:
        return f"has port 0: the port must be 1-65535 (got {_shown(url)!r:.80})"
    if any(c in url for c in "\r\n\t\x00 ") or not url.isascii():
        return (f"must be ASCII without spaces or control characters (percent-encode "
                f"others) (got {_shown(url)!r:.80})")  # fmt: skip
    if problem := host_problem(parts.hostname):
        return f"{problem} (got {_shown(url)!r:.80})"
    hostport = parts.netloc.rpartition("@")[2].lower()
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    rest = hostport.removeprefix(host.lower())
    if rest == hostport or not re.fullmatch(r"(:[0-9]*)?", rest):  # 127.[::1], [::1]x:80
        return f"has a host and port that do not parse ({hostport:.60}) (got {_shown(url)!r:.80})"
    return ""


def host_problem(host: str) -> str:
    """What is wrong with a URL's host (an IPv4 address past 255, a bad IPv6 literal, an
    empty or over-long DNS label), or "": what every client that connects would refuse."""
    if ":" in host:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return f"has host [{host:.60}], which is not an IPv6 address"
        return ""
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return (f"has host {host:.60}, which is not an IPv4 address (four numbers "
                    "0-255, e.g. 127.0.0.1)")  # fmt: skip
        return ""
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return (f"has host {host:.60}, which is not a host name (dot-separated labels of "
                "1-63 letters, digits, - and _)")  # fmt: skip
    return ""


def header_problem(name: str, value: str) -> str:
    """What is wrong with a request header (a name that is not a token, a value with CR/LF
    that would inject another header), or "" if nothing."""
    if not _TOKEN.match(name):
        return f"{name!r:.60} is not a header name (letters, digits and !#$%&'*+-.^_`|~)"
    if any(c in value for c in "\r\n\x00"):
        return "a header value must not contain CR, LF or NUL"
    try:
        value.encode("latin-1")  # how the request head is written
    except UnicodeEncodeError:
        return "a header value must be ASCII (or Latin-1) text"
    return ""


# W3C trace-context's tracestate (https://www.w3.org/TR/trace-context/#tracestate-header):
# up to 32 comma-separated `key=value` members; a key is a lower-case simple key or
# `tenant@system`, a value up to 256 printable ASCII characters but `,` and `=`, not ending
# in a space.
MAX_TRACESTATE_MEMBERS = 32
_TRACESTATE_KEY = re.compile(
    r"[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}"
)
_TRACESTATE_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


def tracestate_problem(value: str) -> str:
    """What is wrong with a W3C tracestate list, or "" if nothing."""
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members:
        return "is empty"
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return f"has {len(members)} members (at most {MAX_TRACESTATE_MEMBERS})"
    for member in members:
        key, sep, rest = member.partition("=")
        if not sep or not _TRACESTATE_KEY.fullmatch(key) or not _TRACESTATE_VALUE.fullmatch(rest):
            return f"{member!r:.80} is not a key=value member"
    return ""


def _shown(url: object) -> object:
    """A URL as a message may quote it (`redact_url`); anything else as it is."""
    return redact_url(url) if isinstance(url, str) else url


def path_problem(path: str) -> str:
    """What is wrong with a request path (it goes into the request line as is), or ""."""
    if not path.startswith("/") or not path.isascii() or any(c in path for c in " \r\n\t\x00"):
        rule = "must start with / and be ASCII without spaces (percent-encode others)"
        return f"{rule} (got {redact_url(path)!r:.80})"
    return ""
