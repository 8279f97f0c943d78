"""`loadgen plan` for people: the inputs with their sources, the plan with every formula,
and the notes a reader should not miss (infeasible SLOs, optimistic assumptions).

Pure functions of `analysis.planning`'s `PlanInputs` and `Plan`, and of
`analysis.estimates`'s `Measured`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from rich.console import Group, RenderableType
from rich.table import Table

from loadgen.analysis.estimates import Measured
from loadgen.analysis.planning import Plan, PlanInputs


def render_plan(
    inputs: PlanInputs,
    sources: Mapping[str, str],
    result: Plan,
    measured: Measured | None,
    notes: Sequence[str],
) -> RenderableType:
    """The inputs table, the decode step by batch (when measured), the plan table, the notes."""
    parts: list[RenderableType] = [inputs_table(inputs, sources, measured)]
    if measured and measured.decode_steps_by_batch:
        by_batch = steps_text(measured.decode_steps_by_batch)
        parts.append(f"decode step by decoding batch (lower envelope of ITL): {by_batch}")
    parts.append(plan_table(inputs, result))
    parts.extend(f"note: {note}" for note in notes)
    return Group(*parts)


def plan_notes(inputs: PlanInputs, result: Plan, measured: Measured | None) -> list[str]:
    """What the reader should not miss: infeasible SLOs and optimistic assumptions."""
    notes = []
    chunk = result.chunking
    if chunk.chunk_tokens == 0:
        notes.append("the decode step alone exceeds the TPOT SLO: no prefill chunk is safe")
    elif chunk.long_prompt_meets_ttft_slo is False:
        notes.append(
            f"chunking converts the TPOT problem into a TTFT one: prompts over "
            f"{chunk.max_prompt_tokens_chunked} tokens miss the TTFT SLO even unqueued "
            "(cap prompt length, relax an SLO, or disaggregate prefill)"
        )
    if result.queue_cap < 1:
        notes.append(
            "the typical prompt leaves less than one request's wait in the TTFT "
            "budget: any queueing misses"
        )
    if result.fleet:
        notes.append(fleet_note(inputs, result))
    best = result.goodput_optimal_batch
    if best is not None and inputs.slots_per_replica > best:
        notes.append(
            f"{inputs.slots_per_replica} slots per replica exceeds the goodput-optimal "
            f"batch {best}: at full batch the TPOT SLO is missed"
        )
    batch = measured.decode_batch if measured else None
    if batch is not None and batch < inputs.slots_per_replica:
        notes.append(
            f"the decode step was measured at a batch of {batch:g} decoding, below "
            f"{inputs.slots_per_replica} slots: at a full batch it may be longer, and T_hold "
            "with it (give --decode-step-ms at the planned batch, or --decode-table)"
        )
    tpot = measured.tpot_p50_ms if measured else None
    if measured and measured.decode_step_ms and tpot and tpot > 1.2 * measured.decode_step_ms:
        notes.append(
            f"median TPOT ({tpot:.3g} ms) is {tpot / measured.decode_step_ms:.1f}× the "
            f"prefill-free step ({measured.decode_step_ms:.3g} ms): other requests' prefill "
            "chunks lengthened the steps these requests decoded in"
        )
    return notes


def fleet_note(inputs: PlanInputs, result: Plan) -> str:
    """Why the fleet's replicas and the single-server figures differ: different quantities."""
    f = result.fleet
    assert f is not None
    apart = f.replicas_queue_per_replica
    apart_text = f"{apart} replicas" if apart is not None else "no replica count"
    single = f.replicas_single_server
    return (
        f"the {f.replicas} replicas hold when ONE queue feeds every slot of the fleet (a router "
        f"that dispatches to any free slot): {f.slot_utilization:.3f} of the batch slots busy, "
        f"p{inputs.percentile:g} queue wait {_wait(f.pooled_wait_ms)}; with a queue per replica "
        f"(a balancer spreading requests over replicas) the p{inputs.percentile:g} wait at "
        f"{f.replicas_without_spare} is {_wait(f.per_replica_wait_ms)} and {apart_text} keep it "
        f"in the {f.wait_budget_ms:,.0f} ms budget. The single-server ρ_max "
        f"{result.max_utilization:.3f} and {_num(result.max_rate_per_replica_per_s, ' req/s')} "
        f"per replica are another quantity: a replica seen as one server of S = 1/μ, which "
        f"would ask for {single if single is not None else '—'} replicas; pessimistic, as a "
        "replica with a free slot queues nothing"
    )


