"""Per-class objectives beyond request percentiles: batches, trajectories, sessions.

Part of the audit stage, after `slo.audit_class` (`analysis.audit.audit` calls
`judge_by_objective` for every class). The three product shapes are judged
differently: chat by TTFT/TPOT percentiles (the summary as it is, plus a `sessions` block
when the class has multi-turn sessions); summarization by whether the whole batch finished
by its deadline, and its input/output token throughput (TTFT/TPOT kept for diagnosis only);
an agent by trajectory attainment: the share of trajectories that finished within their
budget with every hop ok and the final, user-facing hop within the class's SLO thresholds.
Pure functions of the records frame and the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import polars as pl

from loadgen.analysis.confidence import INTERVAL, MET, MISSED, judge_share
from loadgen.analysis.metrics import percentiles
from loadgen.analysis.slo import per_request
from loadgen.results.records import Outcome
from loadgen.results.runfolder import RecordedClass
from loadgen.results.summary import (
    AskedLoad,
    BatchAudit,
    ClassAudit,
    DurationStats,
    HopStats,
    SessionsAudit,
    TimeSplit,
    TrajectoryAudit,
)
from loadgen.units import NS_PER_MS, NS_PER_S
from loadgen.workload.spec import ClassSpec, SloTargets


@dataclass(frozen=True, slots=True, kw_only=True)
class Objective:
    """What a class is judged by: its kind, SLO targets and kind-specific limits.

    Built from the spec during a run (`of`), or from run.json when a report re-audits a run
    (`recorded`).
    """

    name: str
    kind: str = "chat"
    slo: SloTargets = field(default_factory=SloTargets)
    has_sessions: bool = False
    batch_deadline_s: float | None = None
    concurrency: int | None = None
    trajectory_budget_s: float | None = None
    # The arrival rate asked for (single open-loop requests only, `asked.unit` "requests":
    # chat without sessions, a dataset's replayed conversations being sessions too, or an
    # open-loop summarization class: one document per arrival).
    requested_rate_per_s: float | None = None
    # What was asked in the class's own unit (sessions/s, a closed loop's concurrency, ...).
    asked: AskedLoad | None = None

    @classmethod
    def of(cls, spec: ClassSpec) -> Objective:
        """The objective of a validated class spec."""
        replayed = spec.dataset is not None and spec.dataset.turns == "all"
        asked = AskedLoad.of(
            kind=spec.kind,
            sessions=spec.turns is not None or replayed,
            concurrency=spec.concurrency,
            process=spec.arrival.process,
            mean_rate_per_s=spec.arrival.mean_rate_per_s,
        )
        return cls(
            name=spec.name, kind=spec.kind, slo=spec.slo, has_sessions=spec.turns is not None,
            batch_deadline_s=spec.batch_deadline_s, concurrency=spec.concurrency,
            trajectory_budget_s=spec.trajectory_budget_s,
            requested_rate_per_s=spec.arrival.mean_rate_per_s
            if asked.unit == "requests" else None,
            asked=asked,
        )  # fmt: skip

    @classmethod
    def recorded(cls, recorded: RecordedClass, slo: SloTargets) -> Objective:
        """A class's objective as run.json recorded it, judged against `slo`."""
        return cls(
            name=recorded.name, kind=recorded.kind, slo=slo, has_sessions=recorded.has_turns,
            batch_deadline_s=recorded.batch_deadline_s, concurrency=recorded.concurrency,
            trajectory_budget_s=recorded.trajectory_budget_s,
            requested_rate_per_s=recorded.requested_rate_per_s, asked=recorded.asked,
        )  # fmt: skip


NOT_FAILED = [Outcome.OK.value, Outcome.SKIPPED.value]  # a skipped hop is counted separately


