"""A machine as busy as a shared CI runner: busy loops beside the test, on its cores.

`busy_loops(2)` starts two Python processes that spin (`while True: pass`) for as long as
the block lasts, then ends exactly those two (by their process ids) and reaps them. On a
2-core box that is a load of 2 before the test's own processes (loadgen, the simulator):
what a shared CI runner looks like to a load generator.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "while True: pass"


@contextmanager
def busy_loops(count: int = 2) -> Iterator[list[int]]:
    """`count` spinning processes for the duration of the block; their pids are yielded."""
    spinning = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield [p.pid for p in spinning]
    finally:
        for process in spinning:
            process.kill()
        for process in spinning:
            process.wait(timeout=10)
