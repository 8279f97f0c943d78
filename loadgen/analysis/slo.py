"""SLO audit: per-class targets, attainment, goodput and the run's verdict.

Sits after `analysis.metrics` and before the reports: `audit_class` turns one class's records
into its block of the run's summary (`analysis.audit.audit` assembles the whole), `verdict`
judges the run, and `per_request` is the one place where a request is judged against its
class's thresholds. Pure functions; no I/O.

Breach accounting (every non-ok outcome is a miss of every SLO of its class):

- meets_slo (per request): outcome ok, and each set threshold holds where the measure
  exists: TTFT <= ttft_ms; TPOT <= tpot_ms when N > 1; every ITL gap <= itl_ms;
  E2E <= e2e_ms.
- attainment: requests that meet_slo / ALL recorded requests of the class (failures stay
  in the denominator). Null for a class with no requests.
- the checks (per class, one per target): the p-th percentile with failures ranked worst
  (+inf): TTFT and E2E over every request; TPOT over ok requests with N > 1 plus every
  failure; ITL over the gaps of ok requests (below). Each check has its point estimate
  (nearest rank) and one-sided order-statistic bounds at the class's `slo.confidence`
  (`analysis.confidence`), and a verdict by the run's rule: `interval` (the default) says
  MET when the upper bound meets the target, MISSED when the lower bound misses it, and
  INCONCLUSIVE otherwise (the target lies between the bounds, or the sample is too small
  for an upper bound: `needed` says how many requests would give one); `point` (today's
  rule before confidence) says MET when the point estimate meets the target, else MISSED.
- ITL is over individual gaps, and the gaps of one request are correlated (one slow
  request, or one long prefill beside it, makes many slow gaps), so the gaps are not that
  many independent values. Its bounds count requests, not gaps (`judge_clustered`): the
  order-statistic ranks for n = the requests that streamed gaps plus the failures, placed
  at the same share of the pooled sorted gaps, each failed request ranked as one
  request's worth of worst gaps. Exact when a request's gaps are equal, conservative when
  they are independent (the price: a p99 ITL needs as many requests as a p99 TTFT).
  The point estimate stays the nearest-rank percentile of the gaps of ok requests, or a
  failure when the failures exceed the percentile's allowance at request level
  (failures > n - ceil(p/100 * n), n = the class's requests).
- streams that arrived coalesced (`analysis.delivery`: held back on the way, or written in
  bursts): their TPOT and ITL are not the server's pace, so the TPOT and ITL checks take
  them as unknown, ranked worst for the upper bound and best (0) for the lower
  (`_unpaced_check`); the point estimate shown is the observed one. Where the workload
  says the path buffers (`target.path_buffers`), they are judged as observed, and the
  check's note says so.
- verdict (per class): the worst of its checks (missed, then inconclusive, then met);
  `met` is verdict == met. A check with no values to judge (e.g. TPOT when every response
  had one token, or no request came back ok) is missed: a promise nothing measured is not
  a promise kept. A class with targets but no recorded requests cannot be judged and is
  missed. A class without targets is met (nothing was promised).
- attainment's exact one-sided bounds at the class's confidence are kept beside it.
- goodput: requests (and their output tokens) that met_slo, divided by the run duration
  max(end) - min(intended_ns) over the WHOLE frame, the same denominator for every class.
- exit code: 3 when the generator fell behind (its numbers are not the server's), else 2
  when any class missed, else 7 when any class was inconclusive, else 0.
- a stopped run is no verdict on the server: interrupted (Ctrl-C/SIGTERM, exit 130),
  stopped by the watchdog (exit 4) or incomplete (killed outright and recovered, exit 5).
  Its figures are kept, as partial figures, but `met` and `slo_met` are null: requests it
  never sent or finished would otherwise count as the server's failures (or, missing, as
  its successes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from loadgen.analysis import metrics
from loadgen.analysis.confidence import (
    INCONCLUSIVE,
    INTERVAL,
    MET,
    MISSED,
    RULES,
    Judgement,
    bounds_verdict,
    judge_clustered,
    judge_percentile,
    point_verdict,
    share_bounds,
    worst,
)
from loadgen.analysis.delivery import COALESCED_EVENTS, Unpaced
from loadgen.analysis.split import ttft_split, with_split
from loadgen.errors import EXIT_FELL_BEHIND, EXIT_INCONCLUSIVE, EXIT_OK, EXIT_SLO_MISSED
from loadgen.measures import (
    BY_COLUMN,
    E2E,
    FAILURES_WORST,
    GAP,
    ITL,
    MEASURES,
    SLO_MEASURES,
    TPOT,
    TTFT,
    TTFT_FROM_SEND,
    label_of,
)
from loadgen.percentiles import nearest_rank
from loadgen.results.records import OUTCOMES, Outcome
from loadgen.results.runfolder import STOPS
from loadgen.results.summary import (
    Check,
    ClassAudit,
    Delivery,
    Goodput,
    PrefixCacheShare,
    ServerTimings,
    SloAudit,
    StreamEnds,
    TokensPerChunk,
    Verdict,
)
from loadgen.workload.spec import METRICS_MS, SloTargets

# per_request's leading columns, in the order it documents (the rest follow as `derive`
# gives them): the measures a request is judged by, TTFT from send, and the generator's lag.
LEADING = ("request_id", "class", "outcome", TTFT.column, TTFT_FROM_SEND.column, TPOT.column,
           E2E.column, ITL.per_request, "lag_ms")  # fmt: skip

NO_TARGETS = SloTargets()


def per_request(
    frame: pl.DataFrame, *, slos: Mapping[str, SloTargets] | None = None
) -> pl.DataFrame:
    """`metrics.derive` plus `meets_slo`: did this request meet every threshold of its class.

    Columns: request_id, class, outcome, ttft_ms, ttft_from_send_ms, tpot_ms, e2e_ms,
    max_itl_ms, lag_ms (`LEADING`), meets_slo, then the other measures (ttfvt_ms, ...),
    output_tokens, has_reasoning and the server-reported `server_*_ms` (see
    `metrics.derive`), then each request's TTFT split by the stream's server fields
    (`analysis.split.with_split`: `split_*_ms`, `split_source`). A class missing
    from `slos` has no thresholds: its ok requests meet, its failures do not.
    """
    derived = metrics.derive(frame)
    meets = pl.col("outcome") == Outcome.OK.value
    for measure in SLO_MEASURES:
        limits = {cls: t.thresholds_ms().get(measure.column) for cls, t in (slos or {}).items()}
        if not any(v is not None for v in limits.values()):
            continue
        limit = pl.col("class").replace_strict(limits, default=None, return_dtype=pl.Float64)
        value = pl.col(measure.per_request)  # ITL's limit applies to every gap: the largest
        meets = meets & (value <= limit).fill_null(True)  # no limit, or not applicable
    rest = [c for c in derived.columns if c not in LEADING]
    rows = derived.with_columns(meets.alias("meets_slo")).select(*LEADING, "meets_slo", *rest)
    return with_split(rows)


def verdict(
    classes: Mapping[str, ClassAudit],
    *,
    fell_behind: bool,
    stopped: str | None = None,
    rule: str = INTERVAL,
) -> Verdict:
    """The run's verdict from its classes' verdicts, judged by `rule`.

    status is `met` (exit 0), `missed` (2), `inconclusive` (7) or `fell_behind` (3); a
    stopped run's is its stop (`interrupted` 130, `watchdog` 4, `incomplete` 5), with
    `slo_met` null: its figures are partial and judge nothing (its classes are `withheld`).
    """
    if stopped is not None:
        if stopped not in STOPS:
            raise ValueError(f"stopped must be one of {', '.join(STOPS)} (got {stopped!r})")
        return Verdict(status=stopped, slo_met=None, fell_behind=fell_behind,
                       exit_code=STOPS[stopped], rule=rule)  # fmt: skip
    judged = worst([c.slo.judged or MISSED for c in classes.values()])
    status = "fell_behind" if fell_behind else judged
    return Verdict(status=status, slo_met=judged == MET, fell_behind=fell_behind,
                   exit_code=exit_code(judged, fell_behind=fell_behind), rule=rule)  # fmt: skip


def withheld(block: ClassAudit) -> ClassAudit:
    """A class of a run that stopped before its end: every `met` and verdict null (slo,
    batch, trajectory), its figures kept as partial figures."""
    return replace(
        block,
        slo=replace(block.slo, met=None, verdict=None),
        batch=replace(block.batch, met=None) if block.batch else None,
        trajectory=replace(block.trajectory, met=None, verdict=None) if block.trajectory else None,
    )


def stop_of(verdict: Verdict) -> str | None:
    """The stop a verdict records (None for a run that ran to its end)."""
    return verdict.status if verdict.status in STOPS else None


EXIT_OF = {MET: EXIT_OK, MISSED: EXIT_SLO_MISSED, INCONCLUSIVE: EXIT_INCONCLUSIVE}


def exit_code(judged: str, *, fell_behind: bool) -> int:
    """3 if the generator fell behind, else 2 if any class missed its SLO (`judged` is the
    worst verdict of the classes), else 7 if any was inconclusive, else 0."""
    if fell_behind:
        return EXIT_FELL_BEHIND
    return EXIT_OF[judged]


def check_rule(rule: str) -> str:
    """`rule` if it is one of RULES (ValueError otherwise)."""
    if rule not in RULES:
        raise ValueError(f"the verdict rule must be one of {', '.join(RULES)} (got {rule!r})")
    return rule


def audit_class(
    rows: pl.DataFrame,
    itl_ms: pl.Series,
    *,
    tokens_per_chunk: TokensPerChunk,
    targets: SloTargets,
    duration_s: float,
    stream_ends: StreamEnds | None = None,
    rule: str = INTERVAL,
    delivery: Delivery | None = None,
    unpaced: Unpaced | None = None,
) -> ClassAudit:
    """One class's block of the summary: outcomes, latency stats, SLO audit and goodput.

    `rows` are the class's `per_request` rows, `itl_ms` the gaps of its ok requests,
    `duration_s` the whole run's duration (goodput's denominator), `rule` how its checks
    are judged (`interval` or `point`). Each population is sorted once and shared by its
    stats and its check. `unpaced`: the class's streams that arrived coalesced, whose
    TPOT and ITL the checks judge as unknown (`analysis.delivery`); the stats show every
    ok request as observed.
    """
    ok = rows.filter(pl.col("outcome") == Outcome.OK.value)
    failures = rows.height - ok.height
    ok_ms = {m.column: (itl_ms if m.per == GAP else ok.get_column(m.column)).drop_nulls().sort()
             for m in MEASURES}  # fmt: skip
    stats: dict[str, Any] = {m.column: metrics.latency_stats(ok_ms[m.column]) for m in MEASURES}
    for m in FAILURES_WORST:
        stats[m.with_failures] = metrics.latency_stats_with_failures(ok_ms[m.column],
                                                                     failures=failures)  # fmt: skip
    return ClassAudit(
        **stats,  # each measure's block of the summary (`ClassAudit.stats`, `.ranked`)
        requests=rows.height,
        outcomes=outcome_counts(rows.get_column("outcome")),
        output_tokens=metrics.output_token_stats(ok.get_column("output_tokens")),
        reasoning_requests=int(ok.get_column("has_reasoning").sum()),
        server_timings_ms=server_timings(ok),
        ttft_split=ttft_split(ok, threshold_ms=targets.ttft_ms,
                              percentile=targets.percentile if targets.ttft_ms else None),
        tokens_per_chunk=tokens_per_chunk,
        slo=slo_audit(ok_ms, requests=rows.height, failures=failures,
                      meeting=int(rows.get_column("meets_slo").sum()), targets=targets,
                      streamed=ok.get_column(ITL.per_request).drop_nulls().len(), rule=rule,
                      unpaced=unpaced),
        goodput=goodput(rows, duration_s=duration_s),
        stream_ends=stream_ends or StreamEnds(),
        delivery=delivery or Delivery(),
        prefix_cache=prefix_cache_share(rows),
    )  # fmt: skip


def prefix_cache_share(rows: pl.DataFrame) -> PrefixCacheShare | None:
    """Cached / prompt tokens over the requests whose server reported cached tokens (None
    when none did: the API or the server does not say)."""
    said = rows.filter(pl.col("cached_prompt_tokens").is_not_null())
    if said.height == 0:
        return None
    cached = int(said.get_column("cached_prompt_tokens").sum())
    prompt = int(said.get_column("prompt_tokens").fill_null(0).sum())
    share = round(cached / prompt, 6) if prompt else None
    return PrefixCacheShare(requests=said.height, prompt_tokens=prompt, cached_tokens=cached,
                            hit_share=share)  # fmt: skip


def server_timings(ok: pl.DataFrame) -> ServerTimings:
    """Stats of what the server reported about its own work, over ok requests that carried it.

    `requests` counts them (0: the API reports nothing, and every stat is null).
    """
    with_timings = ok.filter(pl.any_horizontal(pl.col(f"server_{f}").is_not_null()
                                               for f in metrics.SERVER_MS_FIELDS))  # fmt: skip
    stats = {name: metrics.latency_stats(with_timings.get_column(f"server_{name}"))
             for name in metrics.SERVER_MS_FIELDS}  # fmt: skip
    return ServerTimings(requests=with_timings.height, **stats)


def outcome_counts(outcomes: pl.Series) -> dict[str, int]:
    """A count for every key of `records.OUTCOMES`, zeros included."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for value, count in outcomes.value_counts().iter_rows():
        counts[str(value)] = int(count)
    return counts


