"""The server's side: a Prometheus `/metrics` scraper that runs beside the engine.

Off the hot path: a thread of its own (one GET per interval with httpx, on an event loop of
that thread's own, parsed with prometheus_client's text-format parser, the reference
implementation of the format), never a task on the engine's event loop, so a slow or hung
endpoint cannot delay a send or a read.
`loadgen run` runs it in a process of its own (`run.processes.scraper`): parsing a real server's
exposition holds the GIL for tens of ms, which would delay sends of the same process.
Each scrape is stamped on the run's monotonic clock when its GET starts (as Prometheus stamps
a scrape) and kept as one row per sample: `(mono_ns, name, labels, value)`; histograms and
summaries stay as their `_bucket`/`_sum`/`_count` series. A scrape that fails or times out
(connect error, non-2xx, a body over the cap) is counted with its last error, never fatal; a
line the parser rejects is skipped and counted, the rest of the scrape is kept.

Bounded whatever the endpoint sends: each scrape within its timeout in all (`engine.fetch`:
a total deadline, where httpx's restarts on every read and a trickled body held a scrape,
and the run's end, for ever), its body to `MAX_SCRAPE_BYTES`, its parse to
`MAX_SCRAPE_LINES` lines (and as many more of a known server's metrics; the rest counted as
`dropped_lines`), the rows held to `SPILL_ROWS` (five 20 MB scrapes once held
4 GiB and lost the server's metrics), and `latest` to the known servers' samples.

Auth (`scrape_auth`): a scrape sends the target's own credential headers (Authorization,
x-api-key, ...: the names `engine.secrets` treats as credentials, and the target URL's
user-info as Basic auth) only when the metrics URL has the target's origin (scheme, host,
port), never to another; the endpoint's own headers (`target.server_metrics_headers`,
`--server-metrics-header`) and the metrics URL's user-info are sent to it. A redirect to
another origin is followed without any of them. A refused scrape is classified (401, 403,
404, other status, connect, timeout, ...) and the latest becomes a note saying what, where
and how to fix it (`ScrapeAccess.problem`); header values never enter a message.

Rows are spilled to `server_metrics.parts/` (results.runfolder) about every ten scrapes, or
sooner once `SPILL_ROWS` are held, so a killed run keeps what was scraped; the run's end
joins them into `server_metrics.parquet` with `t_ns` since t0.
"""

from __future__ import annotations

import asyncio
import base64
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadgen.analysis.server import FAMILY_PREFIXES
from loadgen.engine.clock import SYSTEM_CLOCK, Clock
from loadgen.engine.fetch import fetch
from loadgen.engine.logs import LOGGER
from loadgen.engine.network import Network
from loadgen.engine.secrets import Redactor
from loadgen.engine.tls import find_verify_error, verify_failure
from loadgen.results.summary import ScrapeAccess
from loadgen.workload.checks import CREDENTIAL_NAMES, redact_url

MAX_SCRAPE_BYTES = 32 * 1024 * 1024  # a /metrics body past this is a failed scrape
# Lines of one scrape parsed (vLLM's /metrics has ~600; each model served adds ~150): past
# them, as many more of the known servers' lines (`FAMILY_PREFIXES`) are kept, and the rest
# dropped and counted. The parse holds ~2 KB a line of 8 labels (prometheus_client's samples).
MAX_SCRAPE_LINES = 20_000
SPILL_EVERY = 10  # scrapes between spills of the rows to a part file
SPILL_ROWS = 10_000  # rows held before a spill, however few scrapes brought them

Row = tuple[int, str, tuple[tuple[str, str], ...], float]  # (mono_ns, name, labels, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeStats:
    """What the scraper did: scrapes kept, failed scrapes, skipped lines, the last error,
    and how it asked (header names, failures by kind, the classified problem)."""

    url: str
    interval_s: float
    scrapes: int
    failures: int
    malformed_lines: int
    last_error: str | None
    access: ScrapeAccess | None = None
    dropped_lines: int = 0  # lines past MAX_SCRAPE_LINES not parsed, over every scrape


# --- auth: which headers a scrape sends -------------------------------------------------------

