"""Capacity planning: the seed's serving arithmetic, from SLOs and a few serving parameters.

Sits beside the audit, after the records: `estimate` reads parameters off measured runs
(records frames and their `run.json`), `resolve` merges them with command-line values and
defaults (labelling where each came from; `from_runs` turns runs into such layers), and
`make_plan` does the arithmetic; `to_json` is the plan for machines. Pure functions; no
I/O (`loadgen.cli.plan` reads the files, `render.planner_view` draws the tables).

The arithmetic (P = prompt tokens, r = prefill tokens/s, t_d = decode step, N = output
tokens, λ = arrival rate, μ = drain rate of one replica):

- chunk: C = ⌊(TPOT_slo − t_d) × r⌋ tokens, the largest prefill piece that keeps the step
  (decode + piggybacked chunk, taken as additive: a conservative bound) inside TPOT_slo.
  A prompt of P tokens then needs ⌈P/C⌉ steps of at most TPOT_slo each: its TTFT.
- stall: an unchunked prompt makes one step of t_d + P/r, felt by every running sequence.
- queue cap: a request queued behind k others waits about k/μ, so beyond
  (TTFT_slo − P/r) × μ queued requests it is already doomed. `queue_cap` is that number;
  `queue_cap_requests` is its floor, the setting to use (admit at most that many waiting).
- utilization: the replica's admission queue seen as M/G/1 with service time S = 1/μ and
  service-time CV C_v (Pollaczek–Khinchine): W_q = ρ·S·(1 + C_v²)/(2(1 − ρ)). Its p99 is
  taken as ln(100)·W_q (the seed's exponential multiplier; optimistic for heavy-tailed
  service, where it is a floor). The largest ρ with P/r + ln(100)·W_q ≤ TTFT_slo is
  ρ_max = x/(1 + x), x = (TTFT_slo − P/r)/(ln(100)·S·(1 + C_v²)/2); with an E2E SLO the
  E2E budget is applied too and the smaller ρ wins. One server is a pessimistic picture of
  a many-slot replica (a request waits only when every slot is busy); the fleet sizing
  below is the many-server answer.
- fleet: Little's law a = λ·T_hold, T_hold = P/r + N·t_d; square-root headroom
  c = a + β√a slots; replicas = ⌈c / slots per replica⌉ + 1 spare for a failure. Its
  utilization is a batch-slot figure, a / (replicas × slots), not the single-server ρ above:
  the two are different quantities. The fleet is checked as many servers (M/M/c, Erlang C,
  each slot a server holding a request for T_hold; Allen–Cunneen's (1 + C_v²)/2 for the
  service CV): P(wait) = C(c, a), p-th percentile wait = infl · ln(C / (1 − p)) / (c/T_hold
  − λ), 0 when C ≤ 1 − p. Square-root staffing is the answer for ONE queue in front of every
  slot of the fleet (c = replicas × slots); with a queue per replica (a balancer that sends
  each request to a replica, which queues it) each replica is M/M/c on its own λ/replicas,
  which needs more replicas (`replicas_queue_per_replica`). The single-server ρ_max asks for
  ⌈λ / (ρ_max·μ)⌉ (`replicas_single_server`): pessimistic, since a replica with a free slot
  queues nothing.
- goodput: for each (B, t(B)) of a decode table, tokens/s = B/t(B), and it counts only
  when t(B) ≤ TPOT_slo; the optimum is the feasible B with the most tokens/s.
- cost: replicas × GPUs × $/GPU-hour over the SLO-meeting output tokens per hour (λ·N).

Every percentile read off records here (the envelope fits' cuts, the decode floor's lower
tail, TPOT p50, prompt and output token p50 and max, the decoding batch) is nearest rank
(`loadgen.percentiles`): an observed value, never an interpolation. The decode floor's
centre is a location estimate, the midpoint median (`_location`); the p99 of the queue
model is the exponential's, ln(100)·W_q, not a sample percentile.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import polars as pl

from loadgen.analysis.metrics import derive, percentiles
from loadgen.errors import ConfigError, OptionError
from loadgen.percentiles import nearest_rank
from loadgen.results.records import Outcome
from loadgen.results.runfolder import RunInfo
from loadgen.sim.engine import EngineConfig

CHECK_UTILIZATIONS: tuple[float, ...] = (0.5, 0.7, 0.9, 0.95)
MM1_KNEE = 0.8  # the seed: "a fleet you would run at 0.8 under exponential assumptions"
ENVELOPE_PERCENTILE = 20.0  # lower-envelope fits keep points at or below this percentile
ENVELOPE_ROUNDS = 5
DEFAULTS: dict[str, float] = {"service_cv": 1.0, "beta": 2.0, "percentile": 99.0}
DecodeTable = tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanInputs:
    """Everything the arithmetic needs; None marks an optional input that was not given."""

    prefill_tokens_per_s: float
    decode_step_ms: float
    slots_per_replica: int
    ttft_slo_ms: float
    tpot_slo_ms: float
    prompt_tokens: float
    long_prompt_tokens: float
    output_tokens: float
    service_cv: float = 1.0
    beta: float = 2.0
    percentile: float = 99.0
    e2e_slo_ms: float | None = None
    arrival_rate_per_s: float | None = None
    drain_rate_per_s: float | None = None  # None: slots_per_replica / T_hold
    decode_table: DecodeTable = ()
    gpus_per_replica: float | None = None
    gpu_hour_usd: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueRow:
    """One utilization's mean and tail sojourn time in units of the service time S."""

    utilization: float
    mm1_mean_over_s: float  # 1/(1 − ρ)
    mm1_p_over_s: float  # ln(100)/(1 − ρ) for p99: M/M/1 sojourn is exponential
    mg1_mean_over_s: float  # 1 + ρ(1 + C_v²)/(2(1 − ρ)): P–K waiting plus one service


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchOption:
    """One decode batch size: its step time, raw tokens/s and whether it meets TPOT."""

    batch: int
    step_ms: float
    tokens_per_s: float
    meets_tpot_slo: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Chunking:
    """The safe prefill chunk and what it does to TTFT; None beyond chunk_tokens when C = 0."""

    chunk_tokens: int
    chunk_step_ms: float | None = None  # t_decode + C/r ≤ TPOT_slo
    prompt_chunks: int | None = None
    prompt_ttft_chunked_ms: float | None = None
    long_prompt_chunks: int | None = None
    long_prompt_ttft_chunked_ms: float | None = None
    long_prompt_meets_ttft_slo: bool | None = None
    max_prompt_tokens_chunked: int | None = None  # ⌊TTFT_slo/TPOT_slo⌋ × C