def inputs_table(
    inputs: PlanInputs, sources: Mapping[str, str], measured: Measured | None
) -> Table:
    """Each input's value with its unit and where it came from."""
    table = Table(title="Inputs", title_justify="left")
    for header in ("input", "value", "source"):
        table.add_column(header, justify="right" if header == "value" else "left")
    for name, value in dataclasses.asdict(inputs).items():
        if name == "decode_table":
            shown = ", ".join(f"{b}: {ms:g} ms" for b, ms in inputs.decode_table) or "—"
        else:
            shown = _num(value, _UNITS.get(name, ""))
        table.add_row(name, shown, sources.get(name, "not given"))
    if measured:
        table.add_row("(requests measured)", str(measured.requests), "ok, with a first token")
        table.add_row(
            "(TTFT overhead at 0 tokens)",
            _num(measured.ttft_overhead_ms, " ms"),
            "intercept of the prefill fit",
        )
        table.add_row(
            "(mean in flight)", _num(measured.decode_concurrency), "Σ time in flight / span"
        )
        table.add_row(
            "(TPOT p50)",
            _num(measured.tpot_p50_ms, " ms"),
            "median request TPOT: others' prefill chunks included",
        )

    return table


def plan_table(inputs: PlanInputs, result: Plan) -> Table:
    """Every number with its unit and the formula it came from."""
    table = Table(title="Plan", title_justify="left")
    for header in ("quantity", "value", "formula"):
        table.add_column(header, justify="right" if header == "value" else "left")
    for row in _plan_rows(inputs, result):
        table.add_row(*row) if row else table.add_section()
    return table


def _plan_rows(i: PlanInputs, r: Plan) -> list[tuple[str, str, str] | None]:
    c = r.chunking
    rows: list[tuple[str, str, str] | None] = [
        ("prefill, typical prompt", _num(r.prefill_ms, " ms"), "P / prefill rate"),
        ("E2E, unqueued", _num(r.e2e_unqueued_ms, " ms"), "t_prefill + (N_out − 1) × t_decode"),
        None,
        (
            "safe prefill chunk C",
            _num(c.chunk_tokens, " tokens"),
            "⌊(TPOT_slo − t_decode) × prefill rate⌋",
        ),
        ("chunked step", _num(c.chunk_step_ms, " ms"), "t_decode + C / prefill rate ≤ TPOT_slo"),
        (
            "TTFT, typical prompt chunked",
            _ttft(c.prompt_chunks, c.prompt_ttft_chunked_ms),
            "⌈P / C⌉ × TPOT_slo",
        ),
        (
            "TTFT, long prompt chunked",
            _ttft(c.long_prompt_chunks, c.long_prompt_ttft_chunked_ms)
            + _verdict(c.long_prompt_meets_ttft_slo, i.ttft_slo_ms),
            "⌈P_long / C⌉ × TPOT_slo",
        ),
        (
            "longest prompt inside TTFT",
            _num(c.max_prompt_tokens_chunked, " tokens"),
            "⌊TTFT_slo / TPOT_slo⌋ × C",
        ),
        (
            "unchunked long-prompt stall",
            _num(r.unchunked_stall_ms, " ms")
            + _verdict(r.unchunked_stall_meets_tpot_slo, i.tpot_slo_ms)
            + f" ({r.unchunked_stall_over_tpot_slo:.1f}×)",
            "t_decode + P_long / prefill rate",
        ),
        ("  …its share of mean TPOT", _num(r.stall_mean_share_ms, " ms"), "(P_long / r) / N_out"),
        None,
        ("drain rate μ", _num(r.drain_rate_per_s, " req/s"), "given, else slots / T_hold"),
        ("wait budget", _num(r.wait_budget_ms, " ms"), "TTFT_slo − t_prefill"),
        (
            "queue-depth cap",
            f"{r.queue_cap:.3f} → admit {r.queue_cap_requests} waiting",
            "⌊(TTFT_slo − t_prefill) × μ⌋",
        ),
        None,
        ("P–K wait inflation", f"{r.pk_inflation:.3g}×", "(1 + C_v²) / 2"),
        (
            "single-server ρ_max (M/G/1)",
            f"{r.max_utilization:.3f} ({r.utilization_bound_by})",
            f"a replica as ONE server of S = 1/μ: t_prefill + {r.tail_factor:.2f} × W_q ≤ SLO, "
            "W_q = ρS(1 + C_v²)/(2(1 − ρ))",
        ),
        ("single-server ρ_max (M/M/1)", f"{r.max_utilization_mm1:.3f}", "same with C_v = 1"),
        (
            "max rate per replica, single server",
            _num(r.max_rate_per_replica_per_s, " req/s"),
            "ρ_max × μ (not the fleet's sizing: see below)",
        ),
        (
            "M/G/1 ρ waiting like M/M/1 at 0.8",
            f"{r.mg1_utilization_matching_mm1_knee:.3f}",
            "ρ(1 + C_v²)/(2(1 − ρ)) = 0.8/0.2",
        ),
    ]
    rows += [
        (
            f"  ρ = {q.utilization:g}: W, p{i.percentile:g} (M/M/1); W (M/G/1)",
            f"{q.mm1_mean_over_s:.1f} S, {q.mm1_p_over_s:.1f} S; {q.mg1_mean_over_s:.1f} S",
            f"1/(1 − ρ); {r.tail_factor:.2f}/(1 − ρ); 1 + ρ(1 + C_v²)/(2(1 − ρ))"
            if n == 0
            else "〃",
        )
        for n, q in enumerate(r.queue_rows)
    ]
    return rows + _fleet_rows(i, r) + _goodput_rows(i, r)


