"""The generator-health rule: could the client's own time have changed the run's verdict?

Part of the audit (`analysis.audit.audit` calls `judge_client` once the classes are judged).
Pure functions of the per-request rows (`slo.per_request`), the classes' audits and the
generator's figures (`metrics.generator_health`).

The physics. Every latency is measured from the request's *intended* send time, so:

1. The send lag is charged. A request the client started L late (dispatch − intended, each
   request its own, a later turn's reaction included) carries L in its TTFT and E2E: the
   client's delay counts against the server, never for it.
2. A busy client also stamps late. The event loop that wakes late for a send reads a
   chunk's bytes late the same way, so any timestamp may be late by up to E, taken as the
   run's send-lag p99 (the one figure the run prints for its client). A late stamp only
   lengthens TTFT and E2E; it moves a TPOT by up to ±E/(N − 1) and an ITL gap by ±E.

So every check is judged again, by the same rule and confidence, in two cases:

- the server's best case: each request's own lag and E taken out of its TTFT and E2E,
  E/(N − 1) out of its TPOT and E out of every ITL gap (never below 0);
- its worst case: TTFT and E2E as measured (late stamps never shorten them), E/(N − 1)
  added to every TPOT and E to every ITL gap.

When the run's verdict is the same in both, the client's time could not have changed it:
a MET that holds with the lag charged is conservative, and the run stands however late its
sends were. When it is not (a MISSED whose margin is within the lag its requests carry, a
TPOT MET within the stamp error), the figures cannot tell the server's part from the
client's: the run *fell behind* (exit 3), and `ClientEffect.moved` names the checks.

3. The load was offered. A client that cannot keep up sends slower than scheduled, so its
   lag grows over the run: the least-squares trend of the send lag on the intended time
   gives the achieved rate, scheduled / (1 + trend) (`metrics.generator_health`). A
   shortfall beyond RATE_TOLERANCE, at the trend's one-sided 99.9 % lower bound (a few
   late stragglers of a short run do not make a trend), offered the server less than was
   asked, which can hide a miss: such a run stands only when it MISSED in both cases
   anyway (a lighter load already missed).
4. Requests that failed in the client itself (`client_error`), and a send-lag p99 above
   `--lag-bound-ms` when one is given, make the run fall behind whatever its verdict.

Objectives judged whole (a summarization batch's deadline, an agent class's trajectory
share) keep their verdict as measured in both cases. Streams that arrived coalesced
(`analysis.delivery`) have a TPOT and ITL that are unknown whatever the client's stamps
were: in both cases they stay unknown, as the class's checks judged them, and only the
paced streams' values move.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import polars as pl

from loadgen.analysis import metrics
from loadgen.analysis.confidence import MISSED, worst
from loadgen.analysis.delivery import Unpaced, unpaced
from loadgen.analysis.slo import slo_audit
from loadgen.measures import GAP, ITL, SLO_MEASURES, TOKEN, TPOT, Measure, label_of
from loadgen.results.records import Outcome
from loadgen.results.summary import Check, ClassAudit, ClientEffect, GeneratorHealth

RATE_TOLERANCE = 0.03  # sends (and, in capacity, completions) within 3 % of the rate asked
NO_GAPS = pl.Series(ITL.column, [], dtype=pl.Float64)


def judge_client(
    generator: GeneratorHealth,
    rows: pl.DataFrame,
    frame: pl.DataFrame,
    classes: Mapping[str, ClassAudit],
    *,
    rule: str,
    path_buffers: bool = False,
) -> GeneratorHealth:
    """The generator's health with the rule applied (see the module): its `client` effect,
    `fell_behind` and the one sentence saying why (`reason`, None when the run stands).

    `rows` are `slo.per_request`'s rows of `frame`, `classes` the classes as audited (with
    `path_buffers` as the audit took it: coalesced streams judged as observed)."""
    error_ms = generator.lag_ms.p99 or 0.0
    measured, best, worst_case, moved = {}, {}, {}, []
    for name, block in classes.items():
        measured[name] = block.slo.judged or MISSED
        if block.slo.judged_by is not None or not block.slo.checks:
            best[name] = worst_case[name] = measured[name]
            continue
        mine = rows.filter(pl.col("class") == name)
        has_gaps = ITL.column in block.slo.targets.thresholds_ms()
        gaps = metrics.itl_gaps_ms(frame, name) if has_gaps else NO_GAPS
        unknown = None
        if not path_buffers and bool(mine.get_column("coalesced").any()):
            unknown = unpaced(mine, frame.filter(pl.col("class") == name))
        cases = [rejudged(mine, gaps, block, error_ms, rule=rule, best=b, unknown=unknown)
                 for b in (True, False)]  # fmt: skip
        best[name], worst_case[name] = (worst([c.judged for c in case]) for case in cases)
        moved += [
            moved_text(name, check, *(case[i] for case in cases))
            for i, check in enumerate(block.slo.checks)
            if any(case[i].judged != check.judged for case in cases)
        ]
    effect = ClientEffect(
        stamp_error_ms=round(error_ms, 3),
        as_measured=worst(list(measured.values())),
        client_out=worst(list(best.values())),
        stamps_worst=worst(list(worst_case.values())),
        moved=tuple(moved),
    )
    reason = client_reason(generator, effect)
    return replace(generator, client=effect, fell_behind=reason is not None, reason=reason)


def rejudged(
    rows: pl.DataFrame, gaps_ms: pl.Series, block: ClassAudit, error_ms: float, *, rule: str,
    best: bool, unknown: Unpaced | None = None,
) -> tuple[Check, ...]:  # fmt: skip
    """A class's checks judged again with the client's time at its largest against the
    server taken out (`best`), or with the stamps at their worst for it (see the module).
    `unknown`: the class's coalesced streams as its checks judged them (unknown TPOT and
    ITL); the paced streams' values move, the unknown ones stay unknown."""
    ok = rows.filter(pl.col("outcome") == Outcome.OK.value)
    sign = -1.0 if best else 1.0
    per_request = [m for m in SLO_MEASURES if m.per != GAP]
    shifted = ok.select(
        *(_moved(m, error_ms, best=best).alias(m.column) for m in per_request),
        pl.col(ITL.per_request),
        pl.col("coalesced"),
    )
    ok_ms = {m.column: shifted.get_column(m.column).drop_nulls().sort() for m in per_request}
    ok_ms[ITL.column] = (gaps_ms + sign * error_ms).clip(lower_bound=0.0).sort()
    if unknown is not None:
        paced = shifted.filter(~pl.col("coalesced")).get_column(TPOT.column).drop_nulls().sort()
        gaps = (unknown.itl_ms + sign * error_ms).clip(lower_bound=0.0).sort()
        unknown = replace(unknown, tpot_ms=paced, itl_ms=gaps)
    audit = slo_audit(
        ok_ms, requests=rows.height, failures=rows.height - ok.height, meeting=0,
        targets=block.slo.targets, streamed=shifted.get_column(ITL.per_request).drop_nulls().len(),
        rule=rule, unpaced=unknown,
    )  # fmt: skip
    return audit.checks