def slo_audit(
    ok_ms: Mapping[str, pl.Series],
    *,
    requests: int,
    failures: int,
    meeting: int,
    targets: SloTargets,
    streamed: int | None = None,
    rule: str = INTERVAL,
    unpaced: Unpaced | None = None,
) -> SloAudit:
    """attainment, the checks and the class's verdict, for one class.

    `ok_ms` holds each measure's values over ok requests (ITL: over their gaps),
    `meeting` how many requests met every per-request threshold, `streamed` how many ok
    requests streamed at least one gap (ITL's groups; None: every ok request did).
    `unpaced`: streams that arrived coalesced, judged as unknown on TPOT and ITL
    (`_unpaced_check`).
    """
    check_rule(rule)
    limits = targets.thresholds_ms()
    p, level = targets.percentile, targets.confidence
    groups = requests - failures if streamed is None else streamed
    population = Population(requests=requests, failures=failures, streamed=groups)
    checks = [
        _unpaced_check(name, limit, ok_ms[name], population, p, level, rule, unpaced)
        if unpaced is not None and unpaced.unknown(name)
        else _check(name, limit, ok_ms[name], population, p, level, rule)
        for name, limit in limits.items()
    ]
    if checks and requests == 0:
        checks = [_unjudgeable_check(level)]
    judged = worst([c.judged for c in checks])
    low, high = share_bounds(meeting, requests, level) if requests else (None, None)
    return SloAudit(
        targets=replace(targets, percentile=float(p), confidence=float(level),
                        **{name: _float(getattr(targets, name)) for name in METRICS_MS}),
        attainment=round(meeting / requests, 6) if requests else None,
        met=judged == MET,
        checks=tuple(checks),
        verdict=judged,
        attainment_low=_share(low),
        attainment_high=_share(high),
    )  # fmt: skip


