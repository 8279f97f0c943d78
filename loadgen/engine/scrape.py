"""The server's side: a Prometheus `/metrics` scraper that runs beside the engine.

Off the hot path: a thread of its own (one blocking GET per interval with httpx, parsed with
prometheus_client's text-format parser, the reference implementation of the format), never a
task on the engine's event loop, so a slow or hung endpoint cannot delay a send or a read.
Each scrape is stamped on the run's monotonic clock when its GET starts (as Prometheus stamps
a scrape) and kept as one row per sample: `(mono_ns, name, labels, value)`; histograms and
summaries stay as their `_bucket`/`_sum`/`_count` series. A scrape that fails or times out
(connect error, non-2xx, a body over the cap) is counted with its last error, never fatal; a
line the parser rejects is skipped and counted, the rest of the scrape is kept.

Rows are spilled to `server_metrics.parts/` (results.runfolder) about every ten scrapes, so a
killed run keeps what was scraped; the run's end joins them into `server_metrics.parquet`
with `t_ns` since t0.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadgen.engine.clock import SYSTEM_CLOCK, Clock

MAX_SCRAPE_BYTES = 32 * 1024 * 1024  # a /metrics body past this is a failed scrape
SPILL_EVERY = 10  # scrapes between spills of the rows to a part file

Row = tuple[int, str, tuple[tuple[str, str], ...], float]  # (mono_ns, name, labels, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeStats:
    """What the scraper did: scrapes kept, failed scrapes, skipped lines, the last error."""

    url: str
    interval_s: float
    scrapes: int
    failures: int
    malformed_lines: int
    last_error: str | None


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
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self._clock = clock
        # A scrape may take longer than a short interval (missed ticks are skipped), but a
        # hung endpoint is given up on: 2 s or the interval, whichever is longer, at most 10 s.
        self._timeout_s = timeout_s if timeout_s is not None else min(max(interval_s, 2.0), 10.0)
        self._spill = spill
        self._transport = transport
        self.rows: list[Row] = []
        self.scrapes = 0
        self.failures = 0
        self.malformed_lines = 0
        self.last_error: str | None = None
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
        )

    def _loop(self) -> None:
        kwargs: dict[str, Any] = {"timeout": self._timeout_s, "follow_redirects": True}
        if self.url.startswith("http://"):
            # No TLS on this URL: skip building a certificate store (~30 ms of CPU, measured
            # by benchmarks/scrape_overhead.py) that it would never use.
            kwargs["verify"] = False
        if self._transport is not None:
            kwargs["transport"] = self._transport
        interval_ns = int(self.interval_s * 1e9)
        with httpx.Client(**kwargs) as client:
            next_ns = self._clock.now_ns()
            while True:
                stopping = self._stop.is_set()
                self.scrape_once(client)
                if stopping:
                    return
                next_ns += interval_ns
                now = self._clock.now_ns()
                if next_ns < now:  # a scrape longer than the interval: skip, do not pile up
                    next_ns = now + interval_ns - (now - next_ns) % interval_ns
                self._stop.wait((next_ns - now) / 1e9)

    def scrape_once(self, client: httpx.Client) -> None:
        """One GET, parsed into rows; a failure is counted, never raised."""
        t_ns = self._clock.now_ns()
        try:
            text = _get(client, self.url)
        except (httpx.HTTPError, ScrapeError, UnicodeDecodeError) as exc:
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"[:300]
            return
        samples, bad = parse_exposition(text)
        self.malformed_lines += bad
        self.scrapes += 1
        self.latest = samples
        rows = self.rows
        for name, labels, value in samples:
            if math.isnan(value):
                continue  # NaN gauges (an empty summary's quantiles) carry nothing
            rows.append((t_ns, name, tuple(sorted(labels.items())), value))
        if self._spill is not None and self.scrapes % SPILL_EVERY == 0:
            self._spill(rows)
            self.rows = []


class ScrapeError(Exception):
    """A scrape's response that is not an exposition (status, size)."""


def _get(client: httpx.Client, url: str) -> str:
    with client.stream("GET", url, headers={"accept": "text/plain"}) as response:
        if response.status_code >= 300:
            raise ScrapeError(f"HTTP {response.status_code}")
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > MAX_SCRAPE_BYTES:
                raise ScrapeError(f"body over {MAX_SCRAPE_BYTES} bytes")
    return body.decode("utf-8")