def _fleet_rows(i: PlanInputs, r: Plan) -> list[tuple[str, str, str] | None]:
    f = r.fleet
    rows: list[tuple[str, str, str] | None] = [
        None,
        ("slot hold time T_hold", _num(r.t_hold_s, " s"), "t_prefill + N_out × t_decode"),
    ]
    if f is None:
        return [*rows, ("fleet", "—", "give --arrival-rate")]
    return [
        *rows,
        ("busy slots a", _num(f.offered_slots), "λ × T_hold (Little's law)"),
        ("slots with headroom c", f"{f.slots_exact:.1f} → {f.slots}", f"a + {i.beta:g}√a"),
        (
            "replicas",
            f"{f.replicas_without_spare} + 1 = {f.replicas}",
            f"⌈c / {i.slots_per_replica}⌉ + 1 spare for a failure; one queue for every slot",
        ),
        (
            "replicas sized on the mean",
            str(f.replicas_naive),
            "⌈a / slots per replica⌉: misses p99",
        ),
        (
            "batch-slot utilization",
            f"{f.slot_utilization:.3f}",
            f"a / ({f.replicas_without_spare} × {i.slots_per_replica} slots): not the "
            "single-server ρ",
        ),
        (
            f"p{i.percentile:g} queue wait, one fleet queue",
            _wait(f.pooled_wait_ms, f.wait_budget_ms),
            f"M/M/c, c = {f.replicas_without_spare * i.slots_per_replica} slots held T_hold "
            f"(Erlang C): {_share(f.pooled_wait_probability)} wait",
        ),
        (
            f"p{i.percentile:g} queue wait, a queue per replica",
            _wait(f.per_replica_wait_ms, f.wait_budget_ms),
            f"M/M/c, c = {i.slots_per_replica}, at λ / {f.replicas_without_spare}: "
            f"{_share(f.per_replica_wait_probability)} wait",
        ),
        (
            "replicas, a queue per replica",
            _num(f.replicas_queue_per_replica),
            "fewest R with that wait ≤ budget, + 1 spare",
        ),
        (
            "replicas, single-server picture",
            _num(f.replicas_single_server),
            "⌈λ / max rate per replica, single server⌉ + 1: pessimistic",
        ),
    ]


