"""Capacity known answers on the built-in simulator: μ, the knee found, and every step's evidence.

With B batch slots, a flat decode step d, N output tokens per request and negligible
prefill, the simulator saturates at μ = B / (N·d) requests/s (× its speed). For each
configuration this runs `loadgen capacity` exactly as a user would (a subprocess, the
built-in simulator, a fresh output folder), then prints μ, the knee (highest passing load
in req/s), the capacity an over-saturated step served, and one line of evidence per step:
offered and completed req/s, lifetimes judged, the in-flight and TTFT rise against their
bounds, and the verdict's reason.

Configurations (`--config`, default all):

* constant — constant arrivals, B = 8, d = 25 ms, N = 20: μ = 16 req/s; p90 TTFT 5 s
  (loose). Known answer: knee in [0.85 μ, μ].
* poisson — Poisson arrivals, B = 16, d = 20 ms, N = 40: μ = 20 req/s; loose SLO. Known
  answer: knee <= μ.
* overload — constant, B = 8, d = 25 ms, N = 20 (μ = 16), p90 TTFT 1.5 s, and besides the
  search one step at 1.2 μ sized by request count only (the old rule: 100 judged
  requests, 10 % warm-up): judged by counts and SLOs alone it passes; the steady-state
  rule fails the same records.
* closed — `--param max_in_flight`, B = 4, d = 20 ms, N = 40, speed 4 (T_hold = 200 ms),
  TTFT SLO 25 ms: known answer: knee = B = 4, first failing cap 5.

Usage: python benchmarks/capacity_knee.py [--config constant,overload] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WORKLOAD = """\
name: knee-{name}
target: {{api: openai-chat, model: sim}}
classes:
  chat:
    arrival: {{process: {process}, rate_per_s: {rate}}}
    requests: 50
    prompt_tokens: {{dist: fixed, value: 16}}
    output_tokens: {{dist: fixed, value: {tokens}}}
    slo: {{ttft_ms: {ttft_ms}, percentile: 90}}
    deadlines: {{first_token_s: 60, stall_s: 30, total_s: 120}}
sim: {{speed: {speed}, max_batch: {batch}, decode_step_ms: {step_ms},
       prefill_tokens_per_s: 1000000000}}
"""

CONFIGS: dict[str, dict[str, Any]] = {
    "constant": {"process": "constant", "batch": 8, "step_ms": 25, "tokens": 20, "speed": 1,
                 "ttft_ms": 5000, "args": ["--steps", "0.6x,1.2x", "--resolution", "0.1"]},
    "poisson": {"process": "poisson", "batch": 16, "step_ms": 20, "tokens": 40, "speed": 1,
                "ttft_ms": 5000, "args": ["--steps", "0.6x,1.2x", "--resolution", "0.1"]},
    "overload": {"process": "constant", "batch": 8, "step_ms": 25, "tokens": 20, "speed": 1,
                 "ttft_ms": 1500, "args": ["--steps", "0.6x,1.2x", "--resolution", "0.1"]},
    "closed": {"process": "constant", "batch": 4, "step_ms": 20, "tokens": 40, "speed": 4,
               "ttft_ms": 25, "args": ["--param", "max_in_flight", "--steps", "2,4,8",
                                       "--min-tail", "5"]},
}  # fmt: skip


def mu_of(config: dict[str, Any]) -> float:
    """μ = B / (N·d) × speed, in req/s."""
    return float(config["batch"] / (config["tokens"] * config["step_ms"] / 1000) * config["speed"])


def run_search(name: str, config: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`loadgen capacity` on the workload (its rate is μ, so loads are shares of μ)."""
    workload = folder / f"{name}.yaml"
    rate = mu_of(config) if config["args"][:2] != ["--param", "max_in_flight"] else 1.0
    workload.write_text(WORKLOAD.format(name=name, rate=rate, **config), encoding="utf-8")
    out = folder / f"{name}-out"
    command = [sys.executable, "-m", "loadgen", "capacity", str(workload), "--out", str(out),
               "-q", *config["args"]]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    print(f"$ loadgen capacity {name}.yaml {' '.join(command[6:])}  → exit {done.returncode}")
    return json.loads((out / "capacity.json").read_text())  # type: ignore[no-any-return]


