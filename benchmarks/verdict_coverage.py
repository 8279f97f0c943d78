"""The verdict's known answers: coverage of its one-sided bounds and how often it is wrong.

    python benchmarks/verdict_coverage.py [--runs 2000] [--level 0.95]

Prints, for each latency distribution × sample size × percentile, the stated level against
the observed coverage of the upper and lower bounds ("open": the sample is too small to
bound that side; the verdict is then INCONCLUSIVE, never MET), and the share of runs
whose verdict is wrong: MET for a target 1 % below the true percentile, MISSED for one 1 %
above; the point-estimate rule's wrong MET beside it. Then ITL's table: the
slow-request model (one request in five slow, all 30 of its gaps), its p90 judged by
bounds that count requests (what loadgen does) and by bounds that take the gaps as
independent. Simulated in memory: no server.
"""

from __future__ import annotations

import argparse

from loadgen.testing.coverage import itl_cell, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--level", type=float, default=0.95)
    args = parser.parse_args()
    cells = table(runs=args.runs, level=args.level)
    print(f"{args.runs} simulated runs per row; bounds one-sided at {args.level:.0%}; "
          f"a verdict may be wrong in at most {1 - args.level:.0%} of runs")  # fmt: skip
    header = (f"{'distribution':<12} {'n':>5} {'pct':>4}  {'upper covers':>12} "
              f"{'lower covers':>12}  {'MET wrong':>9} {'MISSED wrong':>12} "
              f"{'point MET wrong':>15}")  # fmt: skip
    print(header)
    for c in cells:
        upper = f"{c.upper_covers:.3f}" if c.upper_closed else "open"
        lower = f"{c.lower_covers:.3f}" if c.lower_closed else "open"
        print(f"{c.distribution:<12} {c.n:>5} p{c.p:<3g}  {upper:>12} {lower:>12}  "
              f"{c.met_wrong:>9.3f} {c.missed_wrong:>12.3f} "
              f"{c.point_met_wrong:>15.3f}")  # fmt: skip
    print(f"\nITL p90, {args.runs} runs of the slow-request model per row (30 gaps a request)")
    print(f"{'requests':>8} {'gaps':>6}  {'by requests: covers':>19} {'MET wrong':>9}  "
          f"{'as independent gaps: covers':>27} {'MET wrong':>9}")  # fmt: skip
    for n in (40, 100, 300):
        i = itl_cell(n, runs=args.runs, level=args.level, seed=n)
        print(f"{n:>8} {n * 30:>6}  {i.clustered_covers:>19.3f} {i.clustered_met_wrong:>9.3f}  "
              f"{i.pooled_covers:>27.3f} {i.pooled_met_wrong:>9.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
