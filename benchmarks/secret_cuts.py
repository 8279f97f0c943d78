"""A key echoed where loadgen's cut falls, at every offset: what survives in each artifact.

The server of `loadgen.testing.hostile.echo_cuts` echoes the Authorization header (and its base64)
into error bodies, error events, malformed payloads and status lines, placed so that
loadgen's cut of that text falls at every offset of it, or cuts it itself (`server-cut`);
its preflight answer is an error body cut 12 characters into the key. This script runs
`loadgen -vv run` as a subprocess twice (without the preflight: one request per cut; with
it: the preflight's error), then `loadgen report` and `loadgen compare --junit
--markdown`, and prints, per channel and echo, how many offsets left any 8 characters of
the key or its base64 in the record's error (and any 4 characters of the key, where
loadgen made the cut), and per artifact the windows found. Every figure must be 0.

Usage (from the repository root): python benchmarks/secret_cuts.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import polars as pl

from loadgen.testing import ScriptedServer
from loadgen.testing.hostile import CUT_KEY, CUTS, artifact_texts, echo_cuts, key_pieces, leaks

WORKLOAD = f"""
name: cuts
target: {{api: openai-chat, model: m, api_key_env: CUT_KEY}}
classes:
  chat:
    arrival: {{process: constant, rate_per_s: 400}}
    requests: {len(CUTS)}
    prompt_tokens: {{dist: fixed, value: 5}}
    output_tokens: {{dist: fixed, value: 3}}
    slo: {{ttft_ms: 2000, tpot_ms: 1000, percentile: 90}}
    deadlines: {{first_token_s: 5, stall_s: 5, total_s: 10}}
"""


def loadgen(*args: str, env: dict[str, str]) -> str:
    """`python -m loadgen ARGS`: its stdout and stderr."""
    done = subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    return done.stdout + done.stderr


def main() -> int:
    env = {**os.environ, "CUT_KEY": CUT_KEY}
    with tempfile.TemporaryDirectory() as work_dir, ScriptedServer(echo_cuts) as server:
        work = Path(work_dir)
        (work / "cuts.yaml").write_text(WORKLOAD)
        out = work / "out"
        common = ["-vv", "run", str(work / "cuts.yaml"), "--url", server.url, "--out", str(out),
                  "--lag-bound-ms", "1000"]  # fmt: skip
        terminal = [loadgen(*common, "--run-id", "cut", "--no-preflight", env=env),
                    loadgen(*common, "--run-id", "pre", env=env)]  # fmt: skip
        run_dir = out / "cut"
        terminal.append(loadgen("report", str(run_dir), "--out", str(out / "rep"), env=env))
        terminal.append(loadgen("compare", str(run_dir), str(run_dir), "--junit",
                                str(out / "junit.xml"), "--markdown", str(out / "cmp.md"),
                                env=env))  # fmt: skip
        errors = pl.read_parquet(run_dir / "records.parquet").sort("request_id")["error"]
        texts = artifact_texts(out)
    texts |= {f"terminal output of command {i}": t for i, t in enumerate(terminal)}
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for (channel, echo, _), error in zip(CUTS, errors, strict=True):
        row = rows[channel, echo]
        row[0] += 1
        row[1] += bool(leaks(error))
        row[2] += channel != "server-cut" and echo == "raw" and bool(key_pieces(error))
    print(f"{len(CUTS)} cuts, {len(errors)} records\n")
    print("channel | echo | offsets | with 8+ chars of the key or its base64 | with 4+ of the key")
    print("--- | --- | --- | --- | ---")
    for (channel, echo), (offsets, eight, four) in rows.items():
        four_text = "-" if channel == "server-cut" or echo != "raw" else str(four)
        print(f"{channel} | {echo} | 0–{offsets - 1} | {eight} | {four_text}")
    print("\nartifact | 8-character windows found")
    print("--- | ---")
    for name, text in texts.items():
        print(f"{name} | {len(leaks(text))}")
    preflight = next((line for line in terminal[1].splitlines() if line.startswith("error:")), "")
    print(f"\nthe preflight's error: {preflight}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
