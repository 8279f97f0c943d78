"""A shard told its start by a driver (`run --ray` places `run --shard i/N --start-when-told`):
the command's side of `child.Child`'s ready and start-at, over its stdout and stdin.

Between the engine's set-up and t0. A shard launched by hand is given `--start-at T` on its
command line, so T must lie far enough ahead for every host to launch it. A driver instead
launches every shard first and agrees T only once each has said it is ready, so T can be a
second ahead however long the launches took. The protocol is two lines: once its engine
is up and its connections warm, the shard writes `ready` on stdout; the driver answers on
stdin with `start T_UNIX_NS CLOCK_OFFSET_NS` (the agreed start on the driver's clock, and
this host's wall clock minus the driver's), or `refuse REASON`, or closes stdin (the run
was given up): then the shard ends before sending anything, with the reason and exit 1.
The shard waits for T + offset on its own clock, so every shard starts at the driver's T.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import anyio

from loadgen.errors import EXIT_USAGE

READY_LINE = "ready"  # shard → driver, on stdout
START_WORD = "start"  # driver → shard: `start T_UNIX_NS CLOCK_OFFSET_NS`
REFUSE_WORD = "refuse"  # driver → shard: `refuse REASON`


@dataclass(slots=True)
class ToldStart:
    """What the driver said: the agreed start (its clock) and this host's offset from it."""

    start_at_unix_ns: int | None = None
    clock_offset_ns: int = 0

    @property
    def local_start_unix_ns(self) -> int:
        """The agreed start on this host's wall clock."""
        assert self.start_at_unix_ns is not None  # read before it is used
        return self.start_at_unix_ns + self.clock_offset_ns

    async def wait(self) -> int:
        """Say ready, read the answer, return the start on this host's clock (or exit 1)."""
        print(READY_LINE, flush=True)
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        self.start_at_unix_ns, self.clock_offset_ns = parse_answer(line)
        return self.local_start_unix_ns


def start_line(start_at_unix_ns: int, clock_offset_ns: int) -> str:
    """The driver's answer that starts a shard."""
    return f"{START_WORD} {start_at_unix_ns} {clock_offset_ns}\n"


def parse_answer(line: str) -> tuple[int, int]:
    """(start, offset) from a `start` line; a refusal or a closed stdin ends the process."""
    words = line.split()
    if len(words) == 3 and words[0] == START_WORD:
        try:
            return int(words[1]), int(words[2])
        except ValueError:
            pass
    if words[:1] == [REFUSE_WORD]:
        why = " ".join(words[1:]) or "no reason given"
    elif not words:
        why = "the driver closed stdin before the start (the run was given up)"
    else:
        why = f"not a start line: {line.strip()[:80]!r}"
    print(f"error: not started, nothing was sent: {why}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)
