"""`loadgen plan`: parse flags and runs, call `planner`, render a table or JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from loadgen.cli.options import clean_errors, output_console
from loadgen.errors import ConfigError
from loadgen.results.records import read_records
from loadgen.results.runfolder import RunInfo, read_run_info
from loadgen.sim.engine import EngineConfig
from loadgen.studies.planner import (
    FLAGS,
    Chunking,
    Cost,
    Fleet,
    Measured,
    Plan,
    PlanInputs,
    estimate,
    make_plan,
    parse_decode_table,
    resolve,
    validate,
)

_FLOAT_FLAGS = (
    ("prefill_tokens_per_s", "Prefill rate of one replica, tokens/s.  [seed: 8000]"),
    ("decode_step_ms", "Decode step time at the planned batch, ms.  [seed: 30]"),
    ("slots_per_replica", "Batch slots (max running sequences) per replica.  [seed: 32]"),
    ("ttft_slo_ms", "TTFT SLO, ms.  [seed: 1000]"),
    ("tpot_slo_ms", "TPOT SLO, ms.  [seed: 50]"),
    ("e2e_slo_ms", "E2E SLO, ms (optional: also bounds the utilization)."),
    ("percentile", "The SLO percentile.  [default: 99]"),
    ("prompt_tokens", "Typical prompt, tokens.  [seed: 2000]"),
    ("long_prompt_tokens", "Longest prompt to plan for, tokens.  [default: --prompt-tokens]"),
    ("output_tokens", "Output tokens per request (the mean, for Little's law).  [seed: 300]"),
    ("arrival_rate_per_s", "Target arrival rate for the fleet, req/s.  [seed: 30]"),
    ("drain_rate_per_s", "Requests/s one replica completes.  [default: slots / T_hold]"),
    ("service_cv", "Service-time coefficient of variation C_v.  [default: 1, M/M/1]"),
    ("beta", "Square-root staffing headroom β in c = a + β√a.  [default: 2]"),
    ("gpus_per_replica", "GPUs per replica, for the cost (with --gpu-hour-usd)."),
    ("gpu_hour_usd", "Price of one GPU-hour in USD, for the cost."),
)


def _input_options(func: Any) -> Any:
    """One float option per PlanInputs field, without click defaults: a default is labelled."""
    for name, text in reversed(_FLOAT_FLAGS):
        func = click.option(
            FLAGS.get(name, "--" + name.replace("_", "-")),
            name,
            type=float,
            default=None,
            help=text,
        )(func)
    return func


@click.command("plan", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--from-run",
    "run_dirs",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Estimate parameters and SLOs from a run folder (repeatable); flags override.",
)
@click.option("--class", "class_name", help="With --from-run: only this class's records and SLO.")
@_input_options
@click.option(
    "--decode-table",
    metavar="B:MS,...",
    help="Decode step time by batch size, for the goodput-optimal batch, e.g. 16:20,32:30,64:55.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: the plan on stdout, for machines.",
)
def plan(
    run_dirs: tuple[Path, ...],
    class_name: str | None,
    decode_table: str | None,
    fmt: str,
    **given: float | None,
) -> None:
    """Plan chunk size, admission cap, utilization and fleet size from SLOs.

    The serving arithmetic of the seed document: the largest prefill chunk the TPOT SLO
    allows and the TTFT it costs a long prompt; the stall of an unchunked prompt; the
    queue depth beyond which an admitted request is doomed; the utilization that keeps
    the p99 queue wait inside the TTFT budget (M/G/1, Pollaczek–Khinchine); the fleet for
    a target rate (Little's law with β√a headroom and one spare); the goodput-optimal
    batch; the cost per million SLO-meeting tokens. Every input is labelled assumed (a
    flag), measured (from --from-run) or default.

    \b
    Example:
      loadgen plan --prefill-tokens-per-s 8000 --decode-step-ms 30 --slots-per-replica 32 \\
        --ttft-slo-ms 1000 --tpot-slo-ms 50 --prompt-tokens 2000 --long-prompt-tokens 4000 \\
        --output-tokens 300 --arrival-rate 30 --drain-rate 3.5 --service-cv 2 \\
        --decode-table 16:20,32:30,64:55
      loadgen plan --from-run reports/20261129T101500Z-chat-1a2b --arrival-rate 30 --format json
    """

    clean_errors(_plan)(run_dirs, class_name, decode_table, fmt, given)


def _plan(
    run_dirs: Sequence[Path],
    class_name: str | None,
    table_text: str | None,
    fmt: str,
    given: Mapping[str, float | None],
) -> None:
    table = parse_decode_table(table_text) if table_text is not None else ()
    measured, layers = _from_runs(run_dirs, class_name, given) if run_dirs else (None, [])
    unmeasured = dict(measured.unmeasured) if measured else {}
    inputs, sources = resolve(given, layers, table, unmeasured=unmeasured,
                              from_run=bool(run_dirs))  # fmt: skip
    validate(inputs, sources)
    result = make_plan(inputs)
    notes = plan_notes(inputs, result, measured)
    if fmt == "json":
        click.echo(json.dumps(plan_json(inputs, sources, result, measured, notes), indent=2))
        return
    console = output_console()
    console.print(inputs_table(inputs, sources, measured))
    if measured and measured.decode_steps_by_batch:
        by_batch = steps_text(measured.decode_steps_by_batch)
        console.print(f"decode step by decoding batch (lower envelope of ITL): {by_batch}")
    console.print(plan_table(inputs, result))
    for note in notes:
        console.print(f"note: {note}")


def _from_runs(
    run_dirs: Sequence[Path], class_name: str | None, given: Mapping[str, float | None]
) -> tuple[Measured, list[tuple[Mapping[str, float | None], str]]]:
    """Estimates from the runs' records and the SLOs their run.json recorded, as layers."""

    names = ", ".join(str(d) for d in run_dirs)
    infos = [read_run_info(d) for d in run_dirs]
    measured = estimate([read_records(d) for d in run_dirs], class_name)
    if measured.requests == 0:
        which = f"of class {class_name!r} " if class_name else ""
        raise ConfigError(
            names,
            "records",
            f"hold no ok request {which}with a first token",
            "plan from a run that served requests, or give the flags",
        )
    slos: dict[str, set[float]] = {}
    for info in infos:
        for name, slo in info.slos().items():
            if class_name is None or name == class_name:
                for key, value in dataclasses.asdict(slo).items():
                    if value is not None:
                        slos.setdefault(key, set()).add(float(value))
    recorded: dict[str, float | None] = {}
    for key, values in slos.items():
        field = key.replace("_ms", "_slo_ms") if key != "percentile" else key
        if len(values) > 1 and given.get(field) is None:
            raise ConfigError(
                names,
                f"slo.{key}",
                f"classes or runs disagree ({sorted(values)})",
                "choose one with --class or the flag",
            )
        recorded[field] = min(values)
    estimates = measured.as_inputs()
    decode = estimates.pop("decode_step_ms", None)
    layers: list[tuple[Mapping[str, float | None], str]] = [
        (estimates, f"measured (from {names})"),
        (recorded, f"recorded SLO (from {names})"),
    ]
    if decode is not None:
        at = f" at batch {measured.decode_batch:g}" if measured.decode_batch else ""
        label = f"measured: {measured.decode_source}{at} (from {names})"
        layers.insert(0, ({"decode_step_ms": decode}, label))
    slots = simulator_slots(infos)
    if slots is not None:
        label = f"configured (the built-in simulator's --max-batch, from {names})"
        layers.append(({"slots_per_replica": float(slots)}, label))
    return measured, layers


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


# --- rendering ----------------------------------------------------------------------------


def plan_json(
    inputs: PlanInputs,
    sources: Mapping[str, str],
    result: Plan,
    measured: Measured | None,
    notes: Sequence[str],
) -> dict[str, Any]:
    """The plan flat (sections' fields at the top, null when a section is absent), inputs beside."""
    flat: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if f.name in _SECTIONS:
            names = [g.name for g in dataclasses.fields(_SECTIONS[f.name])]
            flat.update(dataclasses.asdict(value) if value else dict.fromkeys(names))
        elif isinstance(value, tuple):
            flat[f.name] = [dataclasses.asdict(v) for v in value]
        else:
            flat[f.name] = value
    values = dataclasses.asdict(inputs)
    values["decode_table"] = [list(pair) for pair in inputs.decode_table] or None
    return {
        **flat,
        "inputs": {k: {"value": values[k], "source": sources.get(k)} for k in values},
        "measured": dataclasses.asdict(measured) if measured else None,
        "notes": list(notes),
    }


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
    if result.fleet and result.fleet.replica_utilization > result.max_utilization:
        notes.append(
            f"the fleet runs replicas at ρ = {result.fleet.replica_utilization:.2f}, "
            f"above the single-server bound {result.max_utilization:.2f}: that bound is "
            "pessimistic for many-slot replicas: measure the p99 there"
        )
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


_SECTIONS: dict[str, type] = {"chunking": Chunking, "fleet": Fleet, "cost": Cost}


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
            "max utilization (M/G/1)",
            f"{r.max_utilization:.3f} ({r.utilization_bound_by})",
            f"t_prefill + {r.tail_factor:.2f} × W_q ≤ SLO, W_q = ρS(1 + C_v²)/(2(1 − ρ)), S = 1/μ",
        ),
        ("max utilization (M/M/1)", f"{r.max_utilization_mm1:.3f}", "same with C_v = 1"),
        ("max rate per replica", _num(r.max_rate_per_replica_per_s, " req/s"), "ρ_max × μ"),
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
            f"⌈c / {i.slots_per_replica}⌉ + 1 spare for a failure",
        ),
        (
            "replicas sized on the mean",
            str(f.replicas_naive),
            "⌈a / slots per replica⌉: misses p99",
        ),
        ("replica utilization", f"{f.replica_utilization:.3f}", "λ / (replicas without spare × μ)"),
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
            ("fleet cost", _num(r.cost.fleet_usd_per_hour, " $/h"), "replicas × GPUs × $/GPU-h"),
            (
                "per million SLO-meeting tokens",
                _num(r.cost.usd_per_million_tokens, " $"),
                "fleet $/h / (λ × N_out × 3600 / 10⁶)",
            ),
            (
                "  at one replica's goodput optimum",
                _num(r.cost.usd_per_million_tokens_at_capacity, " $"),
                "GPUs × $/GPU-h / (goodput × 3600 / 10⁶)",
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
    "gpu_hour_usd": " $/h",
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


def _ttft(steps: int | None, ttft_ms: float | None) -> str:
    return "—" if steps is None else f"{steps} chunks → {_num(ttft_ms, ' ms')}"


def _verdict(is_met: bool | None, slo_ms: float) -> str:
    if is_met is None:
        return ""
    return f" {'≤' if is_met else '>'} {slo_ms:g} ms {'ok' if is_met else 'MISSES'}"
