"""Reproduce the serving seed's numbers end to end: `loadgen run` against `loadgen sim`.

For each scenario this writes a small workload YAML (a `sim:` section with the seed's
physics, and classes whose arrivals make the scenario happen) into a temp folder, runs
`loadgen run WORKLOAD --out TMP` as a subprocess (the real CLI, which starts the embedded
simulator), reads the run's `summary.json` and `records.parquet`, and prints one table:
quantity, expected (the seed's arithmetic), measured, measured / expected.

Seed parameters: prefill 8,000 tok/s; decode step 20/30/55 ms at batch 16/32/64; typical
prompt 2,000 tokens, long 4,000; 300 output tokens; chunk C = (50 - 30) ms x 8,000 tok/s
= 160 tokens.

Scenarios:

* unqueued: one 2,000-token request alone, decode flat 30 ms: TTFT = 2000/8000 = 250 ms,
  TPOT = 30 ms, E2E = 250 + 299 x 30 = 9,220 ms.
* stall: 32 victims arrive together (constant arrivals at 10,000 req/s) and decode; 1 s
  later (`start_s`) one 4,000-token prompt is admitted (max batch 64, so it never queues).
  Unchunked, its prefill runs as one step: 30 + 500 = 530 ms, the victims' max ITL.
* chunked: the same with `chunk_tokens: 160`: every step is <= 30 + 20 = 50 ms (the
  victims' max ITL) and the long prompt needs 25 such steps: TTFT ≈ 1,250 ms (plus up to
  one 30 ms step in progress when it arrives). A max is one sample: a 10-20 ms pause of
  either process on a busy machine shows up in it, so the ITL p99 is printed too.
* batch B = 16, 32, 64: B requests arrive together and decode as one batch: TPOT = 20, 30,
  55 ms.

With --speed X the simulator runs X times faster (every duration / X) and the workload's
rates and offsets are scaled to match; measured times are multiplied back by X, so the
table is always in seed milliseconds. At X = 1 the whole script takes about 1.5 minutes.

Usage: python benchmarks/seed_numbers.py [--speed 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from loadgen.analysis.metrics import derive

BURST_RATE_PER_S = 10_000.0  # "arrive together": 32 requests within 3.2 ms (seed time)
LONG_START_S = 1.0  # the long prompt arrives when the victims are well into decoding
SHORT_PROMPT_TOKENS = 16
OUTPUT_TOKENS = 300


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: a seed number and what the run measured, in seed ms."""

    quantity: str
    expected: str
    expected_ms: float
    measured_ms: float


@dataclass(frozen=True, slots=True)
class RunOutput:
    """What one `loadgen run` left: the summary and the per-request measures."""

    summary: dict[str, Any]
    measures: pl.DataFrame  # `metrics.derive` of records.parquet: one row per request


def klass(
    count: int, prompt_tokens: int, *, rate_per_s: float, start_s: float = 0.0
) -> dict[str, Any]:
    """A workload class of `count` constant-rate arrivals with fixed sizes."""
    arrival: dict[str, Any] = {"process": "constant", "rate_per_s": rate_per_s}
    if start_s:
        arrival["start_s"] = start_s
    return {
        "arrival": arrival,
        "requests": count,
        "prompt_tokens": {"dist": "fixed", "value": prompt_tokens},
        "output_tokens": {"dist": "fixed", "value": OUTPUT_TOKENS},
    }


def run_workload(
    name: str, sim: dict[str, Any], classes: dict[str, Any], work_dir: Path
) -> RunOutput:
    """Write the workload, run `loadgen run` on it, and read its results."""
    workload = work_dir / f"{name}.yaml"
    workload.write_text(yaml.safe_dump({"name": name, "sim": sim, "classes": classes}))
    # --no-preflight: the seed's numbers assume an idle server at t0, and the preflight's
    # request would still hold a batch slot for a step or two when the run begins.
    command = [
        sys.executable,
        "-c",
        "from loadgen.cli import main; main()",
        "run",
        str(workload),
        "--out",
        str(work_dir / "runs"),
        "--run-id",
        name,
        "--no-preflight",
        "--quiet",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 2, 3):  # 2 = an SLO missed, 3 = fell behind: still results
        raise SystemExit(f"loadgen run {name} failed ({done.returncode}):\n{done.stderr}")
    run_dir = work_dir / "runs" / name
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary["generator"]["fell_behind"]:
        print(
            f"warning: {name}: the generator fell behind; its numbers are suspect", file=sys.stderr
        )
    measures = derive(pl.read_parquet(run_dir / "records.parquet"))
    not_ok = measures.filter(pl.col("outcome") != "ok").height
    if not_ok:
        print(f"warning: {name}: {not_ok} requests were not ok", file=sys.stderr)
    return RunOutput(summary=summary, measures=measures)


def stat(out: RunOutput, class_name: str, metric: str, key: str = "p50") -> float:
    """One statistic of one class from the summary, in real ms."""
    return float(out.summary["classes"][class_name][metric][key])