@dataclass(frozen=True, slots=True, kw_only=True)
class Fleet:
    """Little's law sizing for a target arrival rate."""

    offered_slots: float  # a = λ·T_hold
    slots_exact: float  # c = a + β√a
    slots: int  # ⌈c⌉
    replicas_without_spare: int  # ⌈c / slots per replica⌉
    replicas: int  # plus one spare for a failure
    replicas_naive: int  # ⌈a / slots per replica⌉: sized on the average, misses the p99
    slot_utilization: float  # a / (replicas without spare × slots): batch slots busy
    wait_budget_ms: float  # the queue wait the SLOs leave (TTFT, and E2E when given)
    pooled_wait_probability: float  # Erlang C, one queue, c = replicas without spare × slots
    pooled_wait_ms: float  # its p-th percentile queue wait (inf when a ≥ c)
    per_replica_wait_probability: float  # Erlang C of one replica's slots at λ / replicas
    per_replica_wait_ms: float  # its p-th percentile queue wait
    replicas_queue_per_replica: int | None  # fewest (+1 spare) keeping that wait in budget
    replicas_single_server: int | None  # ⌈λ / (ρ_max·μ)⌉ + 1: the single-server picture


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """Dollars per hour and per million SLO-meeting output tokens."""

    fleet_usd_per_hour: float | None  # replicas × GPUs × $/GPU-h (needs an arrival rate)
    usd_per_million_tokens: float | None  # at λ·N_out tokens/s
    usd_per_million_tokens_at_capacity: float | None  # one replica at its goodput optimum


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The plan's numbers; a section is None when its inputs were not given."""

    prefill_ms: float
    e2e_unqueued_ms: float
    e2e_meets_slo: bool | None
    chunking: Chunking
    unchunked_stall_ms: float
    unchunked_stall_over_tpot_slo: float
    unchunked_stall_meets_tpot_slo: bool
    stall_mean_share_ms: float
    t_hold_s: float
    drain_rate_per_s: float
    wait_budget_ms: float
    queue_cap: float
    queue_cap_requests: int
    pk_inflation: float
    tail_factor: float
    max_utilization: float
    max_utilization_mm1: float
    utilization_bound_by: str
    max_rate_per_replica_per_s: float
    mg1_utilization_matching_mm1_knee: float
    queue_rows: tuple[QueueRow, ...]
    fleet: Fleet | None
    batch_options: tuple[BatchOption, ...]
    goodput_optimal_batch: int | None
    goodput_tokens_per_s: float | None
    peak_throughput_batch: int | None
    cost: Cost | None


# --- the arithmetic -----------------------------------------------------------------------


def chunk_tokens(tpot_slo_ms: float, decode_step_ms: float, prefill_tokens_per_s: float) -> int:
    """C = ⌊(TPOT_slo − t_decode) × prefill_rate⌋ tokens; 0 when decoding alone misses TPOT."""
    exact = (tpot_slo_ms - decode_step_ms) * prefill_tokens_per_s / 1000
    return max(math.floor(round(exact, 6)), 0)  # round: 20 ms × 8000/s is 160, not 159.99…


def chunked_ttft_ms(prompt_tokens: float, chunk: int, tpot_slo_ms: float) -> tuple[int, float]:
    """(⌈P/C⌉ steps, ⌈P/C⌉ × TPOT_slo ms): a chunked prompt's unqueued TTFT, steps at the SLO."""
    steps = math.ceil(prompt_tokens / chunk)
    return steps, steps * tpot_slo_ms


def unchunked_stall_ms(decode_step_ms: float, prompt_tokens: float, prefill_per_s: float) -> float:
    """t_decode + P/prefill_rate: the step every running sequence waits for, in ms."""
    return decode_step_ms + prompt_tokens / prefill_per_s * 1000


def queue_cap(wait_budget_ms: float, drain_rate_per_s: float) -> float:
    """(TTFT_slo − t_prefill) × drain rate: queued requests beyond which one is already late."""
    return max(wait_budget_ms, 0.0) / 1000 * drain_rate_per_s


def pk_inflation(service_cv: float) -> float:
    """(1 + C_v²)/2: how much the P–K mean wait exceeds M/M/1's at the same utilization."""
    return (1 + service_cv**2) / 2


def tail_factor(percentile: float) -> float:
    """ln(1/(1 − p/100)): the p-th percentile of an exponential over its mean (p99: 4.6)."""
    return math.log(100 / (100 - percentile))


def mg1_wait_over_s(utilization: float, service_cv: float) -> float:
    """Pollaczek–Khinchine mean wait W_q / S = ρ(1 + C_v²)/(2(1 − ρ))."""
    return utilization * pk_inflation(service_cv) / (1 - utilization)


def queue_row(utilization: float, service_cv: float, percentile: float = 99.0) -> QueueRow:
    """The seed's M/M/1 table row for ρ (mean and tail sojourn over S) and the M/G/1 mean."""
    mean = 1 / (1 - utilization)
    return QueueRow(
        utilization=utilization,
        mm1_mean_over_s=mean,
        mm1_p_over_s=tail_factor(percentile) * mean,
        mg1_mean_over_s=1 + mg1_wait_over_s(utilization, service_cv),
    )


def max_utilization(
    wait_budget_ms: float, service_ms: float, service_cv: float, percentile: float = 99.0
) -> float:
    """Largest ρ with tail_factor × W_q ≤ the wait budget: x/(1 + x), 0 with no budget."""
    if wait_budget_ms <= 0:
        return 0.0
    x = wait_budget_ms / (tail_factor(percentile) * service_ms * pk_inflation(service_cv))
    return x / (1 + x)


def matching_utilization(mm1_utilization: float, service_cv: float) -> float:
    """The ρ at which M/G/1 waits as long as M/M/1 does at `mm1_utilization` (the knee's move)."""
    x = mm1_utilization / (1 - mm1_utilization) / pk_inflation(service_cv)
    return x / (1 + x)