def judge_by_objective(
    block: ClassAudit, rows: pl.DataFrame, cls: Objective, *, rule: str = INTERVAL
) -> ClassAudit:
    """A class's block with its objective's: a summarization class judged by its batch, an
    agent class by its trajectories (by `rule`), a chat class with sessions given their
    counts.

    `rows` are the class's records. A batch is one batch: whether it finished by its
    deadline is a fact of this run, not an estimate, so it is met or missed.
    """
    if cls.kind == "summarization":
        batch = batch_block(rows, cls)
        judged = MET if batch.met else MISSED
        slo = replace(block.slo, judged_by="batch", met=batch.met, verdict=judged)
        return replace(block, batch=batch, slo=slo)
    if cls.kind == "agent":
        trajectory = trajectory_block(rows, cls, rule=rule)
        judged = trajectory.verdict or (MET if trajectory.met else MISSED)  # none: no records
        slo = replace(block.slo, judged_by="trajectory", met=trajectory.met, verdict=judged)
        return replace(block, trajectory=trajectory, slo=slo)
    if cls.has_sessions:
        return replace(block, sessions=sessions_block(rows))
    return block


def batch_block(rows: pl.DataFrame, cls: Objective) -> BatchAudit:
    """Did the batch finish by its deadline, how long it took, tokens per second in and out.

    Completion time runs from the first document's intended send to the last document's end.
    The batch is met when every document finished ok (and by the deadline, if one is set).
    """
    documents = rows.height
    ok = rows.filter(pl.col("outcome") == Outcome.OK.value)
    completion_s: float | None = None
    if documents and rows["end_ns"].drop_nulls().len():
        first, last = rows["intended_ns"].min(), rows["end_ns"].max()
        completion_s = (int(last) - int(first)) / NS_PER_S  # type: ignore[arg-type]  # polars scalars
    prompt = (
        float(ok["prompt_tokens"].fill_null(ok["prompt_tokens_target"]).sum()) if ok.height else 0.0
    )
    output = float(ok["output_tokens"].sum()) if ok.height else 0.0
    all_ok = documents > 0 and ok.height == documents
    in_time = cls.batch_deadline_s is None or (
        completion_s is not None and completion_s <= cls.batch_deadline_s
    )
    return BatchAudit(
        documents=documents,
        ok=ok.height,
        completion_time_s=_round(completion_s),
        deadline_s=cls.batch_deadline_s,
        met_deadline=bool(all_ok and in_time),
        met=bool(all_ok and in_time),
        input_tokens_per_s=_rate(prompt, completion_s),
        output_tokens_per_s=_rate(output, completion_s),
        concurrency=cls.concurrency,
    )


def trajectory_block(
    rows: pl.DataFrame, cls: Objective, *, rule: str = INTERVAL
) -> TrajectoryAudit:
    """Trajectory attainment, per-hop duration percentiles and the time split.

    A trajectory is ok when every hop is ok, it ended within its budget (last hop end −
    first hop intended), and its final hop met every per-request threshold of the class.
    The share of ok trajectories is judged against the SLO percentile as a share: by its
    exact one-sided bounds at the class's confidence (`judge_share`: met when the lower
    bound reaches the target), or by the share itself with `rule` `point`.
    Time split, summed over hops: `ttft` (queueing and prefill, intended → first token),
    `decode` (first → last token) and `tool` (previous hop's end → this hop's intended time).
    """
    if rows.height == 0:
        return TrajectoryAudit(trajectories=0, ok=0, attainment=None, met=False)
    meets = per_request(rows, slos={cls.name: cls.slo}).select("request_id", "meets_slo")
    hops = rows.join(meets, on="request_id", how="left").sort("session_id", "turn")
    hops = hops.with_columns(
        ((pl.col("end_ns") - pl.col("intended_ns")) / NS_PER_MS).alias("duration_ms"),
    )
    per_trajectory = hops.group_by("session_id").agg(
        (pl.col("outcome") == Outcome.OK.value).all().alias("all_ok"),
        pl.col("meets_slo").last().alias("final_ok"),
        ((pl.col("end_ns").max() - pl.col("intended_ns").min()) / NS_PER_S).alias("duration_s"),
        (pl.col("outcome") == Outcome.SKIPPED.value).sum().alias("skipped"),
    )
    budget = cls.trajectory_budget_s
    within = pl.col("duration_s") <= budget if budget is not None else pl.lit(True)
    per_trajectory = per_trajectory.with_columns(
        (pl.col("all_ok") & pl.col("final_ok").fill_null(False) & within.fill_null(False)).alias(
            "ok"
        )
    )
    count = per_trajectory.height
    good = int(per_trajectory["ok"].sum())
    attainment = good / count
    target = cls.slo.percentile / 100
    judgement = judge_share(good, count, target, cls.slo.confidence)
    judged = judgement.verdict if rule == INTERVAL else (MET if attainment >= target else MISSED)
    ok_hops = hops.filter(pl.col("outcome") == Outcome.OK.value)
    return TrajectoryAudit(
        trajectories=count,
        ok=good,
        attainment=round(attainment, 6),
        target_attainment=target,
        met=judged == MET,
        verdict=judged,
        attainment_low=_share(judgement.low),
        attainment_high=_share(judgement.high),
        needed=judgement.needed,
        budget_s=budget,
        failed_hops=hops.filter(~pl.col("outcome").is_in(NOT_FAILED)).height,
        skipped_hops=int(per_trajectory["skipped"].sum()),
        duration_s=_stats(per_trajectory.filter(pl.col("all_ok"))["duration_s"]),
        per_hop_ms={
            str(hop): _stats(group["duration_ms"])
            for (hop,), group in ok_hops.group_by("turn", maintain_order=True)
        },
        time_split_s=TimeSplit(
            ttft=_sum_s(ok_hops["first_token_ns"] - ok_hops["intended_ns"]),
            decode=_sum_s(ok_hops["last_token_ns"] - ok_hops["first_token_ns"]),
            tool=_tool_s(ok_hops),
        ),
        per_hop=_per_hop(ok_hops),
    )


