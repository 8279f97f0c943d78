"""The server-metrics scraper in a process of its own, off the process that sends.

A real server's `/metrics` is large (vLLM's: ~51 KB, ~500 samples) and parsing it in Python
takes 12–29 ms of CPU; on a thread of the sending process that holds the GIL while sends
are due (send lag p99 13 → 72 ms at one scrape per 0.25 s, `benchmarks/scrape_overhead.py`).
So `loadgen run` scrapes from a spawned process: it runs the same `engine.scrape.Scraper`
(fetch, parse, auth, classified failures, the same rows stamped on the host's one monotonic
clock) and spills the rows to `server_metrics.parts/` itself. The sending process gets only
small messages over a pipe: after each scrape the tally (`ScrapeStats`) and the latest
live gauges (what a live exporter re-publishes); the scraper's log lines, for the run log;
at the end, the final tally. A reader thread takes them: a few µs per scrape.

The child runs at a lower CPU priority (`nice` 10): where cores are short, the scrape
waits, not the sends. It is a `child.Child`, as a worker is: it ignores SIGINT and SIGTERM
(the parent owns them and stops it with a message) and dies with its parent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from loadgen.analysis.server import current_gauges, server_family
from loadgen.engine.logs import LOGGER
from loadgen.engine.network import Network
from loadgen.engine.scrape import ScrapeAuth, Scraper, ScrapeStats, default_timeout_s
from loadgen.engine.secrets import Redactor
from loadgen.errors import LoadgenError
from loadgen.results.summary import ScrapeAccess
from loadgen.results.write import write_server_part
from loadgen.run.processes.child import DONE, READY, READY_TIMEOUT_S, Child, NotReady, Pipe

NICENESS = 10  # the scraper's lower CPU priority: a scrape may wait, a send may not
STOP_TIMEOUT_S = 30.0  # its last scrape (at most the scrape timeout, 10 s) and last spill
STOP = "stop"  # parent → scraper: one more scrape, the last spill, then `done`


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeTask:
    """What the scraper process needs (pickled to it at spawn)."""

    url: str
    interval_s: float
    timeout_s: float
    run_dir: Path
    auth: ScrapeAuth
    redactor: Redactor
    network: Network


class ScraperProcess:
    """`engine.scrape.Scraper`'s interface (start, stop, stats, access, first_done,
    failures, timeout_s) for a scraper that runs in a spawned process and spills its rows
    to `run_dir`, plus `live_gauges` (computed there: no samples cross the pipe)."""

    def __init__(
        self,
        url: str,
        interval_s: float = 1.0,
        *,
        run_dir: Path,
        auth: ScrapeAuth,
        redactor: Redactor | None = None,
        timeout_s: float | None = None,
        network: Network | None = None,
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self.auth = auth
        self.timeout_s = timeout_s if timeout_s is not None else default_timeout_s(interval_s)
        self._task = ScrapeTask(url=url, interval_s=interval_s, timeout_s=self.timeout_s,
                                run_dir=run_dir, auth=auth,
                                redactor=redactor if redactor is not None else Redactor(),
                                network=network if network is not None else Network())  # fmt: skip
        self.first_done = threading.Event()  # set when the first scrape has ended
        self.pid: int | None = None  # the scraper process's
        asked = ScrapeAccess(headers={name: auth.sources[name] for name in sorted(auth.headers)},
                             same_origin=auth.same_origin, withheld=auth.withheld)  # fmt: skip
        self._stats = ScrapeStats(url=url, interval_s=interval_s, scrapes=0, failures=0,
                                  malformed_lines=0, last_error=None, access=asked)  # fmt: skip
        self._gauges: dict[str, float] = {}
        self._final: ScrapeStats | None = None
        self._child: Child | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def failures(self) -> int:
        return self._stats.failures

    @property
    def scrapes(self) -> int:
        return self._stats.scrapes

    def start(self) -> None:
        """Spawn the scraper and wait until it has imported and set up (its first scrape
        begins then), so that its start-up shares no CPU with the run's sends."""
        child = Child.spawn(scraper_main, (self._task,), name="loadgen-scraper", daemon=True)
        self._child = child
        try:
            child.wait_ready()
        except NotReady as why:
            if why.exit_code is None:
                child.kill()
                raise LoadgenError(f"the server-metrics scraper was not ready after "
                                   f"{READY_TIMEOUT_S:g} s") from None  # fmt: skip
            raise LoadgenError(f"the server-metrics scraper exited with code "
                               f"{why.exit_code} before it began") from None  # fmt: skip
        self.pid = child.pid
        self._reader = threading.Thread(target=self._read, args=(child.conn,),
                                        name="loadgen-scrape-reader", daemon=True)  # fmt: skip
        self._reader.start()

    def stop(self) -> ScrapeStats:
        """Ask for one more scrape (the run's end state) and the last spill, wait for the
        process to end, return the tally (a second call returns the same)."""
        with self._lock:
            child, self._child = self._child, None
            if child is not None:
                child.tell((STOP,))  # gone already: its last tally stands
                if self._reader is not None:
                    self._reader.join(STOP_TIMEOUT_S)
                if not child.stop((None, 5.0)):
                    LOGGER.warning("server metrics: the scraper did not stop; killed")
                child.close()
        return self.stats()

    def stats(self) -> ScrapeStats:
        """The tally so far (the final one once stopped)."""
        return self._final if self._final is not None else self._stats

    def access(self) -> ScrapeAccess:
        """How the endpoint was asked, the failures by kind and the latest one's note."""
        access = self.stats().access
        return access if access is not None else ScrapeAccess()

    family: str | None = None  # the server's kind from its metric names (`server_family`)

    def live_gauges(self) -> dict[str, float]:
        """The latest scrape's figures a live exporter re-publishes."""
        return self._gauges

    def _read(self, conn: Pipe) -> None:
        """The reader thread: every message of the scraper process, until it is done."""
        try:
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return
                kind = message[0]
                if kind == "scrape":
                    self._stats, self._gauges = message[1], message[2] or self._gauges
                    self.family = message[3] or self.family
                    self.first_done.set()
                elif kind == "log":
                    LOGGER.log(message[1], "%s", message[2])
                elif kind == DONE:
                    self._final = message[1]
                    return
        finally:
            self.first_done.set()  # nobody waits for a first scrape that will never come