def erlang_c(servers: int, offered: float) -> float:
    """P(an arrival waits) in M/M/c with c servers and a = λ·S busy on average; 1 when a ≥ c.

    Erlang B by its recursion B_k = a·B_{k−1} / (k + a·B_{k−1}) (no factorials, stable for
    thousands of servers), then C = c·B / (c − a(1 − B)).
    """
    if offered >= servers:
        return 1.0
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return servers * blocking / (servers - offered * (1 - blocking))


def many_server_wait_ms(
    servers: int,
    arrival_rate_per_s: float,
    hold_s: float,
    service_cv: float = 1.0,
    percentile: float = 99.0,
) -> tuple[float, float]:
    """(P(wait), p-th percentile wait in ms) of M/M/c, the wait scaled by (1 + C_v²)/2.

    M/M/c: P(W > t) = C · exp(−(c/S − λ)·t), so the p-th percentile is ln(C / (1 − p/100))
    / (c/S − λ), and 0 when no more than 1 − p/100 of arrivals wait. Allen–Cunneen's
    (1 + C_v²)/2 carries the service-time variability over (an approximation; exact at 1).
    """
    offered = arrival_rate_per_s * hold_s
    waiting = erlang_c(servers, offered)
    if offered >= servers:
        return waiting, math.inf
    miss = 1 - percentile / 100
    if waiting <= miss:
        return waiting, 0.0
    drain = servers / hold_s - arrival_rate_per_s
    return waiting, pk_inflation(service_cv) * math.log(waiting / miss) / drain * 1000


def hold_time_s(prefill_ms: float, output_tokens: float, decode_step_ms: float) -> float:
    """T_hold = t_prefill + N_out × t_decode: how long a request holds a batch slot, in s."""
    return (prefill_ms + output_tokens * decode_step_ms) / 1000


def fleet_slots(arrival_rate_per_s: float, t_hold_s: float, beta: float) -> tuple[float, float]:
    """(a, c): Little's law a = λ·T_hold busy slots, and c = a + β√a with tail headroom."""
    offered = arrival_rate_per_s * t_hold_s
    return offered, offered + beta * math.sqrt(offered)


def replicas_for(slots: float, slots_per_replica: int) -> int:
    """⌈slots / slots per replica⌉ (add the failure spare yourself)."""
    return math.ceil(round(slots / slots_per_replica, 9))


def batch_options(table: DecodeTable, tpot_slo_ms: float) -> tuple[BatchOption, ...]:
    """Each (B, t(B)) as tokens/s = B / t(B) and whether t(B) ≤ TPOT_slo."""
    return tuple(
        BatchOption(
            batch=b, step_ms=ms, tokens_per_s=b / ms * 1000, meets_tpot_slo=ms <= tpot_slo_ms
        )
        for b, ms in table
    )


def goodput_optimum(options: Sequence[BatchOption]) -> BatchOption | None:
    """The TPOT-feasible batch with the most tokens/s (goodput elsewhere is zero), or None."""
    feasible = [o for o in options if o.meets_tpot_slo]
    return max(feasible, key=lambda o: o.tokens_per_s) if feasible else None


def usd_per_million_tokens(usd_per_hour: float, tokens_per_s: float) -> float:
    """$/h over millions of tokens per hour."""
    return usd_per_hour / (tokens_per_s * 3600 / 1e6)


def make_plan(inputs: PlanInputs) -> Plan:
    """Every section of the plan from one set of inputs (validate them first)."""
    i = inputs
    prefill_ms = i.prompt_tokens / i.prefill_tokens_per_s * 1000
    t_hold = hold_time_s(prefill_ms, i.output_tokens, i.decode_step_ms)
    drain = i.drain_rate_per_s if i.drain_rate_per_s is not None else i.slots_per_replica / t_hold
    e2e_ms = prefill_ms + (i.output_tokens - 1) * i.decode_step_ms
    stall = unchunked_stall_ms(i.decode_step_ms, i.long_prompt_tokens, i.prefill_tokens_per_s)
    wait_budget = i.ttft_slo_ms - prefill_ms
    service_ms = 1000 / drain
    rho, bound_by = _utilization(i, wait_budget, e2e_ms, service_ms)
    options = batch_options(i.decode_table, i.tpot_slo_ms)
    best = goodput_optimum(options)
    fleet = _fleet(i, t_hold, _wait_budget(i, wait_budget, e2e_ms), rho * drain)
    return Plan(
        prefill_ms=prefill_ms,
        e2e_unqueued_ms=e2e_ms,
        e2e_meets_slo=e2e_ms <= i.e2e_slo_ms if i.e2e_slo_ms is not None else None,
        chunking=_chunking(i),
        unchunked_stall_ms=stall,
        unchunked_stall_over_tpot_slo=stall / i.tpot_slo_ms,
        unchunked_stall_meets_tpot_slo=stall <= i.tpot_slo_ms,
        stall_mean_share_ms=(stall - i.decode_step_ms) / i.output_tokens,
        t_hold_s=t_hold,
        drain_rate_per_s=drain,
        wait_budget_ms=wait_budget,
        queue_cap=queue_cap(wait_budget, drain),
        queue_cap_requests=math.floor(round(queue_cap(wait_budget, drain), 9)),
        pk_inflation=pk_inflation(i.service_cv),
        tail_factor=tail_factor(i.percentile),
        max_utilization=rho,
        max_utilization_mm1=max_utilization(wait_budget, service_ms, 1.0, i.percentile),
        utilization_bound_by=bound_by,
        max_rate_per_replica_per_s=rho * drain,
        mg1_utilization_matching_mm1_knee=matching_utilization(MM1_KNEE, i.service_cv),
        queue_rows=tuple(queue_row(u, i.service_cv, i.percentile) for u in CHECK_UTILIZATIONS),
        fleet=fleet,
        batch_options=options,
        goodput_optimal_batch=best.batch if best else None,
        goodput_tokens_per_s=best.tokens_per_s if best else None,
        peak_throughput_batch=max(options, key=lambda o: o.tokens_per_s).batch if options else None,
        cost=_cost(i, fleet, best),
    )