TARGET, OWN, URL_USERINFO = "target", "server_metrics_headers", "url"  # where a header came from
FIX_FLAG = "--server-metrics-header"  # named in the notes, with the workload's key
FIX_KEY = "target.server_metrics_headers"


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeAuth:
    """The headers every scrape sends (values in memory only) and where each came from."""

    headers: Mapping[str, str] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)  # name -> TARGET | OWN | URL
    same_origin: bool = False  # the metrics URL has the target's origin
    withheld: tuple[str, ...] = ()  # the target's credential headers not sent (another origin)
    target_origin: str = ""  # for the notes


def origin(url: str) -> tuple[str, str, int]:
    """A URL's origin: (scheme, host, port), the port defaulted by scheme, case folded."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or (443 if scheme == "https" else 80)


def scrape_auth(
    metrics_url: str,
    target_origin: str,
    target_headers: Mapping[str, str],
    own_headers: Mapping[str, str] | None = None,
) -> ScrapeAuth:
    """What a scrape of `metrics_url` sends: the target's credential headers when it has the
    target's origin, the metrics URL's user-info as Basic auth, then the endpoint's own
    headers (each replaces one of the same name, whatever its case)."""
    same = origin(metrics_url) == origin(target_origin)
    credentials = {n: v for n, v in target_headers.items() if CREDENTIAL_NAMES.search(n)}
    headers: dict[str, str] = {}
    sources: dict[str, str] = {}

    def put(name: str, value: str, source: str) -> None:
        for old in [n for n in headers if n.lower() == name.lower()]:
            del headers[old], sources[old]
        headers[name], sources[name] = value, source

    if same:
        for name, value in credentials.items():
            put(name, value, TARGET)
    parts = urlsplit(metrics_url)
    if parts.username is not None:
        creds = f"{parts.username}:{parts.password or ''}".encode()
        put("Authorization", "Basic " + base64.b64encode(creds).decode(), URL_USERINFO)
    for name, value in (own_headers or {}).items():
        put(name, value, OWN)
    withheld = () if same else tuple(sorted(credentials))
    return ScrapeAuth(headers=headers, sources=sources, same_origin=same, withheld=withheld,
                      target_origin=target_origin)  # fmt: skip


def without_userinfo(url: str) -> str:
    """The URL as requested: its user-info is sent as a header of our own (`scrape_auth`)."""
    parts = urlsplit(url)
    if parts.username is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# --- a refused scrape: its kind and the note that says how to fix it --------------------------


def problem_note(kind: str, status: int | None, detail: str, url: str, auth: ScrapeAuth) -> str:
    """What went wrong with `GET url`, and how to fix it (header names only, never values;
    `url` already redacted; no server-supplied text)."""
    sent = ", ".join(f"{n} (from {auth.sources[n]})" for n in sorted(auth.headers))
    own = f"{FIX_FLAG} 'Authorization: Bearer ${{METRICS_TOKEN}}' (or {FIX_KEY})"
    what = f"GET {url} → {_status_text(status)}" if status is not None else f"GET {url}"
    if kind == "unauthorized":
        if auth.headers:
            return (
                f"{what}: the endpoint refused the credentials sent ({sent}): check them, "
                f"or give it its own with {own}, which replaces one of the same name"
            )
        why = "sent no credentials"
        if auth.withheld:
            why += (
                f": the target's ({', '.join(auth.withheld)}) go only to the target's "
                f"origin ({auth.target_origin}), never to another host"
            )
        return f"{what}: {why}; pass its credentials with {own}"
    if kind == "forbidden":
        asked = f"with the credentials sent ({sent})" if auth.headers else "without credentials"
        return (
            f"{what}: the endpoint refuses to serve its metrics {asked}: give credentials "
            f"allowed to read it with {own}, or scrape the server itself, past its "
            "gateway (--server-metrics-url http://HOST:PORT/metrics)"
        )
    if kind == "not_found":
        return (
            f"{what}: no metrics at this path: check --server-metrics-url (vLLM and TGI "
            "serve /metrics; SGLang with --enable-metrics; llama.cpp with --metrics)"
        )
    if kind == "http_error":
        return f"{what}: the endpoint answered an error, not metrics: check it serves them here"
    if kind == "certificate":
        return f"{what}: {detail}"
    if kind == "connect":
        return (
            f"{what}: cannot connect ({detail}): check the host and port, and that the "
            "server is up and exposes its metrics there"
        )
    if kind == "timeout":
        return f"{what}: no answer in time ({detail}): the endpoint is slow or unreachable"
    if kind == "too_large":
        return f"{what}: a body over {MAX_SCRAPE_BYTES} bytes: not one server's /metrics?"
    if kind == "not_text":
        return f"{what}: not UTF-8 text: not a Prometheus text exposition"
    if kind == "redirect":
        return f"{what}: {detail}: give the URL it finally serves with --server-metrics-url"
    return f"{what}: {detail}"


def _status_text(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _classify(exc: Exception) -> tuple[str, int | None]:
    if isinstance(exc, ScrapeError):
        return exc.kind, exc.status
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", None
    if isinstance(exc, httpx.ConnectError):
        return "connect", None
    if isinstance(exc, httpx.TooManyRedirects):
        return "redirect", None
    if isinstance(exc, UnicodeDecodeError):
        return "not_text", None
    return "error", None


def parse_exposition(text: str) -> tuple[list[tuple[str, dict[str, str], float]], int]:
    """Samples of a Prometheus text exposition, and the number of lines skipped as malformed.

    The whole text is parsed at once; if the parser rejects it, line by line, so one bad line
    costs only itself. Comment and blank lines are never counted.
    """
    try:
        return _samples(text), 0
    except ValueError:
        pass
    samples: list[tuple[str, dict[str, str], float]] = []
    bad = 0
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            samples.extend(_samples(stripped + "\n"))
        except ValueError:
            bad += 1
    return samples, bad


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    exposed: set[str] | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if family.type == "counter" and name.endswith("_total"):
                # prometheus_client names a counter's sample `<name>_total` even when the
                # server wrote `<name>` (llama.cpp's n_tokens_max): keep the name as exposed.
                exposed = _exposed_names(text) if exposed is None else exposed
                if name not in exposed and name[: -len("_total")] in exposed:
                    name = name[: -len("_total")]
            out.append((name, dict(sample.labels), float(sample.value)))
    return out


def _exposed_names(text: str) -> set[str]:
    """The sample names as written in the exposition (each line up to `{` or a space)."""
    names = set()
    for line in text.splitlines():
        line = line.lstrip()
        if line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(None, 1)[0])
    return names


def default_timeout_s(interval_s: float) -> float:
    """A scrape may take longer than a short interval (missed ticks are skipped), but a
    hung endpoint is given up on: 2 s or the interval, whichever is longer, at most 10 s."""
    return min(max(interval_s, 2.0), 10.0)


class Scraper:
    """Scrape `url` every `interval_s` seconds in a thread, from `start()` to `stop()`.

    `spill(rows)` (when given) receives the rows about every `SPILL_EVERY` scrapes and at
    the end; rows not yet spilled are in `rows`.
    """

    def __init__(
        self,
        url: str,
        interval_s: float = 1.0,
        *,
        clock: Clock = SYSTEM_CLOCK,
        timeout_s: float | None = None,
        spill: Callable[[list[Row]], None] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        auth: ScrapeAuth | None = None,
        redactor: Redactor | None = None,
        on_scrape: Callable[[Scraper], None] | None = None,
        network: Network | None = None,
    ) -> None:
        self.url = url
        self.network = network if network is not None else Network()
        self.interval_s = interval_s
        self.auth = auth if auth is not None else scrape_auth(url, url, {})
        self._redactor = redactor if redactor is not None else Redactor()
        self._request_url = without_userinfo(url)  # its user-info is in auth's headers
        self._origin = origin(url)
        self._clock = clock
        self.timeout_s = timeout_s if timeout_s is not None else default_timeout_s(interval_s)
        self._spill = spill
        self._transport = transport
        self._on_scrape = on_scrape  # after each scrape, kept or failed (in the scrape thread)
        self.rows: list[Row] = []
        self.scrapes = 0
        self.failures = 0
        self.malformed_lines = 0
        self.dropped_lines = 0
        self.last_error: str | None = None
        self.failed_by: dict[str, int] = {}
        self.problem: tuple[str, int | None, str] | None = None  # kind, status, detail
        self.first_done = threading.Event()  # set when the first scrape has ended
        # The latest successful scrape's samples (replaced whole, so a reader in another
        # thread sees one scrape or the next, never a mix): what a live exporter re-publishes.
        self.latest: list[tuple[str, dict[str, str], float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin scraping (the first scrape at once)."""
        self._thread = threading.Thread(target=self._loop, name="loadgen-scrape", daemon=True)
        self._thread.start()

    def stop(self) -> ScrapeStats:
        """Scrape once more (the run's end state), stop, spill what is left, return the tally."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._spill is not None and self.rows:
            self._spill(self.rows)
            self.rows = []
        return self.stats()

    def stats(self) -> ScrapeStats:
        """The tally so far."""
        return ScrapeStats(
            url=self.url,
            interval_s=self.interval_s,
            scrapes=self.scrapes,
            failures=self.failures,
            malformed_lines=self.malformed_lines,
            last_error=self.last_error,
            access=self.access(),
            dropped_lines=self.dropped_lines,
        )

    def access(self) -> ScrapeAccess:
        """How the endpoint was asked, the failures by kind and the latest one's note."""
        note = kind = status = None
        if self.problem is not None:
            kind, status, detail = self.problem
            shown = redact_url(self.url)
            tried = self.scrapes + self.failures
            note = (f"{self.failures} of {tried} scrapes failed; the latest: "
                    + problem_note(kind, status, detail, shown, self.auth))  # fmt: skip
        return ScrapeAccess(
            headers={name: self.auth.sources[name] for name in sorted(self.auth.headers)},
            same_origin=self.auth.same_origin, withheld=self.auth.withheld,
            failed_by=dict(sorted(self.failed_by.items())), problem=note, problem_kind=kind,
            problem_status=status,
        )  # fmt: skip

    async def _strip_elsewhere(self, request: httpx.Request) -> None:
        """A request hook (it sees every redirect too): no header of ours to another origin."""
        if origin(str(request.url)) != self._origin:
            for name in self.auth.headers:
                request.headers.pop(name, None)

    def _loop(self) -> None:
        kwargs: dict[str, Any] = {
            "timeout": self.timeout_s, "follow_redirects": True,
            "headers": {"accept": "text/plain", **self.auth.headers},
            "event_hooks": {"request": [self._strip_elsewhere]},
        }  # fmt: skip
        # The run's TLS trust and proxy (engine.network), for a redirect to https too.
        kwargs.update(self.network.httpx_options(self.url, redirects=True))
        if self._transport is not None:
            kwargs["transport"] = self._transport
        interval_ns = int(self.interval_s * 1e9)
        # One event loop for the thread's life (its connections are kept between scrapes);
        # each scrape runs on it under its own total deadline.
        with asyncio.Runner() as runner:
            client = httpx.AsyncClient(**kwargs)
            try:
                next_ns = self._clock.now_ns()
                while True:
                    stopping = self._stop.is_set()
                    self.scrape_once(lambda: runner.run(self._get(client)))
                    if self._on_scrape is not None:
                        self._on_scrape(self)
                    if stopping:
                        return
                    next_ns += interval_ns
                    now = self._clock.now_ns()
                    if next_ns < now:  # a scrape longer than the interval: skip, not pile up
                        next_ns = now + interval_ns - (now - next_ns) % interval_ns
                    self._stop.wait((next_ns - now) / 1e9)
            finally:
                runner.run(client.aclose())

    def scrape_once(self, get: Callable[[], str]) -> None:
        """One GET (`get()`: the exposition's text), parsed into rows; a failure is counted,
        never raised."""
        t_ns = self._clock.now_ns()
        try:
            text = get()
        except (httpx.HTTPError, ScrapeError, UnicodeDecodeError) as exc:
            self._failed(exc)
            return
        finally:
            self.first_done.set()
        text, dropped = within_line_cap(text)
        if dropped and not self.dropped_lines:
            shown, cap = redact_url(self.url), f"{MAX_SCRAPE_LINES:,}"
            LOGGER.warning("server metrics: a scrape of %s left %s lines out: the first %s "
                           "lines are parsed, and as many more of a known server's metrics; "
                           "the rest are counted (run.json server_metrics.dropped_lines)",
                           shown, f"{dropped:,}", cap)  # fmt: skip
        self.dropped_lines += dropped
        samples, bad = parse_exposition(text)
        del text
        self.malformed_lines += bad
        self.scrapes += 1
        self.latest = [s for s in samples if s[0].startswith(_KNOWN)]  # all the gauges read
        rows = self.rows
        for name, labels, value in samples:
            if math.isnan(value):
                continue  # NaN gauges (an empty summary's quantiles) carry nothing
            rows.append((t_ns, name, tuple(sorted(labels.items())), value))
        del samples  # before a spill builds its frame: the parse's dicts are no longer needed
        if self._spill is not None and (self.scrapes % SPILL_EVERY == 0 or len(rows) >= SPILL_ROWS):
            self._spill(rows)
            self.rows = []

    async def _get(self, client: httpx.AsyncClient) -> str:
        """The exposition's text, within the scrape's timeout in all."""
        try:
            got = await fetch(client, "GET", self._request_url, deadline_s=self.timeout_s,
                              max_bytes=MAX_SCRAPE_BYTES)  # fmt: skip
        except TimeoutError:
            raise ScrapeError(f"no whole answer within the scrape's {self.timeout_s:g} s",
                              "timeout") from None  # fmt: skip
        if got.status >= 300:
            kind = STATUS_KINDS.get(got.status, "http_error")
            raise ScrapeError(f"HTTP {_status_text(got.status).removeprefix('HTTP ')}", kind,
                              got.status)  # fmt: skip
        if got.cut:
            raise ScrapeError(f"body over {MAX_SCRAPE_BYTES} bytes", "too_large")
        return got.body.decode("utf-8")

    def _failed(self, exc: Exception) -> None:
        kind, status = _classify(exc)
        detail = self._redactor.redact(f"{type(exc).__name__}: {exc}")[:300]
        said = self._redactor.redact(str(exc))[:200] or kind
        if (failed := find_verify_error(exc)) is not None:
            parts = urlsplit(self.url)
            where = f"{parts.hostname}:{parts.port or 443}"
            kind, said = "certificate", verify_failure(failed, where, self.network.tls,
                                                       host=parts.hostname or "")  # fmt: skip
            detail = said
        self.failures += 1
        self.last_error = detail
        first_of_kind = kind not in self.failed_by
        self.failed_by[kind] = self.failed_by.get(kind, 0) + 1
        self.problem = (kind, status, said)
        if first_of_kind:  # once per kind, to the run log (the console shows the note)
            LOGGER.info("server metrics: %s", problem_note(
                kind, status, self.problem[2], redact_url(self.url), self.auth))  # fmt: skip


