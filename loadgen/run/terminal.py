"""Where a run's lines go: one stream and whether the run is quiet, for every part of it.

The command's stderr (a test's or an embedding program's buffer instead): the set-up notes,
the progress line, warnings, the interrupt and watchdog messages. It travels inside the run
context (`run.context.RunContext`), not as an argument of its own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TextIO


@dataclass(frozen=True, slots=True)
class Terminal:
    """A run's lines: `say` what the run does (unless quiet, -q), `warn` what must be said
    even then (warnings, interrupts, the watchdog, a client failure)."""

    stream: TextIO = field(default_factory=lambda: sys.stderr)  # as it is at the call
    quiet: bool = False

    def say(self, line: str) -> None:
        """A line unless the run is quiet."""
        if not self.quiet:
            print(line, file=self.stream, flush=True)

    def warn(self, line: str) -> None:
        """A line even when the run is quiet."""
        print(line, file=self.stream, flush=True)

    def is_tty(self) -> bool:
        """Whether the lines go to a terminal (the progress line is then redrawn in place)."""
        return self.stream.isatty()
