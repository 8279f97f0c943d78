"""`loadgen plan`: parse the flags, read the runs, call `studies.planner`, render the tables
(`render.planner_view`) or JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from loadgen.analysis.estimates import Measured
from loadgen.cli.exits import PLAN_EXITS
from loadgen.cli.options import clean_errors, output_console
from loadgen.errors import OptionError
from loadgen.render.planner_view import plan_notes, render_plan
from loadgen.results.runfolder import read_records, read_run_info
from loadgen.studies.planner import (
    FLAGS,
    Layer,
    from_runs,
    make_plan,
    parse_decode_table,
    resolve,
    to_json,
    validate,
)

_FLOAT_FLAGS = (
    ("prefill_tokens_per_s", "Prefill rate of one replica, tokens/s.  [e.g. 8000]"),
    ("decode_step_ms", "Decode step time at the planned batch, ms.  [e.g. 30]"),
    ("slots_per_replica", "Batch slots (max running sequences) per replica.  [e.g. 32]"),
    ("ttft_slo_ms", "TTFT SLO, ms.  [e.g. 1000]"),
    ("tpot_slo_ms", "TPOT SLO, ms.  [e.g. 50]"),
    ("e2e_slo_ms", "E2E SLO, ms (optional: also bounds the utilization)."),
    ("percentile", "The SLO percentile.  [default: 99]"),
    ("prompt_tokens", "Typical prompt, tokens.  [e.g. 2000]"),
    ("long_prompt_tokens", "Longest prompt to plan for, tokens.  [default: --prompt-tokens]"),
    ("output_tokens", "Output tokens per request (the mean, for Little's law).  [e.g. 300]"),
    ("arrival_rate_per_s", "Target arrival rate for the fleet, req/s.  [e.g. 30]"),
    ("drain_rate_per_s", "Requests/s one replica completes.  [default: slots / T_hold]"),
    ("service_cv", "Service-time coefficient of variation C_v.  [default: 1, M/M/1]"),
    ("beta", "Square-root staffing headroom β in c = a + β√a.  [default: 2]"),
    (
        "price_per_hour",
        "Price of one replica per hour, as run --price-per-hour: the fleet's "
        "cost and its cost per million SLO-meeting output tokens, in that currency.",
    ),
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


@click.command("plan", epilog=PLAN_EXITS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--from-run",
    "run_dirs",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Estimate parameters and SLOs from a run folder (repeatable); flags override.",
)
@click.option(
    "--class",
    "class_names",
    multiple=True,
    help="With --from-run: only this class's records and SLO (one: a plan is for one SLO).",
)
@_input_options
@click.option("--gpus-per-replica", "old_gpus", type=float, hidden=True)  # old: --price-per-hour
@click.option("--gpu-hour-usd", "old_gpu_hour", type=float, hidden=True)
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
    class_names: tuple[str, ...],
    decode_table: str | None,
    fmt: str,
    old_gpus: float | None,
    old_gpu_hour: float | None,
    **given: float | None,
) -> None:
    """Plan chunk size, admission cap, utilization and fleet size from SLOs.

    The serving arithmetic (docs/capacity.md): the largest prefill chunk the TPOT SLO
    allows and the TTFT it costs a long prompt; the stall of an unchunked prompt; the
    queue depth beyond which an admitted request is doomed; the utilization that keeps
    the p99 queue wait inside the TTFT budget (M/G/1, Pollaczek–Khinchine); the fleet for
    a target rate (Little's law with β√a headroom and one spare); the goodput-optimal
    batch; the cost per million SLO-meeting tokens. Every input is labelled assumed (a
    flag), measured (from --from-run) or default; a required input has no default ("e.g."
    gives a typical value).

    \b
    Example:
      loadgen plan --prefill-tokens-per-s 8000 --decode-step-ms 30 --slots-per-replica 32 \\
        --ttft-slo-ms 1000 --tpot-slo-ms 50 --prompt-tokens 2000 --long-prompt-tokens 4000 \\
        --output-tokens 300 --arrival-rate 30 --drain-rate 3.5 --service-cv 2 \\
        --decode-table 16:20,32:30,64:55
      loadgen plan --from-run reports/20261129T101500Z-chat-1a2b --arrival-rate 30 --format json
    """

    clean_errors(_plan_with_old_names)(run_dirs, class_names, decode_table, fmt, given,
                                       (old_gpus, old_gpu_hour))  # fmt: skip


def _plan_with_old_names(
    run_dirs: Sequence[Path],
    class_names: Sequence[str],
    table_text: str | None,
    fmt: str,
    given: dict[str, float | None],
    old_price: tuple[float | None, float | None],
) -> None:
    """`_plan`, once the deprecated spellings are read: --gpus-per-replica × --gpu-hour-usd
    is one replica's --price-per-hour; one --class (a plan is for one class's SLO)."""
    if len(class_names) > 1:
        problem = f"names {len(class_names)} classes: a plan is for one class's SLO"
        raise OptionError("--class", problem, "give one --class; plan each class on its own")
    given["price_per_hour"] = old_price_per_hour(given.get("price_per_hour"), *old_price)
    _plan(run_dirs, class_names[0] if class_names else None, table_text, fmt, given)


def old_price_per_hour(
    price: float | None, gpus: float | None, gpu_hour: float | None
) -> float | None:
    """The price of a replica-hour, from --price-per-hour or from the old pair that made it
    (--gpus-per-replica × --gpu-hour-usd), which still works and says its new name."""
    if gpus is None and gpu_hour is None:
        return price
    old = "--gpus-per-replica and --gpu-hour-usd"
    if price is not None:
        raise OptionError(old, "are the old spelling of --price-per-hour", "give one of them")
    if gpus is None or gpu_hour is None:
        raise OptionError(old, "make a price only together (their product)",
                          "give --price-per-hour, one replica's price per hour")  # fmt: skip
    made = gpus * gpu_hour
    click.echo(f"warning: {old} are deprecated: give --price-per-hour {made:g} (one replica's "
               "price per hour, their product); they still work", err=True)  # fmt: skip
    return made


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
        click.echo(json.dumps(to_json(inputs, sources, result, measured, notes), indent=2))
        return
    output_console().print(render_plan(inputs, sources, result, measured, notes))


def _from_runs(
    run_dirs: Sequence[Path], class_name: str | None, given: Mapping[str, float | None]
) -> tuple[Measured, list[Layer]]:
    """The runs' records and run.json, as the planner's measured and recorded layers."""
    frames = [read_records(d) for d in run_dirs]
    infos = [read_run_info(d) for d in run_dirs]
    source = ", ".join(str(d) for d in run_dirs)
    return from_runs(frames, infos, class_name=class_name, given=given, source=source)
