"""What `loadgen calibrate` drives and what it measures: the ladder, the thresholds, a level.

Plain values, so `loadgen.render.calibrate_view` draws them without the engine that
`loadgen.studies.calibrate` drives to measure them (see there for the envelope).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Thresholds:
    """What a level must meet to count as measured truthfully (ms, at p99)."""

    timestamp_p99_ms: float = 5.0  # client chunk arrival − server write time
    ttft_p99_ms: float = 2.0  # client first-token time − server write time of chunk 0
    send_lag_p99_ms: float = 5.0  # dispatched − intended


@dataclass(frozen=True, slots=True, kw_only=True)
class Ladder:
    """The levels calibrate drives: total streams at one token rate per stream."""

    streams: tuple[int, ...] = (64, 128, 256, 512, 1024)
    tokens_per_s: float = 50.0  # per stream; the simulator's flat decode step is 1/this
    stream_s: float = 4.0  # each stream's token phase: tokens = tokens_per_s × stream_s
    ramp_s: float = 1.0  # sends spread evenly over this
    processes: int = 1  # engine processes, each with 1/N of the streams
    all_levels: bool = False  # else stop after the first level that misses
    quick: bool = False  # `--quick`: a smoke check, not this host's envelope unless saved

    @property
    def tokens(self) -> int:
        """Output tokens per stream."""
        return max(1, round(self.tokens_per_s * self.stream_s))


QUICK_LADDER = Ladder(streams=(8, 16), stream_s=1.0, ramp_s=0.2, quick=True)  # smoke checks


@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """One measured level: its load (totals over all processes) and every figure."""

    streams: int
    tokens_per_s: float
    processes: int
    chunks_per_s: float  # planned: streams × tokens_per_s
    chunks: int  # received
    expected_chunks: int
    failed: int
    cpu_us_per_chunk: float  # client CPU (user + system, every engine process) / chunks
    timestamp_err_p50_ms: float
    timestamp_err_p99_ms: float
    timestamp_err_max_ms: float
    ttft_err_p99_ms: float
    send_lag_p99_ms: float
    steal_ms: float  # host vCPU steal during the level (NaN where unknown)
    cpu_stall_ms: float  # host CPU pressure: time some task waited for a CPU (NaN: unknown)
    load_avg_1m: float  # the host's load average at the end of the level
    misses: tuple[str, ...]  # the thresholds (or checks) this level missed

    @property
    def met(self) -> bool:
        """True when every threshold held and nothing failed."""
        return not self.misses