def _float(value: float | None) -> float | None:
    return float(value) if value is not None else None


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


@dataclass(frozen=True, slots=True)
class Population:
    """A class's request counts a check needs: all, failed, and ok with at least one gap."""

    requests: int
    failures: int
    streamed: int


def _check(
    name: str, limit_ms: float, values: pl.Series, counts: Population, p: float, level: float,
    rule: str,
) -> Check:  # fmt: skip
    """One population target: the p-th percentile of `name`, failures ranked worst, <= limit,
    judged by `rule` at `level` (see the module doc)."""
    note = None
    ordered = values.to_numpy().astype(np.float64, copy=False)  # sorted by the caller
    failures = counts.failures
    judgement: Judgement
    if BY_COLUMN[name].per == GAP:  # gaps cannot be mixed with failed requests: module doc
        population = values.len()
        value = metrics.percentiles(values, (p,))[0]
        requests = counts.requests
        allowance = requests - nearest_rank(p, requests) if requests else 0
        if failures > allowance:
            value = math.inf
            note = f"failed requests ({failures}) exceed the p{p:g} allowance ({allowance})"
        judgement = judge_clustered(ordered, counts.streamed, p, limit_ms, level,
                                    failures=failures)  # fmt: skip
    else:
        population = values.len() + failures
        value = metrics.percentiles(values, (p,), failures=failures)[0]
        judgement = judge_percentile(ordered, p, limit_ms, level, failures=failures)
    if value is None:
        note = "no values to judge: the check cannot pass"
    elif math.isinf(value) and note is None:
        note = f"p{p:g} falls on a failed request"
    judged = judgement.verdict if rule == INTERVAL else point_verdict(value, limit_ms)
    if value is None:
        judged = MISSED
    if judged == INCONCLUSIVE:
        note = _inconclusive_note(judgement, p, limit_ms, note)
    return Check(
        metric=name,
        percentile=float(p),
        target_ms=float(limit_ms),
        value_ms=metrics.round_ms(value),
        passed=judged == MET,
        population=population,
        note=note,
        verdict=judged,
        confidence=level,
        low_ms=metrics.round_ms(judgement.low),
        high_ms=metrics.round_ms(judgement.high),
        low_open=judgement.low is None and judgement.n > 0,
        high_open=judgement.high is None and judgement.n > 0,
        needed=judgement.needed,
    )