def max_itl(out: RunOutput, class_name: str, aggregate: Callable[[pl.Series], Any]) -> float:
    """An aggregate over the class's requests of each request's largest ITL, in real ms."""
    per_request = out.measures.filter(pl.col("class") == class_name).get_column("max_itl_ms")
    return float(aggregate(per_request))


def unqueued(speed: float, work_dir: Path) -> list[Row]:
    """One typical request alone: TTFT, TPOT and the 9,220 ms E2E."""
    sim = {"speed": speed, "decode_step_ms": 30}
    out = run_workload("unqueued", sim, {"one": klass(1, 2000, rate_per_s=1.0)}, work_dir)
    return [
        Row("unqueued TTFT (2,000-token prompt)", "250", 250, speed * stat(out, "one", "ttft_ms")),
        Row("unqueued TPOT (decode flat 30 ms)", "30", 30, speed * stat(out, "one", "tpot_ms")),
        Row("unqueued E2E = 250 + 299 x 30", "9,220", 9220, speed * stat(out, "one", "e2e_ms")),
    ]


def interference(speed: float, work_dir: Path, chunk_tokens: int) -> RunOutput:
    """32 victims decoding, then one 4,000-token prompt at LONG_START_S."""
    sim = {"speed": speed, "max_batch": 64, "chunk_tokens": chunk_tokens}
    classes = {
        "victims": klass(32, SHORT_PROMPT_TOKENS, rate_per_s=BURST_RATE_PER_S * speed),
        "long": klass(1, 4000, rate_per_s=1.0, start_s=LONG_START_S / speed),
    }
    name = f"stall-chunk{chunk_tokens}" if chunk_tokens else "stall-unchunked"
    return run_workload(name, sim, classes, work_dir)


def stall(speed: float, work_dir: Path) -> list[Row]:
    """The 530 ms stall unchunked; ≤ 50 ms ITL and ≈ 1,250 ms TTFT with 160-token chunks."""
    whole = interference(speed, work_dir, 0)
    chunked = interference(speed, work_dir, 160)
    return [
        Row(
            "stall: victims' max ITL, unchunked",
            "530",
            530,
            speed * max_itl(whole, "victims", pl.Series.max),
        ),
        Row(
            "stall: least-hit victim's max ITL (all stall)",
            "530",
            530,
            speed * max_itl(whole, "victims", pl.Series.min),
        ),
        Row(
            "stall: long prompt TTFT, unchunked",
            "530 (+<=30)",
            530,
            speed * stat(whole, "long", "ttft_ms"),
        ),
        Row(
            "chunk 160: victims' max ITL",
            "<= 50",
            50,
            speed * max_itl(chunked, "victims", pl.Series.max),
        ),
        Row(
            "chunk 160: victims' ITL p99 (jitter-robust)",
            "<= 50",
            50,
            speed * stat(chunked, "victims", "itl_ms", "p99"),
        ),
        Row(
            "chunk 160: long prompt TTFT = 25 x 50",
            "1,250 (+<=30)",
            1250,
            speed * stat(chunked, "long", "ttft_ms"),
        ),
    ]


def tpot_by_batch(speed: float, work_dir: Path) -> list[Row]:
    """TPOT at decode batch 16, 32 and 64 (one run each, the requests arriving together)."""
    rows = []
    for batch, step_ms in ((16, 20.0), (32, 30.0), (64, 55.0)):
        sim = {"speed": speed, "max_batch": 64}
        name = f"tpot-b{batch}"
        classes = {name: klass(batch, SHORT_PROMPT_TOKENS, rate_per_s=BURST_RATE_PER_S * speed)}
        out = run_workload(name, sim, classes, work_dir)
        measured = speed * stat(out, name, "tpot_ms")
        rows.append(Row(f"TPOT at batch {batch}", f"{step_ms:g}", step_ms, measured))
    return rows


def render(rows: list[Row]) -> str:
    """The table, in seed milliseconds."""
    header = f"{'quantity':<48} {'expected ms':>14} {'measured ms':>12} {'ratio':>6}"
    lines = [header, "-" * len(header)]
    for row in rows:
        ratio = row.measured_ms / row.expected_ms
        lines.append(
            f"{row.quantity:<48} {row.expected:>14} {row.measured_ms:>12,.1f} {ratio:>6.3f}"
        )
    return "\n".join(lines)


def main() -> None:
    """Run every scenario and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=1.0, help="simulator speed factor")
    parser.add_argument("--keep", type=Path, help="keep workloads and run folders here")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="seed-numbers-") as tmp:
        work_dir = args.keep or Path(tmp)
        work_dir.mkdir(parents=True, exist_ok=True)
        rows = [
            *unqueued(args.speed, work_dir),
            *stall(args.speed, work_dir),
            *tpot_by_batch(args.speed, work_dir),
        ]
    print(f"seed numbers via `loadgen run` against `loadgen sim` at speed {args.speed:g}")
    print(render(rows))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