def _chunking(i: PlanInputs) -> Chunking:
    chunk = chunk_tokens(i.tpot_slo_ms, i.decode_step_ms, i.prefill_tokens_per_s)
    if chunk == 0:  # decoding alone misses TPOT: no prefill chunk is safe
        return Chunking(chunk_tokens=0)
    steps, ttft = chunked_ttft_ms(i.prompt_tokens, chunk, i.tpot_slo_ms)
    long_steps, long_ttft = chunked_ttft_ms(i.long_prompt_tokens, chunk, i.tpot_slo_ms)
    return Chunking(
        chunk_tokens=chunk,
        chunk_step_ms=i.decode_step_ms + chunk / i.prefill_tokens_per_s * 1000,
        prompt_chunks=steps,
        prompt_ttft_chunked_ms=ttft,
        long_prompt_chunks=long_steps,
        long_prompt_ttft_chunked_ms=long_ttft,
        long_prompt_meets_ttft_slo=long_ttft <= i.ttft_slo_ms,
        max_prompt_tokens_chunked=math.floor(round(i.ttft_slo_ms / i.tpot_slo_ms, 9)) * chunk,
    )


def _utilization(
    i: PlanInputs, wait_budget_ms: float, e2e_ms: float, service_ms: float
) -> tuple[float, str]:
    rho = max_utilization(wait_budget_ms, service_ms, i.service_cv, i.percentile)
    if i.e2e_slo_ms is None:
        return rho, "ttft"
    rho_e2e = max_utilization(i.e2e_slo_ms - e2e_ms, service_ms, i.service_cv, i.percentile)
    return (rho, "ttft") if rho <= rho_e2e else (rho_e2e, "e2e")


def _wait_budget(i: PlanInputs, ttft_budget_ms: float, e2e_ms: float) -> float:
    """The queue wait the SLOs leave: TTFT_slo − t_prefill, and E2E_slo − E2E when given."""
    if i.e2e_slo_ms is None:
        return ttft_budget_ms
    return min(ttft_budget_ms, i.e2e_slo_ms - e2e_ms)


def _fleet(
    i: PlanInputs, t_hold_s: float, budget_ms: float, single_server_rate: float
) -> Fleet | None:
    if i.arrival_rate_per_s is None:
        return None
    lam, slots = i.arrival_rate_per_s, i.slots_per_replica
    offered, headroom = fleet_slots(lam, t_hold_s, i.beta)
    needed = replicas_for(headroom, slots)
    pooled = many_server_wait_ms(needed * slots, lam, t_hold_s, i.service_cv, i.percentile)
    apart = many_server_wait_ms(slots, lam / needed, t_hold_s, i.service_cv, i.percentile)
    return Fleet(
        offered_slots=offered,
        slots_exact=headroom,
        slots=math.ceil(round(headroom, 9)),
        replicas_without_spare=needed,
        replicas=needed + 1,
        replicas_naive=replicas_for(offered, slots),
        slot_utilization=offered / (needed * slots),
        wait_budget_ms=budget_ms,
        pooled_wait_probability=pooled[0],
        pooled_wait_ms=pooled[1],
        per_replica_wait_probability=apart[0],
        per_replica_wait_ms=apart[1],
        replicas_queue_per_replica=_replicas_apart(i, t_hold_s, budget_ms, needed),
        replicas_single_server=(
            math.ceil(round(lam / single_server_rate, 9)) + 1 if single_server_rate > 0 else None
        ),
    )


def _replicas_apart(i: PlanInputs, t_hold_s: float, budget_ms: float, first: int) -> int | None:
    """Fewest replicas, each queueing its own λ/R, whose p-th percentile wait fits the
    budget, plus the spare (a bisection: the wait falls as R grows); None without a budget
    or beyond 1,000× the pooled count."""
    if budget_ms <= 0 or i.arrival_rate_per_s is None:
        return None
    lam, slots = i.arrival_rate_per_s, i.slots_per_replica

    def fits(replicas: int) -> bool:
        wait = many_server_wait_ms(slots, lam / replicas, t_hold_s, i.service_cv, i.percentile)
        return wait[1] <= budget_ms

    low, high = first - 1, 1000 * first  # fits(high), not fits(low) (or low below first)
    if not fits(high):
        return None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return high + 1


def _cost(i: PlanInputs, fleet: Fleet | None, best: BatchOption | None) -> Cost | None:
    if i.gpus_per_replica is None or i.gpu_hour_usd is None:
        return None
    replica_usd = i.gpus_per_replica * i.gpu_hour_usd
    fleet_usd = replica_usd * fleet.replicas if fleet else None
    rate = i.arrival_rate_per_s
    return Cost(
        fleet_usd_per_hour=fleet_usd,
        usd_per_million_tokens=(
            usd_per_million_tokens(fleet_usd, rate * i.output_tokens)
            if fleet_usd is not None and rate is not None
            else None
        ),
        usd_per_million_tokens_at_capacity=(
            usd_per_million_tokens(replica_usd, best.tokens_per_s) if best else None
        ),
    )


# --- inputs: parsing, validation, provenance ----------------------------------------------


def parse_decode_table(text: str, source: str = "command line") -> DecodeTable:
    """`16:20,32:30,64:55` (batch size : step ms) as sorted (B, ms) pairs."""
    pairs: dict[int, float] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        batch, sep, ms = item.partition(":")
        try:
            b, step = int(batch), float(ms)
        except ValueError:
            b, step = 0, 0.0
        if not sep or b < 1 or not step > 0 or not math.isfinite(step) or b in pairs:
            problem = f"{item!r} is not a new B:MS pair with B ≥ 1 and MS > 0"
            raise ConfigError(source, "--decode-table", problem, "e.g. 16:20,32:30,64:55")
        pairs[b] = step
    if not pairs:
        raise ConfigError(source, "--decode-table", "is empty", "e.g. 16:20,32:30,64:55")
    return tuple(sorted(pairs.items()))


# flag name -> (PlanInputs field, must be > 0, lower bound allowed equal)
_POSITIVE = (
    "prefill_tokens_per_s", "decode_step_ms", "slots_per_replica", "ttft_slo_ms", "tpot_slo_ms",
    "prompt_tokens", "long_prompt_tokens", "output_tokens", "e2e_slo_ms", "arrival_rate_per_s",
    "drain_rate_per_s", "gpus_per_replica",
)  # fmt: skip