def _moved(measure: Measure, error_ms: float, *, best: bool) -> pl.Expr:
    """A per-request measure with the client's time taken out (`best`) or its stamps at
    their worst (see the module): a time from the intended send (not a stamp) loses the
    request's own lag and the stamp error E at best and is as measured at worst (a late
    stamp only lengthens it); a time per token moves by ±E/(N − 1); one between two stamps
    by ±E."""
    value, sign = pl.col(measure.column), -1.0 if best else 1.0
    if measure.per == TOKEN:
        return (value + sign * error_ms / (pl.col("output_tokens") - 1)).clip(lower_bound=0.0)
    if measure.start != "intended_ns":
        return (value + sign * error_ms).clip(lower_bound=0.0)
    if not best:
        return value
    return (value - pl.col("lag_ms").fill_null(0.0) - error_ms).clip(lower_bound=0.0)


def moved_text(name: str, measured: Check, best: Check, worst_case: Check) -> str:
    """`chat TTFT p90: MISSED as measured (95% bounds 1,012–1,090 ms, target ≤ 1,000 ms),
    INCONCLUSIVE with the client's time taken out`: one check the client could move."""
    label = f"{name} {label_of(measured.metric)} p{measured.percentile or 0:g}"
    bounds = ""
    if measured.low_ms is not None and measured.high_ms is not None:
        level = f"{measured.confidence:.0%} " if measured.confidence is not None else ""
        bounds = f"{level}bounds {measured.low_ms:,.4g}–{measured.high_ms:,.4g} ms, "
    target = f"target ≤ {measured.target_ms:,.4g} ms" if measured.target_ms is not None else ""
    cases = []
    if best.judged != measured.judged:
        cases.append(f"{best.judged.upper()} with the client's time taken out")
    if worst_case.judged != measured.judged:
        cases.append(f"{worst_case.judged.upper()} with its stamps at their worst")
    return (f"{label}: {measured.judged.upper()} as measured ({bounds}{target}), "
            + " and ".join(cases))  # fmt: skip


