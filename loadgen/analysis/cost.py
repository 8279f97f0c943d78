"""Cost from measured goodput: what the run's tokens cost at the fleet's price per hour.

Sits beside the audit (`analysis.audit`), which adds the summary's `cost` block when a
price is known (`run --price-per-hour P [--replicas R]`, kept in run.json's options, so
`loadgen report` and `merge` recompute it). Formulas, with the fleet's price
F = P × R per hour and the run's duration D (summary `duration_s`: first intended send →
last end):

    run_cost                       = F × D / 3600
    per_million_output_tokens      = run_cost / output_tokens × 1e6
    per_million_good_output_tokens = run_cost / good_output_tokens × 1e6

`output_tokens` are the ok requests' (the summary's `output_tokens.total`), the tokens a
user received; `good_output_tokens` those of requests meeting every per-request threshold
(goodput's). Classes share one fleet: each is charged the share of `run_cost` equal to its
share of the run's output tokens, so its cost per million output tokens is the run's, and
its cost per million *good* tokens is its share over its own good tokens: a class that
misses its SLO pays more per good token. A figure whose denominator is 0 is null.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from loadgen.analysis.slo import per_request
from loadgen.results.records import Outcome
from loadgen.results.summary import ClassCost, Cost
from loadgen.workload.spec import SloTargets


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """The fleet under test's price: per replica per hour, times the replicas."""

    per_hour: float
    replicas: int = 1

    @property
    def fleet_per_hour(self) -> float:
        return self.per_hour * self.replicas


def per_million(cost: float, tokens: int) -> float | None:
    """cost / tokens × 1e6, rounded to 6 decimals; None for no tokens."""
    return round(cost / tokens * 1e6, 6) if tokens > 0 else None


def run_cost(price: Price, *, duration_s: float, tokens: Mapping[str, tuple[int, int]]) -> Cost:
    """The cost block from the run's duration and each class's (output, good output) tokens."""
    total_cost = price.fleet_per_hour * duration_s / 3600
    output = sum(t for t, _ in tokens.values())
    good = sum(g for _, g in tokens.values())
    classes = {}
    for name, (class_tokens, class_good) in tokens.items():
        share = class_tokens / output if output else None
        cost = total_cost * share if share is not None else None
        classes[name] = ClassCost(
            output_tokens=class_tokens,
            good_output_tokens=class_good,
            cost_share=None if share is None else round(share, 6),
            cost=None if cost is None else round(cost, 6),
            per_million_output_tokens=None if cost is None else per_million(cost, class_tokens),
            per_million_good_output_tokens=None if cost is None else per_million(cost, class_good),
        )
    return Cost(
        price_per_hour=price.per_hour,
        replicas=price.replicas,
        fleet_per_hour=price.fleet_per_hour,
        duration_s=round(duration_s, 6),
        run_cost=round(total_cost, 6),
        output_tokens=output,
        good_output_tokens=good,
        per_million_output_tokens=per_million(total_cost, output),
        per_million_good_output_tokens=per_million(total_cost, good),
        classes=classes,
    )


def class_tokens(
    frame: pl.DataFrame, slos: Mapping[str, SloTargets], classes: list[str]
) -> dict[str, tuple[int, int]]:
    """Per class, the ok requests' output tokens and the good requests' (`meets_slo`)."""
    rows = per_request(frame, slos=slos)
    out = {}
    for name in classes:
        mine = rows.filter(pl.col("class") == name)
        ok = mine.filter(pl.col("outcome") == Outcome.OK.value)
        good = mine.filter(pl.col("meets_slo"))
        out[name] = (
            int(ok.get_column("output_tokens").sum()),
            int(good.get_column("output_tokens").sum()),
        )
    return out