def _tool_s(ok_hops: pl.DataFrame) -> float:
    """Seconds between a hop's end and the next hop's intended send, summed. A fan-out
    hop (several requests of one turn) ends when its last branch does."""
    steps = (
        ok_hops.group_by("session_id", "turn")
        .agg(pl.col("intended_ns").min(), pl.col("end_ns").max())
        .sort("session_id", "turn")
    )
    gaps = steps["intended_ns"] - steps["end_ns"].shift(1)
    same = steps["session_id"] == steps["session_id"].shift(1)
    return round(float(gaps.filter(same.fill_null(False)).sum()) / NS_PER_S, 3)


def _per_hop(ok_hops: pl.DataFrame) -> dict[str, HopStats]:
    """Per hop index: the context sent (client count and server usage) and TTFT."""
    result = {}
    for (hop,), group in ok_hops.sort("turn").group_by("turn", maintain_order=True):
        sent = group["prompt_tokens_target"].drop_nulls()
        served = group["prompt_tokens"].drop_nulls()
        ttft = (group["first_token_ns"] - group["intended_ns"]) / NS_PER_MS
        result[str(hop)] = HopStats(
            requests=group.height,
            prompt_tokens_mean=_round(sent.mean()) if sent.len() else None,  # type: ignore[arg-type]
            prompt_tokens_max=int(sent.max()) if sent.len() else None,  # type: ignore[arg-type]
            server_prompt_tokens_mean=_round(served.mean()) if served.len() else None,  # type: ignore[arg-type]
            ttft_ms=_stats(ttft),
        )
    return result


def sessions_block(rows: pl.DataFrame) -> SessionsAudit:
    """How many sessions there were and how many completed every turn ok."""
    per_session = rows.group_by("session_id").agg(
        (pl.col("outcome") == Outcome.OK.value).all().alias("all_ok"), pl.len().alias("turns")
    )
    sessions = per_session.height
    return SessionsAudit(
        sessions=sessions,
        completed=int(per_session["all_ok"].sum()) if sessions else 0,
        turns=rows.height,
        turns_per_session_mean=round(rows.height / sessions, 3) if sessions else None,
    )


def _stats(values: pl.Series) -> DurationStats:
    clean = values.drop_nulls().sort()
    p50, p90, p99 = percentiles(clean, [50, 90, 99])
    return DurationStats(p50=_round(p50), p90=_round(p90), p99=_round(p99), count=clean.len())


def _sum_s(values_ns: pl.Series) -> float:
    return round(float(values_ns.drop_nulls().sum()) / NS_PER_S, 3)


def _rate(amount: float, seconds: float | None) -> float | None:
    return round(amount / seconds, 3) if seconds else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
