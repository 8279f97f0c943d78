"""The cost figures (`summary.cost`, `analysis.cost`) as people read them: a terminal line
and a report table. Amounts are in the currency `--price-per-hour` was given in."""

from __future__ import annotations

from loadgen.render.report.blocks import Table
from loadgen.results.summary import Cost


def money(value: float | None) -> str:
    """An amount with 4 significant digits (`0.02906`, `22.7`, `1,250`); `-` for none."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def fleet_text(cost: Cost) -> str:
    each = (
        f"{money(cost.price_per_hour)}/h × {cost.replicas} replicas = " if cost.replicas > 1 else ""
    )
    return f"{each}{money(cost.fleet_per_hour)}/h"


def cost_line(cost: Cost) -> str:
    """`cost: 22.7 per M output tokens · 25.1 per M good output tokens (0.02906 for 10.5 s at
    10/h)`."""
    return (
        f"cost: {money(cost.per_million_output_tokens)} per M output tokens · "
        f"{money(cost.per_million_good_output_tokens)} per M good output tokens "
        f"({money(cost.run_cost)} for {cost.duration_s:,.1f} s at {fleet_text(cost)})"
    )


def cost_table(cost: Cost) -> Table:
    """Per class and overall: tokens, good tokens, the share of the cost, cost per M."""
    rows = [
        (name, f"{c.output_tokens:,}", f"{c.good_output_tokens:,}",
         "-" if c.cost_share is None else f"{c.cost_share:.1%}", money(c.cost),
         money(c.per_million_output_tokens), money(c.per_million_good_output_tokens))
        for name, c in cost.classes.items()
    ]  # fmt: skip
    rows.append(
        ("all", f"{cost.output_tokens:,}", f"{cost.good_output_tokens:,}", "100%",
         money(cost.run_cost), money(cost.per_million_output_tokens),
         money(cost.per_million_good_output_tokens))
    )  # fmt: skip
    title = (
        f"Cost at {fleet_text(cost)} over {cost.duration_s:,.1f} s (classes share it by their "
        "output tokens; good = requests meeting every threshold)"
    )
    headers = ("class", "output tokens", "good tokens", "share", "cost", "per M tokens",
               "per M good tokens")  # fmt: skip
    return Table(title, headers, rows)
