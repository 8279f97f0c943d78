"""A capacity plan's inputs and its numbers (`loadgen plan`): plain values.

`loadgen.studies.planner` resolves the inputs and does the arithmetic (see there for
every formula); `loadgen.render.planner_view` draws the result.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    price_per_hour: float | None = None  # one replica's, as `run --price-per-hour`


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
    """Per hour and per million SLO-meeting output tokens, in the currency of
    `--price-per-hour` (as `run`'s cost)."""

    fleet_per_hour: float | None  # replicas × price per replica-hour (needs an arrival rate)
    per_million_tokens: float | None  # at λ·N_out tokens/s
    per_million_tokens_at_capacity: float | None  # one replica at its goodput optimum


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
