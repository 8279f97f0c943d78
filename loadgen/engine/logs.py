"""Diagnostic logging: `loadgen -v` (info) and `-vv` (debug, one line per request with its
headers), to stderr and, during a run, to `<run>/loadgen.log`.

Every line passes through the run's `Redactor` in the formatter, after the message is
built, so no log call can leak a credential however it was formatted: the key, header
values read from the environment, URL user-info and query values, their base64 forms, and
any run of 8 or more of their characters come out as `<redacted>`. The per-chunk path never
logs; the per-request debug line is built only when debug is enabled.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from loadgen.errors import LoadgenError
from loadgen.printable import printable
from loadgen.results.runfolder import RUN_LOG

LOGGER = logging.getLogger("loadgen")
LEVELS = {0: logging.WARNING, 1: logging.INFO}  # 2 or more: DEBUG
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_redactors: list[Callable[[str], str]] = []  # the running runs' redactors (one, in practice)


class RedactingFormatter(logging.Formatter):
    """Formats a record, then hides every known secret in the finished text."""

    def format(self, record: logging.LogRecord) -> str:
        # The message may quote a server (headers, an error): one line, nothing escaped
        # left to draw. A traceback (exc_info) keeps its own lines.
        record.msg, record.args = printable(record.getMessage()), None
        text = super().format(record)
        for redact in _redactors:
            text = redact(text)
        return text


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]  # generic only in typeshed
    """Writes to whatever `sys.stderr` is at the time (click's test runner swaps it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


class RunLogHandler(logging.FileHandler):
    """`<run>/loadgen.log`; a failed write (disk full) stops the file, says so once on
    stderr, and never raises: the log is a diagnostic, the records are the measurement
    (their own writes end the run with exit 3 if the disk stays full)."""

    failed: str | None = None

    def handleError(self, record: logging.LogRecord) -> None:  # logging.Handler names it so
        exc = sys.exc_info()[1]
        if self.failed is None:
            self.failed = str(exc)
            print(f"warning: {self.baseFilename}: {exc}; the run log stops here", file=sys.stderr)
        self.setLevel(logging.CRITICAL + 1)  # nothing more to this file

    def close(self) -> None:
        with contextlib.suppress(OSError):  # flushing the last lines onto a full disk
            super().close()


def _ending_record(exc: BaseException) -> logging.LogRecord:
    """The run log's last line for a run that ended by `exc`: a LoadgenError's message (what,
    where, how to fix), an interrupt, or a bug with its traceback."""
    if isinstance(exc, KeyboardInterrupt):
        text, trace = "run stopped: interrupted (Ctrl-C or SIGTERM)", None
    elif isinstance(exc, LoadgenError):
        text, trace = f"run stopped: {exc}", None
    else:
        text, trace = f"run stopped by an error: {exc!r}", (type(exc), exc, exc.__traceback__)
    return LOGGER.makeRecord(LOGGER.name, logging.ERROR, __file__, 0, "%s", (text,), trace)


def configure(verbosity: int) -> None:
    """Send loadgen's log to stderr at the level `-v` count asks for (none: warnings only)."""
    level = LEVELS.get(verbosity, logging.DEBUG)
    LOGGER.setLevel(level)
    if not any(isinstance(h, StderrHandler) for h in LOGGER.handlers):
        handler = StderrHandler()
        handler.setFormatter(RedactingFormatter(FORMAT))
        LOGGER.addHandler(handler)
    for each in LOGGER.handlers:
        each.setLevel(level)
    LOGGER.propagate = False


@contextlib.contextmanager
def run_log(run_dir: Path, redact: Callable[[str], str]) -> Iterator[None]:
    """During a run: redact with this run's secrets, and copy the log to `<run>/loadgen.log`
    (info and up; debug too under `-vv`). A run that ends by an error or an interrupt says
    so there last (the error's message, a bug's traceback), so the log kept of a run that
    never began (`<run-id>.failed.log`) holds why, not just its first line; stderr has it
    from the command already, so it goes to the file alone."""
    level = min(LOGGER.getEffectiveLevel(), logging.INFO)
    handler = RunLogHandler(run_dir / RUN_LOG, encoding="utf-8")
    handler.setFormatter(RedactingFormatter(FORMAT))
    handler.setLevel(level)
    previous = LOGGER.level
    LOGGER.setLevel(level)
    LOGGER.addHandler(handler)
    _redactors.append(redact)
    try:
        yield
    except BaseException as exc:
        handler.handle(_ending_record(exc))
        raise
    finally:
        _redactors.remove(redact)
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(previous)
        handler.close()
