"""`loadgen calibrate` for people: a line per level as it lands, the levels table and the
envelope in one sentence.

Reads the result `studies.calibrate.calibrate` returns (the dict it saves); the errors
shown are the calibration's p50/p99/max of the chunk timestamp error, TTFT error and send
lag, as `studies.calibrate` computes them.
"""

from __future__ import annotations

import math
from pathlib import Path

from rich import box
from rich.table import Table
from rich.text import Text

from loadgen.analysis.calibration import Ladder, Level
from loadgen.render.terminal import fmt_num

CONTENDED_STALL_MS = 500.0  # host CPU-pressure stall during a level above which we say so


def start_line(ladder: Ladder) -> str:
    """What the calibration is about to do: the streams' rate and length, the processes."""
    kind = " (--quick: a smoke check)" if ladder.quick else ""
    return (
        f"calibrating{kind}: {ladder.tokens_per_s:g} tokens/s per stream, "
        f"{ladder.stream_s:g} s streams, {ladder.processes} engine process(es)"
    )


def level_line(level: Level) -> str:
    """One level as it lands: its streams, met or which thresholds it missed."""
    verdict = "met" if level.met else "missed: " + ", ".join(level.misses)
    return f"{level.streams:>6} streams: {verdict}"


def _ms(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else fmt_num(value, 2)


def _stall(value: object) -> str:
    return f"{value:,.0f}" if isinstance(value, float) and math.isfinite(value) else "–"


def levels_table(result: dict[str, object]) -> Table:
    """One row per level: load, the three judged figures (red when over), CPU, contention."""
    thresholds = result["thresholds"]
    assert isinstance(thresholds, dict)
    table = Table(
        box=box.SIMPLE_HEAD,
        title="loadgen calibrate",
        caption_justify="left",
        caption="ts = chunk timestamp error, TTFT = TTFT error, lag = send lag (ms); "
        "CPU = client CPU per chunk; stall = time tasks waited for a CPU (host CPU "
        "pressure) during the level; load = 1-min load average",
    )
    for name in ("streams", "chunks/s", "ts p50", "ts p99", "ts max", "TTFT p99", "lag p99",
                 "CPU µs", "failed", "stall ms", "load", "verdict"):  # fmt: skip
        table.add_column(name, justify="left" if name == "verdict" else "right")
    judged = {
        "timestamp_err_p99_ms": thresholds["timestamp_p99_ms"],
        "ttft_err_p99_ms": thresholds["ttft_p99_ms"],
        "send_lag_p99_ms": thresholds["send_lag_p99_ms"],
    }
    levels = result["levels"]
    assert isinstance(levels, list)
    for level in levels:

        def cell(key: str, level: dict[str, object] = level) -> Text:
            value = level[key]
            over = key in judged and not (isinstance(value, float) and value <= judged[key])
            return Text(_ms(value if isinstance(value, float) else None),
                        style="red" if over else "")  # fmt: skip

        table.add_row(
            f"{level['streams']:,}",
            f"{level['chunks_per_s']:,.0f}",
            cell("timestamp_err_p50_ms"),
            cell("timestamp_err_p99_ms"),
            cell("timestamp_err_max_ms"),
            cell("ttft_err_p99_ms"),
            cell("send_lag_p99_ms"),
            f"{level['cpu_us_per_chunk']:.1f}",
            str(level["failed"]),
            _stall(level["cpu_stall_ms"]),
            f"{level['load_avg_1m']:.2f}",
            Text("met", style="green")
            if level["met"]
            else Text(
                "missed: " + ", ".join(level["misses"]),
                style="red",
            ),
        )
    return table


def conclusion(result: dict[str, object], saved: Path | None) -> list[str]:
    """The envelope in one sentence, and where it was saved."""
    envelope, total = result["envelope"], result["envelope_total"]
    processes = result["processes"]
    if not isinstance(envelope, dict) or not isinstance(total, dict):
        lines = ["envelope: no level met the thresholds on this machine"]
    else:
        lines = [
            f"envelope: {total['streams']:,} streams, {total['chunks_per_s']:,.0f} chunks/s "
            f"with {processes} engine process(es) "
            f"({envelope['streams']:,} streams, {envelope['chunks_per_s']:,.0f} chunks/s each)"
        ]
    levels = result["levels"]
    stalls = (
        [lv["cpu_stall_ms"] for lv in levels if isinstance(lv, dict)]
        if isinstance(levels, list)
        else []
    )
    worst = max((v for v in stalls if isinstance(v, float) and math.isfinite(v)), default=0.0)
    if worst > CONTENDED_STALL_MS:
        lines.append(
            f"note: the CPUs were contended (tasks, this calibration's own simulator and "
            f"engines among them, waited for a CPU up to {worst:,.0f} ms during a level); "
            "the load average column shows how much of that was other work"
        )
    if saved is not None:
        kind = " (a --quick smoke check: loadgen run will use it)" if result.get("quick") else ""
        lines.append(f"saved for host {result['host']} to {saved}{kind}")
    elif result.get("quick"):
        lines.append("not saved: --quick is a smoke check (give --save to keep it anyway)")
    return lines
