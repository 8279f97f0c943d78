"""The conversion factors between units, each defined once: time is integer nanoseconds on
one monotonic clock (`_ns`), shown in ms and s; sizes are bytes.

Like `errors`, a module every package may use: it imports nothing. The simulator keeps its
own copy (`sim.engine`), as it imports nothing of the client it checks.
"""

from __future__ import annotations

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000
MIB = 1024 * 1024  # bytes
