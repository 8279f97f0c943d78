"""The engine's clock: one monotonic clock for every interval, the wall clock for anchors.

Every time the engine and its transport take (a send, a read, a deadline, t0) comes from
one `Clock`. The real one, `SYSTEM_CLOCK`, is `time.perf_counter_ns` (CLOCK_MONOTONIC on
Linux, one clock for every process of a host) and `time.time_ns`; its methods are those C
functions themselves, so a caller that binds `clock.now_ns` once pays nothing for the seam.
Tests pass a virtual clock (`loadgen.testing.virtual`) and every interval becomes exact.

The kernel stamps each received segment on the wall clock (CLOCK_REALTIME); `ReadClock`
moves those stamps onto the monotonic clock, never after the read itself.
"""

from __future__ import annotations

import struct
import time
from typing import Protocol

OFFSET_REFRESH_NS = 100_000_000
_TIMESPEC = struct.Struct("@qq")


class Clock(Protocol):
    """Where the engine reads the time: `now_ns` for intervals, `wall_ns` for anchors."""

    def now_ns(self) -> int:
        """Monotonic nanoseconds (every interval and stamp of a run is on this clock)."""
        ...

    def wall_ns(self) -> int:
        """Wall-clock nanoseconds since the epoch (CLOCK_REALTIME)."""
        ...


class SystemClock:
    """The real clocks: `perf_counter_ns` and `time_ns`, unwrapped."""

    __slots__ = ()
    now_ns = staticmethod(time.perf_counter_ns)
    wall_ns = staticmethod(time.time_ns)


SYSTEM_CLOCK = SystemClock()


def clock_offset_ns(clock: Clock = SYSTEM_CLOCK) -> int:
    """The wall clock minus the monotonic clock, from the narrowest of three bracketed reads."""
    now_ns, wall_ns = clock.now_ns, clock.wall_ns
    best_window_ns, best_ns = -1, 0
    for _ in range(3):
        before_ns = now_ns()
        real_ns = wall_ns()
        after_ns = now_ns()
        if best_window_ns < 0 or after_ns - before_ns < best_window_ns:
            best_window_ns, best_ns = after_ns - before_ns, real_ns - (before_ns + after_ns) // 2
        if best_window_ns < 2_000:  # not preempted: a clock read is ~0.1 µs
            break
    return best_ns


class ReadClock:
    """Moves kernel receive times (CLOCK_REALTIME) onto the monotonic clock, for one pool.

    Each clock read costs ~0.1 µs on the VMs measured; a loop iteration that reads hundreds
    of sockets needs one. The first read after each drain reads the monotonic clock:
    `now_ns`, a lower bound on the time of every later read before the next drain. A kernel
    time before that bound is before its own read; one at or after it reads the clock
    again, so a stamp is never placed after the read itself. The offset between the clocks
    is measured every 100 ms (NTP slews the wall clock by at most 0.5 ms a second), from
    the narrowest of three bracketed reads: a process preempted between reading its two
    clocks would otherwise be off by the preemption, and stamp reads early.
    """

    __slots__ = ("_clock", "_now", "now_ns", "offset_at_ns", "offset_ns")

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._now = clock.now_ns  # bound once: stamp() runs for every read
        self.now_ns = 0  # 0: not read since the last drain
        self.offset_ns = 0
        self.offset_at_ns = 0  # when offset_ns was measured (0: never)

    def stamp(self, ancillary: list[tuple[int, int, bytes]]) -> int:
        """The arrival time of a read: the kernel's, from `recvmsg`'s ancillary data, where
        it is plausible (else the wall clock stepped), or the time of the read."""
        bound_ns = self.now_ns
        if not bound_ns:
            bound_ns = self.now_ns = self._now()
            if not self.offset_at_ns or bound_ns - self.offset_at_ns > OFFSET_REFRESH_NS:
                self.offset_ns, self.offset_at_ns = clock_offset_ns(self._clock), bound_ns
        if not ancillary:
            return self._now()
        sec, nsec = _TIMESPEC.unpack_from(ancillary[0][2])
        kernel_ns: int = sec * 1_000_000_000 + nsec - self.offset_ns
        if bound_ns - 10_000_000_000 < kernel_ns < bound_ns:
            return kernel_ns
        now_ns = self._now()
        return kernel_ns if now_ns - 10_000_000_000 < kernel_ns < now_ns else now_ns

    def expire(self) -> None:
        """The reads of this loop iteration are done: read the clocks afresh next time."""
        self.now_ns = 0