def _unpaced_check(
    name: str, limit_ms: float, values: pl.Series, counts: Population, p: float, level: float,
    rule: str, unpaced: Unpaced,
) -> Check:  # fmt: skip
    """TPOT or ITL when some streams arrived coalesced: their values are not the server's
    pace, so they are unknown. The upper bound ranks them worst (as failures), the lower
    bound best (0 ms): MET only when it holds whatever they were, MISSED only when it fails
    whatever they were, else INCONCLUSIVE saying why. `--verdict point` does the same with
    the point estimates. The value shown is the observed percentile over every ok request.
    Where the path is declared to buffer (`unpaced.observed`), the check is the observed
    one, and says so."""
    observed = _check(name, limit_ms, values, counts, p, level, rule)
    metric = label_of(name)
    coalesced = (
        f"{unpaced.coalesced:,} of {unpaced.streams:,} streams arrived coalesced (half their "
        f"reads at {COALESCED_EVENTS}+ events)"
    )
    if unpaced.observed:
        said = f"{coalesced}: judged as observed, as target.path_buffers says the path buffers"
        note = said if observed.note is None else f"{observed.note}; {said}"
        return replace(observed, note=note)
    known = unpaced.values(name)
    unknown = unpaced.unknown(name)
    ordered = known.to_numpy().astype(np.float64, copy=False)
    failures = counts.failures
    if BY_COLUMN[name].per == GAP:
        zeros = np.zeros(unpaced.itl_unknown_gaps)
        worst_case = judge_clustered(ordered, unpaced.itl_streams, p, limit_ms, level,
                                     failures=failures + unknown)  # fmt: skip
        best_case = judge_clustered(np.concatenate((zeros, ordered)),
                                    unpaced.itl_streams + unknown, p, limit_ms, level,
                                    failures=failures)  # fmt: skip
    else:
        worst_case = judge_percentile(ordered, p, limit_ms, level, failures=failures + unknown)
        best_case = judge_percentile(np.concatenate((np.zeros(unknown), ordered)), p, limit_ms,
                                     level, failures=failures)  # fmt: skip
    if rule == INTERVAL:
        high, low = worst_case.high, best_case.low
    else:
        high, low = worst_case.value, best_case.value
    judged = bounds_verdict(low, high, limit_ms)
    note = (
        f"{coalesced}: their {metric} is not the server's pace and is judged unknown (worst "
        "for the upper bound, best for the lower); --path-buffers judges it as observed"
    )
    return replace(
        observed, verdict=judged, passed=judged == MET, note=note, coalesced=unknown,
        low_ms=metrics.round_ms(low), high_ms=metrics.round_ms(high),
        low_open=low is None and worst_case.n > 0, high_open=high is None and worst_case.n > 0,
        needed=worst_case.needed if high is None else None,
    )  # fmt: skip


