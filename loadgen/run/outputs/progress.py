"""The progress line: one process's counters, or a workers' parent's sum of theirs.

Redrawn in place on a terminal (each `draw`, about four times a second), a line every 10 s
elsewhere (a log would scroll), none when the run is quiet. It reads the engine's live
counters (`engine.runner.LiveStats`), not the records, so it takes none.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from loadgen.engine.runner import LiveStats
from loadgen.results.runfolder import T0
from loadgen.run.outputs import Ended
from loadgen.run.terminal import Terminal

NOT_TTY_EVERY_S = 10.0  # a line this often when the lines do not go to a terminal


class Progress:
    """The progress line of one run, from t0 to the engine's end (`close`)."""

    record = None

    def __init__(
        self, terminal: Terminal, stats: Callable[[], LiveStats],
        suffix: Callable[[], str] = lambda: "",
    ) -> None:  # fmt: skip
        self.terminal = terminal
        self.stats = stats
        self.suffix = suffix  # what follows the counters (a workers' parent: workers 2/2)
        self.tty = terminal.is_tty()
        self.t0_ns = 0
        self._last_line = 0.0

    def begin(self, t0: T0) -> None:
        self.t0_ns = int(t0.perf_counter_ns or 0)

    def draw(self) -> None:
        """The line as of now, if one is due."""
        now = time.monotonic()
        if self.terminal.quiet or (not self.tty and now - self._last_line < NOT_TTY_EVERY_S):
            return
        self._last_line = now
        line = progress_line(self.stats(), (time.perf_counter_ns() - self.t0_ns) / 1e9)
        line += self.suffix()
        print(f"\r{line}\x1b[K" if self.tty else line, end="" if self.tty else "\n",
              file=self.terminal.stream, flush=True)  # fmt: skip

    def close(self) -> None:
        """The engine is done: a line redrawn in place is ended."""
        if self.tty and not self.terminal.quiet:
            print(file=self.terminal.stream)

    def end(self, ended: Ended) -> None:
        pass  # closed with the engine, before anything else is said


def progress_line(stats: LiveStats, elapsed_s: float) -> str:
    """`[  12.3s] sent 120/400  in flight 14  ok 100  failed 6  TTFT p50 250 ms  p99 800 ms`."""
    ttft = stats.ttft
    ttft_text = (
        f"TTFT p50 {ttft.percentile_ms(50):,.0f} ms  p99 {ttft.percentile_ms(99):,.0f} ms"
        if ttft.count
        else "TTFT -"
    )
    return (
        f"[{max(0.0, elapsed_s):7.1f}s] sent {stats.sent}/{stats.planned}  "
        f"in flight {stats.in_flight}  ok {stats.ok}  failed {stats.failed}  {ttft_text}"
    )
