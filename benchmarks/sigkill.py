"""SIGKILL at random moments: is every request finished > 1 s before the kill recovered?

Each run: `loadgen run` (Poisson 20 req/s, 400 requests, streams of 0.1-0.5 s) against a
scripted server in this process; SIGKILL at a random moment 0.5-15 s after the first
request; `loadgen report --recover`; count the requests the server finished more than
`--margin-s` before the kill and whether each is in the recovered records as ok, the
records against the plan (one per planned request: ok, cancelled, not_sent), and the
requests recovered as cancelled (sent) that never reached the server (should be none).

Usage: python benchmarks/sigkill.py --runs 20 --seed 1
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from loadgen.testing.crashtest import kill_and_recover


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--margin-s", type=float, default=1.0)
    parser.add_argument("--max-kill-s", type=float, default=15.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(f"{'run':>4} {'kill at (s)':>11} {'finished>1s':>11} {'recovered':>9} {'ok':>5} "
          f"{'cancelled':>9} {'not_sent':>8} {'exit':>4} missing  cancelled-unsent")  # fmt: skip
    totals = [0, 0, 0, 0]
    for run in range(args.runs):
        kill_after_s = rng.uniform(0.5, args.max_kill_s)
        with tempfile.TemporaryDirectory() as work:
            result = kill_and_recover(Path(work), kill_after_s, margin_s=args.margin_s)
        totals[0] += result.finished_before
        totals[1] += result.finished_before - len(result.missing)
        totals[2] += result.recovered
        totals[3] += result.planned
        missing = list(result.missing) or "-"
        print(f"{run:>4} {kill_after_s:>11.2f} {result.finished_before:>11} "
              f"{result.recovered:>9} {result.recovered_ok:>5} {result.cancelled:>9} "
              f"{result.not_sent:>8} {result.exit_code:>4} {missing}  "
              f"{list(result.false_cancelled) or '-'}")  # fmt: skip
    print(
        f"{args.runs} runs killed: {totals[0]} requests finished > {args.margin_s:g} s before "
        f"their kill, {totals[1]} of them recovered as ok ({totals[0] - totals[1]} missing); "
        f"{totals[2]} records recovered for {totals[3]} planned"
    )


if __name__ == "__main__":
    main()