def _inconclusive_note(judgement: Judgement, p: float, limit_ms: float, note: str | None) -> str:
    """Why a check is inconclusive: too few requests to bound it, or the target inside."""
    level = f"{judgement.confidence:.0%}"
    if judgement.needed is not None:
        why = (
            f"too few requests to bound p{p:g} from above at {level}: {judgement.n:,} of the "
            f"{judgement.needed:,} needed"
        )
    else:
        low = "—" if judgement.low is None else f"{judgement.low:,.3g}"
        high = "failure" if judgement.high is None or math.isinf(judgement.high) else (
            f"{judgement.high:,.3g}")  # fmt: skip
        why = f"the target {limit_ms:g} ms lies within [{low}, {high}] ms at {level} each side"
    return why if note is None else f"{why}; {note}"


def _unjudgeable_check(level: float) -> Check:
    """The check a class with targets but no recorded requests gets: it cannot pass."""
    return Check(
        metric="requests",
        percentile=None,
        target_ms=None,
        value_ms=None,
        passed=False,
        population=0,
        note="no recorded requests: the class cannot be judged",
        verdict=MISSED,
        confidence=level,
    )


def goodput(rows: pl.DataFrame, *, duration_s: float) -> Goodput:
    """Requests and output tokens per second from requests that met every threshold."""
    good = rows.filter(pl.col("meets_slo"))
    if duration_s <= 0:
        return Goodput(requests_per_s=None, output_tokens_per_s=None)
    return Goodput(
        requests_per_s=round(good.height / duration_s, 3),
        output_tokens_per_s=round(int(good.get_column("output_tokens").sum()) / duration_s, 3),
    )
