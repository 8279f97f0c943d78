"""`loadgen check`: validate a workload file and print its plan; sends nothing."""

from __future__ import annotations

from pathlib import Path

import click

from loadgen.cli.exits import CHECK_EXITS
from loadgen.cli.options import (
    OUTPUT,
    GroupedHelp,
    check_memory_line,
    clean_errors,
    memory_cap,
    option,
    output_console,
    workload_options,
)
from loadgen.errors import OptionError
from loadgen.render.cache_view import cache_plan_line
from loadgen.render.plan_view import render_plan, sizing_lines
from loadgen.run.processes.simulator import sim_args_from_mapping
from loadgen.workload.inputs import size_text
from loadgen.workload.plans import estimate_memory, plan_run
from loadgen.workload.spec import load, override


@click.command(cls=GroupedHelp, epilog=CHECK_EXITS)
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@workload_options
@option(
    OUTPUT,
    "--schedule",
    "show_schedule",
    is_flag=True,
    help="Also print the first intended send times.",
)
@clean_errors
def check(
    workload: Path,
    requests: int | None,
    duration: float | None,
    rate: str | None,
    seed: int | None,
    api: str | None,
    model: str | None,
    force_output_tokens: bool | None,
    accept_encoding: str | None,
    path_buffers: bool | None,
    traceparent: bool | None,
    cache: str | None,
    nonce: str | None,
    max_memory_gb: float | None,
    confidence: float | None,
    show_schedule: bool,
) -> None:
    """Validate a workload file and print its plan; sends nothing.

    Says, per class, how many requests its SLO needs to be judged at its confidence
    (--confidence, else slo.confidence, else 95 %), and warns when the plan has fewer.

    \b
    Example:
      loadgen check workloads/chat.yaml
      loadgen check workloads/chat.yaml --rate 2x --schedule
      loadgen check workloads/chat.yaml --api anthropic --model claude-haiku-4-5
      loadgen check workloads/chat-smoke.yaml --requests 300 --confidence 0.99
    """

    spec = override(load(workload), requests=requests, duration_s=duration, rate=rate,
                    api=api, model=model, force_output_tokens=force_output_tokens,
                    cache=cache, confidence=confidence, accept_encoding=accept_encoding,
                    path_buffers=path_buffers, traceparent=traceparent)  # fmt: skip
    if nonce is not None and spec.cache != "cold":
        raise OptionError("--nonce", f"applies to cache: cold, not {spec.cache}",
                          "drop --nonce, or add --cache cold")  # fmt: skip
    sim_args_from_mapping(spec.sim, spec.source)  # the built-in simulator's profile
    check_memory_line(spec, seed, max_memory_gb)  # refused before the plans are built
    plans = plan_run(spec, seed)
    console = output_console()
    console.print(render_plan(spec, plans, show_schedule=show_schedule))
    for line in sizing_lines(spec, plans):
        console.print(line)
    cap, source = memory_cap(max_memory_gb)  # the plan's own count, as the table above says
    estimate = estimate_memory(spec, seed, plans)
    console.print(f"client memory: {estimate.text()} (cap {size_text(cap)}: {source})")
    console.print(cache_plan_line(spec.cache, nonce))