def validate(inputs: PlanInputs, sources: Mapping[str, str]) -> None:
    """A ConfigError naming the input, its origin and a fix when a value cannot be planned with."""
    for name in _POSITIVE:
        value = getattr(inputs, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            _bad(name, sources, f"must be a finite number > 0 (got {value:g})")
    for name, ok in (
        ("service_cv", inputs.service_cv >= 0),
        ("beta", inputs.beta >= 0),
        ("gpu_hour_usd", inputs.gpu_hour_usd is None or inputs.gpu_hour_usd >= 0),
        ("percentile", 0 < inputs.percentile < 100),
    ):
        if not ok:
            _bad(name, sources, f"is out of range (got {getattr(inputs, name):g})")
    if inputs.output_tokens < 1:
        _bad("output_tokens", sources, f"must be ≥ 1 (got {inputs.output_tokens:g})")
    if (inputs.gpus_per_replica is None) != (inputs.gpu_hour_usd is None):
        raise OptionError("--gpus-per-replica/--gpu-hour-usd",
                          "a cost needs both", "give both, or neither")  # fmt: skip


def _bad(name: str, sources: Mapping[str, str], problem: str) -> None:
    source = sources.get(name, "command line")
    fix = "correct the flag" if source.startswith("assumed") else f"override it with {flag(name)}"
    raise ConfigError(source, flag(name), problem, fix)


def flag(name: str) -> str:
    """The command-line flag of a PlanInputs field."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


FLAGS = {"arrival_rate_per_s": "--arrival-rate", "drain_rate_per_s": "--drain-rate",
         "service_cv": "--service-cv"}  # fmt: skip
REQUIRED = (
    "prefill_tokens_per_s", "decode_step_ms", "slots_per_replica", "ttft_slo_ms", "tpot_slo_ms",
    "prompt_tokens", "output_tokens",
)  # fmt: skip


def resolve(
    given: Mapping[str, float | None],
    layers: Sequence[tuple[Mapping[str, float | None], str]] = (),
    decode_table: DecodeTable = (),
    *,
    unmeasured: Mapping[str, str] | None = None,
    from_run: bool = False,
) -> tuple[PlanInputs, dict[str, str]]:
    """Merge flags over each layer (in order) over defaults; each input's source beside it.

    A layer is (values, label), e.g. (measured, "measured (from RUN)"). Sources read
    `assumed (--flag)`, a layer's label, or `default (...)`. A required input found nowhere
    is a ConfigError naming its flag and why it is missing: `unmeasured` holds the runs'
    reasons (`Measured.unmeasured`), `from_run` whether runs were read at all.
    """
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    for name in INPUT_NAMES:
        value = given.get(name)
        if value is not None:
            values[name], sources[name] = float(value), f"assumed ({flag(name)})"
            continue
        for layer, label in layers:
            value = layer.get(name)
            if value is not None:
                values[name], sources[name] = float(value), label
                break
    _fill_defaults(values, sources, decode_table)
    missing = [n for n in REQUIRED if n not in values]
    if missing:
        raise missing_inputs(missing, unmeasured or {}, from_run=from_run)
    slots = values.pop("slots_per_replica")
    if not slots.is_integer():
        _bad("slots_per_replica", sources, f"must be a whole number (got {slots:g})")
    if decode_table:
        sources["decode_table"] = "assumed (--decode-table)"
    inputs = PlanInputs(**values, slots_per_replica=int(slots), decode_table=decode_table)
    return inputs, sources


INPUT_NAMES = tuple(f.name for f in fields(PlanInputs) if f.name != "decode_table")
NOT_MEASURABLE = {
    "slots_per_replica": "not given, and no run can measure it: it is the server's batch-slot "
    "limit (vLLM --max-num-seqs, TGI --max-batch-size; read from run.json only for the "
    "built-in simulator)",
}


def missing_inputs(
    missing: Sequence[str], unmeasured: Mapping[str, str], *, from_run: bool
) -> ConfigError:
    """The error for required inputs found nowhere: each with its reason, and a fix that
    suggests --from-run only for inputs a run could measure, and only when none was given."""
    reasons = []
    for name in missing:
        if name in NOT_MEASURABLE:
            why = NOT_MEASURABLE[name]
        elif name in unmeasured:
            why = unmeasured[name]
        else:
            why = "not given, and the runs do not show it" if from_run else "not given"
        reasons.append(f"{flag(name)}: {why}")
    fix = "give " + ", ".join(flag(n) for n in missing)
    measurable = [flag(n) for n in missing if n not in NOT_MEASURABLE]
    if measurable and not from_run:
        fix += f", or --from-run RUN_DIR for {', '.join(measurable)}"
    return OptionError("", "; ".join(reasons), fix)


def _fill_defaults(values: dict[str, float], sources: dict[str, str], table: DecodeTable) -> None:
    for name, value in DEFAULTS.items():
        if name not in values:
            values[name], sources[name] = value, "default"
    if "long_prompt_tokens" not in values and "prompt_tokens" in values:
        values["long_prompt_tokens"] = values["prompt_tokens"]
        sources["long_prompt_tokens"] = "default (= --prompt-tokens)"
    best = goodput_optimum(batch_options(table, values.get("tpot_slo_ms", math.inf)))
    if "slots_per_replica" not in values and best is not None:
        values["slots_per_replica"] = best.batch
        sources["slots_per_replica"] = "default (goodput-optimal batch of --decode-table)"
    if "drain_rate_per_s" not in values:
        sources["drain_rate_per_s"] = "default (slots per replica / T_hold)"


# --- estimation from measured runs --------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """Parameters read off ok requests' records; None when the records cannot tell, and then
    `unmeasured` says why (by PlanInputs field)."""

    requests: int
    prefill_tokens_per_s: float | None = None
    ttft_overhead_ms: float | None = None  # the fit's intercept: TTFT from send at 0 tokens
    decode_step_ms: float | None = None  # prefill-free step (see `decode_source`)
    decode_source: str | None = None  # how decode_step_ms was measured
    decode_batch: float | None = None  # the batch (sequences decoding) it was measured at
    decode_steps_by_batch: tuple[tuple[int, float], ...] = ()  # (batch, floor ms) measured
    tpot_p50_ms: float | None = None  # median TPOT: prefill chunks of others included
    decode_concurrency: float | None = None  # mean requests in flight (Little's law)
    service_cv: float | None = None  # CV of E2E from send
    prompt_tokens: float | None = None  # p50
    long_prompt_tokens: float | None = None  # max
    output_tokens: float | None = None  # mean: Little's law needs E[T_hold]
    output_tokens_p50: float | None = None
    output_tokens_max: float | None = None
    unmeasured: tuple[tuple[str, str], ...] = ()  # (PlanInputs field, why it is None)

    def as_inputs(self) -> dict[str, float | None]:
        """The fields that are also PlanInputs fields."""
        names = {f.name for f in fields(PlanInputs)}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in names}


def estimate(frames: Sequence[pl.DataFrame], class_name: str | None = None) -> Measured:
    """Estimate serving parameters from records frames (one per run), optionally one class.

    Prefill rate: slope of a lower-envelope fit of TTFT from send against prompt tokens
    (`lower_envelope_fit`), so queueing, which only ever adds time, is cut away; rate =
    1000 / slope (ms per token). Decode step: the lower envelope of ITL (`decode_floor`):
    a step that also prefills someone's chunk is longer, so the floor of the gaps is the
    decode step alone, taken at the batch the run mostly decoded at. Median TPOT (prefill
    chunks included) is kept beside it. Service CV: pstdev / mean of E2E from send. Prompt
    tokens: p50 and max (server-reported, else planned); output tokens: mean (with p50 and
    max for display).
    """
    ok = [_ok_rows(f, class_name) for f in frames]
    rows = pl.concat(ok) if ok else pl.DataFrame()
    if rows.height == 0:
        return Measured(requests=0)
    prompt = rows.get_column("prompt").cast(pl.Float64)
    fit = _prefill_fit(rows)
    tpot = rows.get_column("tpot_ms").drop_nulls()
    e2e = rows.get_column("e2e_from_send_ms").drop_nulls().to_list()
    out = rows.get_column("output_tokens").cast(pl.Float64)
    busy, span = (sum(t) for t in zip(*(_busy_span(f, class_name) for f in frames), strict=True))
    floor = decode_floor(frames, class_name)
    unmeasured = [("prefill_tokens_per_s", why) for why in [_prefill_why(prompt, fit)] if why]
    if floor is None:
        unmeasured.append(("decode_step_ms", "no ok request streamed two chunks or more"))
    return Measured(
        requests=rows.height,
        prefill_tokens_per_s=1000 / fit[0] if fit and fit[0] > 0 else None,
        ttft_overhead_ms=fit[1] if fit and fit[0] > 0 else None,
        decode_step_ms=floor.step_ms if floor else None,
        decode_source=floor.source if floor else None,
        decode_batch=floor.batch if floor else None,
        decode_steps_by_batch=floor.by_batch if floor else (),
        tpot_p50_ms=percentiles(tpot, (50.0,))[0],
        decode_concurrency=busy / span if span > 0 else None,
        service_cv=statistics.pstdev(e2e) / statistics.fmean(e2e) if len(e2e) > 1 else None,
        prompt_tokens=percentiles(prompt, (50.0,))[0],
        long_prompt_tokens=percentiles(prompt, (100.0,))[0],
        output_tokens=statistics.fmean(out.to_list()),
        output_tokens_p50=percentiles(out, (50.0,))[0],
        output_tokens_max=percentiles(out, (100.0,))[0],
        unmeasured=tuple(unmeasured),
    )


def _prefill_why(prompt: pl.Series, fit: tuple[float, float] | None) -> str | None:
    """Why the prefill fit gave no rate, or None when it did."""
    if prompt.n_unique() < 2:
        return (
            f"every prompt has the same length ({prompt[0]:,.0f} tokens): the prefill rate "
            "cannot be fitted"
        )
    if fit is None or fit[0] <= 0:
        return "TTFT does not grow with prompt length in these runs: no prefill rate to fit"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeFloor:
    """The prefill-free decode step read off the inter-token gaps."""

    step_ms: float  # the floor at the batch most steps ran at (step-weighted median)
    batch: float  # that batch: sequences decoding, counted from the records
    by_batch: tuple[tuple[int, float], ...]  # every batch with enough gaps: its floor (ms)
    steps: int  # server steps observed
    source: str


def decode_floor(frames: Sequence[pl.DataFrame], class_name: str | None) -> DecodeFloor | None:
    """The lower envelope of ITL: the decode step without any prefill chunk in it.

    Every gap between two chunks of an ok request is one decode step of the server's batch
    (per token, when a chunk carries several), plus whatever prompt chunk that step also
    prefilled for another request (chunked prefill), which only ever adds time. The gaps
    of one step (every request decoding in it sees it) count once (`_steps`), tagged with
    the batch decoding in it: the requests of the same run (every class: they share the
    server) between their first and last token at the gap's middle. Per batch with at
    least FLOOR_MIN_STEPS steps, the floor is the centre of its lowest cluster of steps
    (`_floor`; it assumes at least ENVELOPE_PERCENTILE % of them prefilled nothing), and no
    larger than any larger batch's floor (`_non_decreasing`); the decode step is the
    step-weighted median of those floors, at its batch. None without gaps.
    """
    pooled = _pooled_gaps(frames, class_name)
    if not pooled:
        return None
    by_batch = {b: _floor(g) for b, g in pooled.items() if len(g) >= FLOOR_MIN_STEPS}
    weights = {b: len(pooled[b]) for b in by_batch}
    if not by_batch:  # too few steps for any batch alone: one floor over them all
        every = [gap for g in pooled.values() for gap in g]
        batch = round(_percentile([b for b, g in pooled.items() for _ in g], 50.0))
        by_batch, weights = {batch: _floor(every)}, {batch: len(every)}
    by_batch = _non_decreasing(by_batch)
    step, at = _weighted_median([(floor, weights[b], b) for b, floor in by_batch.items()])
    return DecodeFloor(
        step_ms=step,
        batch=float(at),
        by_batch=tuple(sorted(by_batch.items())),
        steps=sum(len(g) for g in pooled.values()),
        source="lower envelope of ITL (gaps without a prefill chunk)",
    )


def _non_decreasing(floors: dict[int, float]) -> dict[int, float]:
    """Each batch's floor lowered to the lowest floor of any larger batch: a step never gets
    faster with more sequences, so a floor above a larger batch's is a batch whose steps
    mostly carried a prefill chunk (more than 1 − ENVELOPE_PERCENTILE % of them)."""
    lowest = math.inf
    out: dict[int, float] = {}
    for batch in sorted(floors, reverse=True):
        lowest = min(lowest, floors[batch])
        out[batch] = lowest
    return dict(sorted(out.items()))


def _weighted_median(items: Sequence[tuple[float, int, int]]) -> tuple[float, int]:
    """(value, tag) at the weighted median of (value, weight, tag) items."""
    ordered = sorted(items)
    total = sum(w for _, w, _ in ordered)
    running = 0
    for value, weight, tag in ordered:
        running += weight
        if running * 2 >= total:
            return value, tag
    return ordered[-1][0], ordered[-1][2]


FLOOR_MIN_STEPS = 20  # steps a batch size needs for a floor of its own
FLOOR_WINDOW = 3.0  # half-width of the floor's window, in lower-tail spreads


def _floor(gaps: Sequence[float]) -> float:
    """The centre of the lowest cluster of gaps: the steps that prefilled nothing.

    Start at the lower envelope (the median of the gaps at or below their
    ENVELOPE_PERCENTILE-th percentile), which the stamps' noise pulls low; then move to the
    median of the gaps within ±FLOOR_WINDOW × the lower tail's spread (envelope − 2nd
    percentile) until it stays put. Noise is two-sided (a late stamp lengthens one gap and
    shortens the next), prefill one-sided and further off, so this settles on the steps
    without a chunk, as far from a chunk's cluster as the noise allows.
    """
    ordered = np.sort(np.asarray(gaps, dtype=np.float64))
    centre = _location(ordered[ordered <= _percentile(ordered, ENVELOPE_PERCENTILE)])
    half = FLOOR_WINDOW * max(centre - _percentile(ordered, 2.0), 1e-6)
    for _ in range(50):
        window = ordered[(ordered >= centre - half) & (ordered <= centre + half)]
        moved = _location(window)
        if abs(moved - centre) <= 1e-9:
            break
        centre = moved
    return centre


def _pooled_gaps(frames: Sequence[pl.DataFrame], class_name: str | None) -> dict[int, list[float]]:
    pooled: dict[int, list[float]] = {}
    for frame in frames:
        for batch, gaps in _gaps_by_batch(frame, class_name).items():
            pooled.setdefault(batch, []).extend(gaps)
    return pooled


def _distinct_reads(chunks: Sequence[int], tokens: Sequence[int] | None) -> tuple[Any, Any]:
    """Chunks with the same stamp merged, their tokens summed: chunks read together (the
    client fell a token gap behind) carry one time, so the gap before them spans them all
    and the gap between them (0) is no step at all."""
    times = np.asarray(chunks, dtype=np.int64)
    counts = np.asarray(tokens, dtype=np.float64) if tokens else np.ones(len(times))
    last = np.append(np.diff(times) > 0, True)  # the last chunk of each run of equal stamps
    run = np.concatenate([[0], np.cumsum(last)[:-1]])  # run index of every chunk
    return times[last], np.bincount(run, weights=counts)


def _gaps_by_batch(frame: pl.DataFrame, class_name: str | None) -> dict[int, list[float]]:
    """Per-token ITL gaps (ms) of ok requests (of `class_name`), one per server step, by the
    decoding batch in each: the ok requests of the run between their first and last token
    at the gap's middle (tokens come at step ends, so mid-step the count is the step's
    batch, whatever the stamps' jitter at the ends)."""
    ok = frame.filter(
        (pl.col("outcome") == Outcome.OK.value) & pl.col("first_token_ns").is_not_null()
    )
    if ok.height == 0:
        return {}
    first = np.sort(ok["first_token_ns"].to_numpy())
    last = np.sort(ok.select(pl.coalesce("last_token_ns", "first_token_ns")).to_series().to_numpy())
    mine = ok if class_name is None else ok.filter(pl.col("class") == class_name)
    ends: list[np.ndarray] = []
    gaps: list[np.ndarray] = []
    for chunks, tokens in zip(mine["chunk_ns"].to_list(), mine["chunk_tokens"].to_list(),
                              strict=True):  # fmt: skip
        if chunks is None or len(chunks) < 2:
            continue
        times, per = _distinct_reads(chunks, tokens)
        if len(times) < 2:
            continue
        ends.append(times[1:])
        gaps.append(np.diff(times) / 1e6 / np.maximum(per[1:], 1))
    if not gaps:
        return {}
    end = np.concatenate(ends)
    value = np.concatenate(gaps)
    mid = end - (value * 1e6 / 2).astype(np.int64)  # mid-gap: no one's token is due
    batch = np.searchsorted(first, mid, side="right") - np.searchsorted(last, mid, side="right")
    out: dict[int, list[float]] = {}
    for step_batch, step_gap in _steps(end, value, batch):
        out.setdefault(step_batch, []).append(step_gap)
    return out


