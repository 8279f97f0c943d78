"""Capacity planning: the serving arithmetic, from SLOs and a few serving parameters.

Sits beside the audit, after the records: `estimate` (`loadgen.analysis.estimates`) reads
parameters off measured runs' records, `from_runs` adds what their `run.json` recorded,
`resolve` merges them with command-line values and defaults (labelling where each came
from), and `make_plan` does the arithmetic; `to_json` is the plan for machines. Pure functions; no
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
  taken as ln(100)·W_q (the exponential multiplier; optimistic for heavy-tailed
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
- cost: replicas × the price of a replica-hour over the SLO-meeting output tokens per hour
  (λ·N), in the currency of `--price-per-hour`.

The p99 of the queue model is the exponential's, ln(100)·W_q, not a sample percentile
(every percentile read off records is nearest rank: `loadgen.analysis.estimates`). The
plan's types are `loadgen.analysis.planning`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any

import polars as pl

from loadgen.analysis.estimates import Measured, estimate
from loadgen.analysis.planning import (
    BatchOption,
    Chunking,
    Cost,
    DecodeTable,
    Fleet,
    Plan,
    PlanInputs,
    QueueRow,
)
from loadgen.errors import ConfigError, OptionError
from loadgen.results.runfolder import RunInfo
from loadgen.sim.engine import EngineConfig

CHECK_UTILIZATIONS: tuple[float, ...] = (0.5, 0.7, 0.9, 0.95)
MM1_KNEE = 0.8  # the seed: "a fleet you would run at 0.8 under exponential assumptions"
DEFAULTS: dict[str, float] = {"service_cv": 1.0, "beta": 2.0, "percentile": 99.0}


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
    """The M/M/1 table row for ρ (mean and tail sojourn over S) and the M/G/1 mean."""
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


def per_million_tokens(per_hour: float, tokens_per_s: float) -> float:
    """A price per hour over millions of tokens per hour."""
    return per_hour / (tokens_per_s * 3600 / 1e6)


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
    replica = i.price_per_hour
    if replica is None:
        return None
    fleet_price = replica * fleet.replicas if fleet else None
    rate = i.arrival_rate_per_s
    return Cost(
        fleet_per_hour=fleet_price,
        per_million_tokens=(
            per_million_tokens(fleet_price, rate * i.output_tokens)
            if fleet_price is not None and rate is not None
            else None
        ),
        per_million_tokens_at_capacity=(
            per_million_tokens(replica, best.tokens_per_s) if best else None
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
    "drain_rate_per_s", "price_per_hour",
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
        ("percentile", 0 < inputs.percentile < 100),
    ):
        if not ok:
            _bad(name, sources, f"is out of range (got {getattr(inputs, name):g})")
    if inputs.output_tokens < 1:
        _bad("output_tokens", sources, f"must be ≥ 1 (got {inputs.output_tokens:g})")


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