STATUS_KINDS = {401: "unauthorized", 403: "forbidden", 404: "not_found"}


class ScrapeError(Exception):
    """A scrape's response that is not an exposition (status, size), with its kind."""

    def __init__(self, message: str, kind: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


_KNOWN = tuple(prefix for prefix, _ in FAMILY_PREFIXES)
_DESCRIBED = ("# TYPE ", "# HELP ")


def within_line_cap(text: str, cap: int | None = None) -> tuple[str, int]:
    """`text` cut to its first `cap` lines (`MAX_SCRAPE_LINES`) and up to `cap` later lines
    of a known server's metrics (its name, or the name a `# TYPE`/`# HELP` line describes,
    with a `FAMILY_PREFIXES` prefix), and the number of sample lines left out; `text` itself
    when it is within the cap. Read in place (no list of every line, no copy of the rest)."""
    cap = MAX_SCRAPE_LINES if cap is None else cap
    if text.count("\n") < cap:
        return text, 0
    end = -1
    for _ in range(cap):
        end = text.find("\n", end + 1)
    kept, room, dropped, pos, size = [text[: end + 1]], cap, 0, end + 1, len(text)
    while pos < size:
        stop = text.find("\n", pos) + 1 or size
        known = text.startswith(_KNOWN, pos) or (
            text.startswith(_DESCRIBED, pos) and text.startswith(_KNOWN, pos + 7)
        )
        if known and room:
            kept.append(text[pos:stop])
            room -= 1
        elif text[pos] != "#" and not text[pos:stop].isspace():
            dropped += 1
        pos = stop
    return "".join(kept), dropped