def client_reason(generator: GeneratorHealth, effect: ClientEffect) -> str | None:
    """Why the run's figures are the client's, not the server's (None: the run stands)."""
    if generator.client_errors:
        return (f"{generator.client_errors:,} requests failed in the client itself (out of "
                "file descriptors or local ports, or a worker process died: see the records' "
                "error)")  # fmt: skip
    bound, p99 = generator.lag_bound_ms, generator.lag_ms.p99
    if bound is not None and p99 is not None and p99 > bound:
        return f"the send lag p99 {p99:,.3g} ms is above --lag-bound-ms {bound:g}"
    if effect.client_out != effect.as_measured or effect.stamps_worst != effect.as_measured:
        return (f"the client's own time could have changed the verdict (send lag p99 "
                f"{effect.stamp_error_ms:,.3g} ms, charged to each request and taken as how "
                f"late any stamp may be): {'; '.join(effect.moved)}")  # fmt: skip
    if short_of_rate(generator) and effect.as_measured != MISSED:
        return (f"the client sent {generator.rate_shortfall:.1%} slower than scheduled (at "
                f"least {generator.rate_shortfall_low:.1%}, more than {RATE_TOLERANCE:.0%}: its "
                "send lag grew over the run), so the server was offered less load than asked, "
                "and that could hide a miss")  # fmt: skip
    return None


def short_of_rate(generator: GeneratorHealth) -> bool:
    """The sends kept less than the scheduled rate less RATE_TOLERANCE, beyond the noise of
    the lag's trend (its one-sided lower bound, `metrics.lag_trend`)."""
    low = generator.rate_shortfall_low
    return low is not None and low > RATE_TOLERANCE


def health_text(generator: GeneratorHealth) -> str:
    """The rule's outcome in one sentence: the same on the terminal, in the report, JUnit
    and Markdown. The run's figure is its send-lag p99 (charged, and taken as the stamp
    error) and the rate its sends kept."""
    if generator.fell_behind:
        return generator.reason or (
            "more than 1 % of sends later than the lag bound (a run judged by the rule before "
            "the generator-health rule; `loadgen report` judges it again)"
        )
    if generator.client is None:
        return "not judged (the run stopped before its end, or was judged before this rule)"
    rate = generator.rate_shortfall
    kept = "" if rate is None else f"; its sends kept the schedule's rate ({rate_text(rate)})"
    return (f"the client's own time could not change the verdict: send lag p99 "
            f"{generator.client.stamp_error_ms:,.3g} ms, charged to TTFT and E2E and taken as "
            f"the stamp error{kept}")  # fmt: skip


def rate_text(shortfall: float) -> str:
    """`0.4% short, within 3%`, `0.2% ahead`, or `on it` (within 0.05 %)."""
    if abs(shortfall) < 0.0005:
        return "on it"
    if shortfall < 0:
        return f"{-shortfall:.1%} ahead"
    return f"{shortfall:.1%} short, within {RATE_TOLERANCE:.0%}"