STEP_MATCH = 0.05  # gaps ending within this share of a gap of each other end one step


def _steps(end: Any, gap: Any, batch: Any) -> list[tuple[int, float]]:
    """One (batch, gap) per server step: every request decoding in a step sees the same gap
    end at about the same time, so gaps whose ends lie within STEP_MATCH of a gap of the
    first are one observation (their median), not B of them."""
    order = np.argsort(end, kind="stable")
    end, gap, batch = end[order], gap[order], batch[order]
    steps: list[tuple[int, float]] = []
    start = 0
    for i in range(1, len(end) + 1):
        if i == len(end) or end[i] - end[start] > STEP_MATCH * gap[start] * 1e6:
            steps.append((int(_location(batch[start:i])), _location(gap[start:i])))
            start = i
    return steps


def _ok_rows(frame: pl.DataFrame, class_name: str | None) -> pl.DataFrame:
    """ok requests' prompt tokens, TTFT from send, TPOT, E2E from send and output tokens."""
    if class_name is not None:
        frame = frame.filter(pl.col("class") == class_name)
    measures = derive(frame).select("ttft_from_send_ms", "tpot_ms", "output_tokens")
    end_ns = pl.coalesce("last_token_ns", "end_ns") - pl.col("sent_ns")
    extra = frame.select(
        pl.coalesce("prompt_tokens", "prompt_tokens_target").alias("prompt"),
        (end_ns.cast(pl.Float64) / 1e6).alias("e2e_from_send_ms"),
        (pl.col("outcome") == Outcome.OK.value).alias("is_ok"),
    )
    rows = pl.concat([measures, extra], how="horizontal")
    return rows.filter(pl.col("is_ok") & pl.col("ttft_from_send_ms").is_not_null()).drop("is_ok")