def scraper_main(task: ScrapeTask, conn: Pipe) -> None:
    """Entry point of the scraper process: scrape until the parent says stop (or dies)."""
    with contextlib.suppress(OSError, AttributeError):  # not on every platform
        os.nice(NICENESS)  # on a busy host the sends, not the scrapes, get the CPU first
    lock = threading.Lock()

    def tell(message: tuple[Any, ...]) -> None:
        with lock:
            conn.send(message)

    LOGGER.addHandler(_PipeHandler(tell))
    LOGGER.setLevel(logging.DEBUG)  # the parent's handlers choose what is shown
    LOGGER.propagate = False

    def scraped(scraper: Scraper) -> None:
        gauges = current_gauges(scraper.latest) if scraper.latest else None
        family = server_family(sorted({n for n, _, _ in scraper.latest})) if scraper.latest else ""
        tell(("scrape", scraper.stats(), gauges, family or None))

    scraper = Scraper(task.url, task.interval_s, timeout_s=task.timeout_s, auth=task.auth,
                      redactor=task.redactor, spill=partial(write_server_part, task.run_dir),
                      on_scrape=scraped, network=task.network)  # fmt: skip
    tell((READY, os.getpid()))
    scraper.start()
    with contextlib.suppress(EOFError):  # EOF: the parent is gone
        conn.recv()  # (STOP,)
    tell((DONE, scraper.stop()))
    conn.close()


class _PipeHandler(logging.Handler):
    """The scraper's log lines, to the parent's run log (formatted and redacted there)."""

    def __init__(self, tell: Any) -> None:
        super().__init__()
        self._tell = tell

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError):  # the parent is gone
            self._tell(("log", record.levelno, record.getMessage()))
