"""The engine's clock seam: the real clock is the C functions, kernel stamps move onto the
monotonic clock exactly, and the virtual clock the engine tests run on neither drifts nor
waits."""

from __future__ import annotations

import struct
import time

import anyio

from loadgen.engine.clock import SYSTEM_CLOCK, ReadClock, clock_offset_ns
from loadgen.testing.virtual import WALL_START_NS, VirtualClock, VirtualLoop

MS = 1_000_000


def kernel_stamp(wall_ns: int) -> list[tuple[int, int, bytes]]:
    """recvmsg's ancillary data for a receive at `wall_ns` (SCM_TIMESTAMPNS)."""
    return [(1, 35, struct.pack("@qq", *divmod(wall_ns, 1_000_000_000)))]


def test_the_system_clock_is_perf_counter_ns_and_time_ns_themselves() -> None:
    """Binding the real clock's methods gives the C functions: the seam costs nothing."""
    assert SYSTEM_CLOCK.now_ns is time.perf_counter_ns
    assert SYSTEM_CLOCK.wall_ns is time.time_ns


def test_a_kernel_stamp_moves_onto_the_monotonic_clock_exactly() -> None:
    """A segment received 5 ms before the read is stamped 5 ms before it, to the ns; one
    stamped after the read (a stepped wall clock) is stamped at the read instead."""
    clock = VirtualClock()
    assert clock_offset_ns(clock) == WALL_START_NS
    reads = ReadClock(clock)
    clock.ns += 40 * MS
    assert reads.stamp(kernel_stamp(clock.wall_ns() - 5 * MS)) == clock.ns - 5 * MS
    assert reads.stamp(kernel_stamp(clock.wall_ns() + 5 * MS)) == clock.ns
    assert reads.stamp([]) == clock.ns  # no kernel stamp: the time of the read


def test_the_virtual_loop_wakes_every_sleep_at_its_time_without_drift() -> None:
    """A thousand 1 ms sleeps and one of 123,456,789 ns end exactly 1.123456789 s later,
    with no real waiting (the loop jumps its clock to each timer)."""
    clock = VirtualClock()
    woke: list[int] = []

    async def sleeper() -> None:
        for _ in range(1000):
            await anyio.sleep(0.001)
        await anyio.sleep(0.123456789)
        woke.append(clock.now_ns())

    start = clock.now_ns()
    anyio.run(
        sleeper, backend="asyncio", backend_options={"loop_factory": lambda: VirtualLoop(clock)}
    )
    assert woke == [start + 1_123_456_789]