def _busy_span(frame: pl.DataFrame, class_name: str | None) -> tuple[float, float]:
    """(Σ time in flight, first send → last end) in ns over every sent request of a run."""
    if class_name is not None:
        frame = frame.filter(pl.col("class") == class_name)
    times = frame.select(
        pl.col("sent_ns").alias("start"), pl.coalesce("end_ns", "last_token_ns").alias("end")
    ).drop_nulls()
    if times.height == 0:
        return 0.0, 0.0
    start, end = times.get_column("start"), times.get_column("end")
    span = times.select(pl.col("end").max() - pl.col("start").min()).item()
    return float((end - start).sum()), float(span)


def _prefill_fit(rows: pl.DataFrame) -> tuple[float, float] | None:
    x = rows.get_column("prompt").cast(pl.Float64).to_list()
    y = rows.get_column("ttft_from_send_ms").to_list()
    return lower_envelope_fit(x, y)


def lower_envelope_fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float] | None:
    """(slope, intercept) of the line under the cloud: a cheap low-quantile regression.

    Fit least squares, keep the points whose residual is at or below the 20th percentile of
    the residuals, refit; repeat a few times. Points that only ever gained time (queued
    behind others) drop out, the unqueued floor remains. None when x does not vary.
    """
    xs, ys = list(x), list(y)
    if len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, ys)
    for _ in range(ENVELOPE_ROUNDS):
        residuals = [b - (slope * a + intercept) for a, b in zip(xs, ys, strict=True)]
        cut = _percentile(residuals, ENVELOPE_PERCENTILE)
        kept = [(a, b) for a, b, r in zip(xs, ys, residuals, strict=True) if r <= cut]
        if len({a for a, _ in kept}) < 2 or len(kept) == len(xs):
            break
        xs, ys = [a for a, _ in kept], [b for _, b in kept]
        slope, intercept = statistics.linear_regression(xs, ys)
    return slope, intercept