def _goodput_rows(i: PlanInputs, r: Plan) -> list[tuple[str, str, str] | None]:
    rows: list[tuple[str, str, str] | None] = [None] if r.batch_options else []
    for n, b in enumerate(r.batch_options):
        verdict = "ok" if b.meets_tpot_slo else f"VIOLATES {i.tpot_slo_ms:g} ms"
        rows.append(
            (
                f"decode batch {b.batch} at {b.step_ms:g} ms",
                f"{b.tokens_per_s:,.0f} tok/s {verdict}",
                "B / t(B); goodput only if t(B) ≤ TPOT_slo" if n == 0 else "〃",
            )
        )
    if r.batch_options:
        best = r.goodput_optimal_batch
        rows.append(
            (
                "goodput-optimal batch",
                str(best) if best else "none feasible",
                f"{_num(r.goodput_tokens_per_s, ' tok/s')}; raw peak at B = "
                f"{r.peak_throughput_batch}",
            )
        )
    if r.cost:
        rows += [
            None,
            ("fleet cost", _num(r.cost.fleet_per_hour, " /h"), "replicas × --price-per-hour"),
            (
                "per million SLO-meeting tokens",
                _num(r.cost.per_million_tokens),
                "fleet /h / (λ × N_out × 3600 / 10⁶)",
            ),
            (
                "  at one replica's goodput optimum",
                _num(r.cost.per_million_tokens_at_capacity),
                "--price-per-hour / (goodput × 3600 / 10⁶)",
            ),
        ]
    return rows


_UNITS = {
    "prefill_tokens_per_s": " tok/s",
    "decode_step_ms": " ms",
    "ttft_slo_ms": " ms",
    "tpot_slo_ms": " ms",
    "e2e_slo_ms": " ms",
    "prompt_tokens": " tokens",
    "long_prompt_tokens": " tokens",
    "output_tokens": " tokens",
    "arrival_rate_per_s": " req/s",
    "drain_rate_per_s": " req/s",
    "price_per_hour": " /h",
    "slots_per_replica": " slots",
}


def steps_text(by_batch: Sequence[tuple[int, float]]) -> str:
    """`1–16: 20 ms, 17–19: 20.6–21.9 ms, …`: runs of batches, at most ~6 groups."""
    groups: list[list[tuple[int, float]]] = []
    for batch, ms in by_batch:
        if groups and abs(ms - groups[-1][0][1]) <= 0.02 * groups[-1][0][1]:
            groups[-1].append((batch, ms))
        else:
            groups.append([(batch, ms)])
    step = max(1, math.ceil(len(groups) / 6))
    merged = [[p for g in groups[i : i + step] for p in g] for i in range(0, len(groups), step)]
    parts = []
    for group in merged:
        batches = f"{group[0][0]}" if len(group) == 1 else f"{group[0][0]}–{group[-1][0]}"
        lo, hi = min(m for _, m in group), max(m for _, m in group)
        value = f"{lo:.3g}" if hi - lo < 0.01 * lo else f"{lo:.3g}–{hi:.3g}"
        parts.append(f"{batches}: {value}")
    return ", ".join(parts) + " ms"


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if float(value).is_integer():
        return f"{int(value):,}{unit}"
    return f"{value:,.3g}{unit}" if abs(value) < 100 else f"{value:,.1f}{unit}"


def _wait(wait_ms: float, budget_ms: float | None = None) -> str:
    """`0 ms`, `7,651 ms`, `unbounded`; with a budget, `≤ 750 ms ok` or `> 750 ms MISSES`."""
    shown = "unbounded (a ≥ c)" if math.isinf(wait_ms) else f"{wait_ms:,.0f} ms"
    if budget_ms is None:
        return shown
    is_met = wait_ms <= budget_ms
    return f"{shown} {'≤' if is_met else '>'} {budget_ms:,.0f} ms {'ok' if is_met else 'MISSES'}"


def _share(probability: float) -> str:
    return f"{probability * 100:.2g} %"


def _ttft(steps: int | None, ttft_ms: float | None) -> str:
    return "—" if steps is None else f"{steps} chunks → {_num(ttft_ms, ' ms')}"


def _verdict(is_met: bool | None, slo_ms: float) -> str:
    if is_met is None:
        return ""
    return f" {'≤' if is_met else '>'} {slo_ms:g} ms {'ok' if is_met else 'MISSES'}"