def evidence(step: dict[str, Any], scale: float | None) -> str:
    """One step as one line: load, rates, lifetimes, trends, verdict and reason."""
    steady = step["steady"] or {}
    trends = steady.get("trends", {})

    def trend(series: str, unit: str) -> str:
        t = trends.get(series)
        if not t:
            return "—"
        flag = " RISING" if t["rising"] else ""
        return f"{t['rise']:+.3g}{unit} (bound {t['allowance']:.2g}, floor {t['floor']:.2g}){flag}"

    load = f"cap {step['load']:g}" if scale is None else f"{step['load'] * scale:.3g} req/s"
    return (
        f"  {load:>10}  offered {steady.get('offered_per_s', 0):6.2f}"
        f"  completed {steady.get('completed_per_s', 0):6.2f}"
        f"  lifetimes {steady.get('lifetimes') or 0:5.1f}"
        f"  in flight {trend('in_flight', '')}  TTFT {trend('ttft_ms', ' ms')}"
        f"  {step['status'].upper()}: {step['note']}"
    )


def overload_step(config: dict[str, Any], folder: Path) -> None:
    """One count-only step at 1.2 μ (the old rule's length), judged by both rules."""
    from loadgen.analysis.capacity import audit_step
    from loadgen.results.runfolder import read_records
    from loadgen.run.execute import RunOptions, execute
    from loadgen.studies.capacity import step_spec
    from loadgen.workload.spec import loads

    spec = loads(WORKLOAD.format(name="overload-step", rate=mu_of(config), **config))
    at, _ = step_spec(spec, 1.2, param="rate", min_tail=10, warmup_s=None)  # counts only
    result = execute(at, RunOptions(out_dir=folder / "overload-step", quiet=True))
    frame = read_records(result.run_dir)
    for label, checks in (("counts and SLOs only (old rule)", False), ("steady state", True)):
        step = audit_step(frame, at, 1.2, min_tail=10, warmup_s=None, from_send=False,
                          client_failed=False, steady_checks=checks)  # fmt: skip
        ttft = step.classes["chat"].ttft_ms
        print(f"  1.2 μ, {frame.height} requests, {label}: {step.status.upper()} "
              f"(TTFT p90 {ttft} ms vs SLO {config['ttft_ms']} ms; {step.note})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=",".join(CONFIGS), help="comma-separated names")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for name in args.config.split(","):
        config = CONFIGS[name]
        mu = mu_of(config)
        closed = config["args"][:2] == ["--param", "max_in_flight"]
        print(f"\n== {name}: B = {config['batch']}, d = {config['step_ms']} ms, N = "
              f"{config['tokens']}, speed {config['speed']}: μ = {mu:g} req/s")  # fmt: skip
        knees = []
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.repeats):
                folder = Path(tempfile.mkdtemp(dir=tmp))
                data = run_search(name, config, folder)
                scale = None if closed else mu
                for step in data["steps"]:
                    print(evidence(step, scale))
                knee = data["highest_pass_req_s"]
                knees.append(knee if knee is not None else float("nan"))
                served = (data["capacity"] or float("nan")) * mu
                bracket = (
                    f"highest pass {data['highest_pass']:g}, first fail {data['first_fail']:g}"
                    if closed
                    else f"capacity served {served:.3g} req/s"
                )
                print(f"  knee {knee:.3g} req/s = {knee / mu:.3f} μ; {bracket}")
            if name == "overload":
                overload_step(config, Path(tmp))
        if len(knees) > 1:
            print(f"  knee median {statistics.median(knees):.3g} req/s "
                  f"({min(knees):.3g}–{max(knees):.3g}) over {len(knees)} repeats")  # fmt: skip


if __name__ == "__main__":
    main()