def _location(values: Any) -> float:
    """The centre of a cluster of values: their median, the mean of the two middle ones
    for an even count. A location estimate, not a reported percentile: the iterations of
    `_floor` recentre on it, and the lower of the two middle values would walk them down."""
    return float(np.median(values))


def _percentile(values: Sequence[float] | Any, percentile: float) -> float:
    """The nearest-rank percentile of a non-empty list or array (`loadgen.percentiles`)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    return float(ordered[nearest_rank(percentile, len(ordered)) - 1])


# --- inputs from run folders --------------------------------------------------------------

Layer = tuple[Mapping[str, float | None], str]  # (values, where they came from): see `resolve`


def from_runs(
    frames: Sequence[pl.DataFrame],
    infos: Sequence[RunInfo],
    *,
    class_name: str | None,
    given: Mapping[str, float | None],
    source: str,
) -> tuple[Measured, list[Layer]]:
    """Estimates from runs' records and the SLOs their run.json recorded, as `resolve`
    layers: the decode step first, then the other estimates, the recorded SLOs, and the
    built-in simulator's batch slots. `source` names the runs in labels and errors."""
    measured = estimate(frames, class_name)
    if measured.requests == 0:
        which = f"of class {class_name!r} " if class_name else ""
        raise ConfigError(source, "records", f"hold no ok request {which}with a first token",
                          "plan from a run that served requests, or give the flags")  # fmt: skip
    estimates = measured.as_inputs()
    decode = estimates.pop("decode_step_ms", None)
    layers: list[Layer] = [
        (estimates, f"measured (from {source})"),
        (recorded_slos(infos, class_name, given, source), f"recorded SLO (from {source})"),
    ]
    if decode is not None:
        at = f" at batch {measured.decode_batch:g}" if measured.decode_batch else ""
        layers.insert(0, ({"decode_step_ms": decode},
                          f"measured: {measured.decode_source}{at} (from {source})"))  # fmt: skip
    slots = simulator_slots(infos)
    if slots is not None:
        label = f"configured (the built-in simulator's --max-batch, from {source})"
        layers.append(({"slots_per_replica": float(slots)}, label))
    return measured, layers


def recorded_slos(
    infos: Sequence[RunInfo],
    class_name: str | None,
    given: Mapping[str, float | None],
    source: str,
) -> dict[str, float | None]:
    """The runs' recorded SLO targets (of `class_name`, or every class) as plan inputs; a
    ConfigError where classes or runs disagree on one that no flag gives."""
    slos: dict[str, set[float]] = {}
    for info in infos:
        for name, slo in info.slos().items():
            if class_name is None or name == class_name:
                for key, value in asdict(slo).items():
                    if value is not None:
                        slos.setdefault(key, set()).add(float(value))
    recorded: dict[str, float | None] = {}
    for key, values in slos.items():
        field = key.replace("_ms", "_slo_ms") if key != "percentile" else key
        if len(values) > 1 and given.get(field) is None:
            raise ConfigError(source, f"slo.{key}", f"classes or runs disagree ({sorted(values)})",
                              "choose one with --class or the flag")  # fmt: skip
        recorded[field] = min(values)
    return recorded


def simulator_slots(infos: Sequence[RunInfo]) -> int | None:
    """The built-in simulator's --max-batch when every run used it with the same one."""

    found: set[int] = set()
    for info in infos:
        if info.target is None or not info.target.builtin_sim:
            return None
        args = [str(a) for a in info.target.sim_args or ()]
        value = args[args.index("--max-batch") + 1] if "--max-batch" in args[:-1] else None
        try:
            found.add(int(value) if value is not None else EngineConfig().max_batch)
        except ValueError:
            return None
    return found.pop() if len(found) == 1 else None


# --- the plan as JSON ---------------------------------------------------------------------

SECTIONS: dict[str, type] = {"chunking": Chunking, "fleet": Fleet, "cost": Cost}


def to_json(
    inputs: PlanInputs,
    sources: Mapping[str, str],
    result: Plan,
    measured: Measured | None,
    notes: Sequence[str],
) -> dict[str, Any]:
    """The plan flat (sections' fields at the top, null when a section is absent), inputs beside."""
    flat: dict[str, Any] = {}
    for f in fields(result):
        value = getattr(result, f.name)
        if f.name in SECTIONS:
            names = [g.name for g in fields(SECTIONS[f.name])]
            flat.update(asdict(value) if value else dict.fromkeys(names))
        elif isinstance(value, tuple):
            flat[f.name] = [asdict(v) for v in value]
        else:
            flat[f.name] = value
    values = asdict(inputs)
    values["decode_table"] = [list(pair) for pair in inputs.decode_table] or None
    return {
        **flat,
        "inputs": {k: {"value": values[k], "source": sources.get(k)} for k in values},
        "measured": asdict(measured) if measured else None,
        "notes": list(notes),
    }
