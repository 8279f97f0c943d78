"""Where TTFT went, in words: the one sentence the terminal, the checks' JUnit/Markdown, the
report, `capacity` and `compare` say of a TTFT split (`analysis.split`).

`chat TTFT p90 1,150 ms went to queue 864 (75%), prefill 270 (23%), outside the engine 16
(1%) (600 of 600 ok requests split) → queueing: lower the admission limit or add replicas`.
Queue, prefill and outside the engine are always named; the client's send lag and the
server's intake only when they are not 0.
"""

from __future__ import annotations

from loadgen.results.summary import TTFT_PARTS, SplitPoint, TtftSplit

# Each part as people read it, and what it points to when it is the largest.
LABELS = {
    "send_lag_ms": "before send",
    "outside_ms": "outside the engine",
    "intake_ms": "server intake",
    "queue_ms": "queue",
    "prefill_ms": "prefill",
}
FIXES = {
    "send_lag_ms": "the client: it sent late (the generator, an in-flight cap, connecting)",
    "outside_ms": "the path: the network, proxies, the server's HTTP front end",
    "intake_ms": "the server's front end: template and tokenizing before its queue",
    "queue_ms": "queueing: lower the admission limit or add replicas",
    "prefill_ms": "prefill: prompt length, prefix caching, the prefill chunk budget",
}
# What a part that grew with the load points to (capacity's steps send the same prompts at
# a higher rate, so a longer prefill is other requests' prefill sharing its steps, not the
# prompt's length).
WITH_LOAD = {
    **FIXES,
    "outside_ms": "the path or the server's HTTP front end saturating with the load",
    "prefill_ms": "prefill contention: the same prompts took longer because other requests' "
    "prefill shared their steps (the prefill chunk budget, disaggregated prefill, or a "
    "lower admission limit)",
}
ALWAYS = ("queue_ms", "prefill_ms", "outside_ms")  # named even at 0
# The order parts are named (and stacked from the axis up): the server's first, queue leading.
SHOWN = ("queue_ms", "prefill_ms", "intake_ms", "outside_ms", "send_lag_ms")
assert set(LABELS) == set(FIXES) == set(WITH_LOAD) == set(SHOWN) == set(TTFT_PARTS)


def ms(value: float) -> str:
    """ms to the ms ("1,150", "16"), below 10 ms to a tenth ("2.3")."""
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:.1f}"


def parts_text(point: SplitPoint) -> str:
    """`queue 864 (75%), prefill 270 (23%), outside the engine 16 (1%)`: the parts in the
    order a request meets them, queue first; a share only where TTFT is positive."""
    shown = []
    for part in SHOWN:
        value = getattr(point, part)
        if part not in ALWAYS and round(value, 1) == 0:
            continue
        share = f" ({value / point.ttft_ms:.0%})" if point.ttft_ms > 0 else ""
        shown.append(f"{LABELS[part]} {ms(value)}{share}")
    return ", ".join(shown)


def point_label(point: SplitPoint) -> str:
    """`TTFT p90 1,150 ms`, or `TTFT over target (mean 1,480 ms)` for the breaching ones."""
    if point.percentile is None:
        return f"TTFT over target (mean {ms(point.ttft_ms)} ms, {point.requests:,} requests)"
    return f"TTFT p{point.percentile:g} {ms(point.ttft_ms)} ms"


def cause_text(point: SplitPoint) -> str:
    """What the largest part points to: `queueing: lower the admission limit or add replicas`."""
    return FIXES[point.cause]


def split_sentence(split: TtftSplit, point: SplitPoint) -> str:
    """`TTFT p90 1,150 ms went to …, … (600 of 600 ok requests split) → queueing: …`."""
    spans = f", {split.from_spans:,} by span" if split.from_spans else ""
    return (
        f"{point_label(point)} went to {parts_text(point)} ({split.requests:,} of "
        f"{split.ok:,} ok requests split{spans}) → {cause_text(point)}"
    )


def missed_point(split: TtftSplit) -> SplitPoint | None:
    """The point a missed TTFT check is explained by: at the target's percentile, else the
    breaching requests'."""
    return split.at_target or split.breaching


def moved_part(before: SplitPoint, after: SplitPoint) -> str:
    """The part whose ms changed most between two splits (by size; ties: `TTFT_PARTS` order)."""
    change = {p: getattr(after, p) - getattr(before, p) for p in TTFT_PARTS}
    return max(change, key=lambda p: abs(change[p]))


def moved_text(before: SplitPoint, after: SplitPoint) -> str:
    """`queue 120 → 3,109 ms (+2,989), prefill 250 → 956 (+706), outside the engine 5.0 →
    5.0 (+0.0)`: each part named in `parts_text`, then the one that moved most."""
    shown = []
    for part in SHOWN:
        old, new = getattr(before, part), getattr(after, part)
        if part not in ALWAYS and round(old, 1) == 0 and round(new, 1) == 0:
            continue
        delta = new - old
        shown.append(f"{LABELS[part]} {ms(old)} → {ms(new)} ({'+' if delta >= 0 else '−'}"
                     f"{ms(abs(delta))})")  # fmt: skip
    return ", ".join(shown) + f"; {LABELS[moved_part(before, after)]} moved most"
