"""`loadgen capacity`: step the load up, bisect to the knee, judge a proposed limit.

A thin command: parse the flags, start one simulator when there is no URL (so the server
keeps its state between steps, like a real one), hand `loadgen.studies.capacity.search` a step
function that runs `loadgen.run.execute.execute` (`capacity.run_one_against`), then render
with `render.capacity_view`: the rules, each step, the table, the conclusion, capacity.json
and the knee plot. The search logic lives in `loadgen.studies.capacity`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from loadgen.analysis.capacity import (
    MIN_LIFETIMES,
    WARMUP_LIFETIMES,
    Step,
    base_rate_per_s,
    exit_code,
    judge,
    settings_json,
)
from loadgen.cli.exits import CAPACITY_EXITS, UsageErrorsExitOne
from loadgen.cli.live_options import live_options, open_live, price_options
from loadgen.cli.options import (
    OUTPUT,
    SEARCH,
    GroupedHelp,
    check_memory_line,
    check_report_paths,
    check_run_step_options,
    check_url,
    clean_errors,
    option,
    output_console,
    run_step_options,
    shared_run_options,
    shared_spec,
    spec_options,
    url_option,
    write_text,
)
from loadgen.cli.ray_options import ray_options, ray_settings
from loadgen.cli.span_options import check_receiver, receiver_options
from loadgen.errors import ConfigError, LoadgenError, OptionError
from loadgen.render.cache_view import cache_line
from loadgen.render.capacity_axis import load_axis
from loadgen.render.capacity_checks import render_capacity_junit, render_capacity_markdown
from loadgen.render.capacity_view import (
    capacity_files,
    conclusion,
    judged_steps,
    rule_lines,
    start_line,
    step_lines,
    steps_table,
)
from loadgen.render.terminal import SIM_NOTE
from loadgen.results.runfolder import read_summary
from loadgen.results.write import write_files
from loadgen.run.processes.simulator import target_url
from loadgen.run.scale.raycluster.driver import ray_session
from loadgen.run.setup import client_setup
from loadgen.studies.capacity import (
    MAX_EXTEND,
    PARAMS,
    RunOne,
    geometric_loads,
    run_one_against,
    search,
    step_runner,
)
from loadgen.workload.spec import WorkloadSpec, rate_scale

F = TypeVar("F", bound=Callable[..., Any])


class CapacityCommand(GroupedHelp, UsageErrorsExitOne):
    """`capacity`: grouped help, usage errors exit 1."""


@click.command(
    cls=CapacityCommand,
    epilog=CAPACITY_EXITS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@url_option
@spec_options
@run_step_options
@option(
    SEARCH,
    "--param",
    type=click.Choice(PARAMS),
    default="rate",
    show_default=True,
    help="rate: multiply every open-loop class's arrival rate (closed-loop batches run as "
    "written); max_in_flight: step a concurrency cap, each class sending closed-loop so the "
    "cap stays full.",
)
@option(
    SEARCH,
    "--start",
    help="First load: a multiplier (0.5x) or the open-loop classes' total arrivals/s (rate), "
    "a cap (max_in_flight). Default 0.5x / 1.",
)
@option(SEARCH, "--max", "maximum", help="Highest load to try. Default 16x / 256.")
@option(
    SEARCH,
    "--factor",
    type=click.FloatRange(min=1, min_open=True),
    default=2.0,
    show_default=True,
    help="Geometric step between loads.",
)
@option(
    SEARCH,
    "--steps",
    "steps_text",
    metavar="L1,L2,...",
    help="Explicit increasing loads instead of --start/--max/--factor.",
)
@option(
    SEARCH,
    "--resolution",
    type=click.FloatRange(min=0, min_open=True),
    default=0.05,
    show_default=True,
    help="Bisect until first fail <= highest pass × (1 + this).",
)
@option(
    SEARCH,
    "--min-tail",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Requests each class needs beyond its SLO percentile (p99: n >= 10/0.01).",
)
@option(
    SEARCH,
    "--min-lifetimes",
    type=click.FloatRange(min=1),
    default=MIN_LIFETIMES,
    show_default=True,
    help="Mean request lifetimes (intended → end) each step's judged part must last.",
)
@option(
    SEARCH,
    "--warmup-s",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds at the start of each step left out of the audit "
    f"(default the larger of 10 % and {WARMUP_LIFETIMES:g} lifetimes).",
)
@option(
    SEARCH,
    "--max-extend",
    type=click.FloatRange(min=1),
    default=MAX_EXTEND,
    show_default=True,
    help="A step whose SLOs are neither met nor missed at their confidence is run again "
    "twice as long, then four times, ..., up to this many times its planned length; one "
    "still inconclusive then does not pass (1: never extend).",
)
@option(
    SEARCH,
    "--proposed-limit",
    help="A load to judge (same units as --start): pass only if <= highest passing load × "
    "(1 − safety margin).",
)
@option(
    SEARCH,
    "--safety-margin",
    type=click.FloatRange(min=0, max=1, max_open=True),
    default=0.10,
    show_default=True,
    help="Share kept below the highest pass.",
)
@option(
    OUTPUT,
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for capacity.json, knee.png and the steps' runs (default "
    "reports/capacity-<UTC time>).",
)
@option(
    OUTPUT,
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the search's answer as JUnit XML: one testcase, the proposed limit (or "
    "whether a knee was found), failing as capacity's exit code does; every step a property.",
)
@option(
    OUTPUT,
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the answer, the conclusion and a row per step as Markdown (for a CI job summary).",
)
@receiver_options
@ray_options
@live_options
@price_options
@clean_errors
def capacity(
    workload: Path, param: str, start: str | None, maximum: str | None, factor: float,
    steps_text: str | None, resolution: float, min_tail: int, min_lifetimes: float,
    warmup_s: float | None, max_extend: float, proposed_limit: str | None,
    safety_margin: float,
    out_dir: Path | None, junit_path: Path | None, markdown_path: Path | None,
    prometheus_listen: str | None, prometheus_grace_s: float,
    otlp_endpoint: str | None, otlp_interval_s: float, ray_address: str | None,
    ray_shards: int | None, max_clock_skew_ms: float, **shared: Any,
) -> None:  # fmt: skip  # the options it shares with `run` (loadgen.cli.options) in `shared`
    """Find the highest load the server sustains with every SLO of every class met (the knee).

    Steps the load up geometrically (or through --steps) until a step fails, then
    bisects between the highest passing and the lowest failing load. A step passes only
    at a steady state: long enough (every class's SLO percentile rests on --min-tail
    requests beyond it, and the judged part lasts --min-lifetimes mean request
    lifetimes), completing within 3 % of the offered rate, with no rise in requests in
    flight or TTFT beyond what noise allows, and every SLO met at its confidence (a
    steady step whose SLOs are neither met nor missed is run again, longer, up to
    --max-extend); its warm-up is left out. The knee is reported as the interval between
    the highest passing load and the lowest one not shown to pass.
    An over-saturated step (completing less than offered) bounds the search: no load
    above what it served is run. A closed loop (--param max_in_flight) is steady by
    construction: once it held its cap, its SLOs decide (rate and trends are shown, not
    judged). A step whose generator fell behind (or whose closed loop did not hold its
    cap) is invalid, not failed: the search stops raising load there. Goodput (requests
    and tokens within SLO) is the objective; raw throughput is shown beside it.

    \b
    Example:
      loadgen capacity workloads/chat-smoke.yaml
      loadgen capacity workloads/mixed.yaml --url http://candidate:8000 --proposed-limit 3
      loadgen capacity workloads/chat-smoke.yaml --param max_in_flight --start 4 --max 64
      loadgen capacity workloads/chat-smoke.yaml --prometheus-port 9464
      loadgen capacity workloads/chat-smoke.yaml --url http://gpu:8000 --cache reset
      loadgen capacity workloads/chat.yaml --url http://gpu:8000 --ray auto --shards 4
    """

    ray = ray_settings(ray_address, ray_shards, max_clock_skew_ms, **{
        "--workers": (shared.get("workers") or 1) > 1, "--prometheus-port": prometheus_listen,
        "--otlp-endpoint": otlp_endpoint, "--otlp-receiver": shared["otlp_receiver"],
    })  # fmt: skip
    check_url(shared["url"])
    check_report_paths(("--junit", junit_path), ("--markdown", markdown_path))
    spec = shared_spec(workload, shared)
    receiver = check_receiver(shared["otlp_receiver"], steps=True,
                              simulator=not (shared["url"] or spec.target.url))  # fmt: skip
    check_run_step_options(shared, spec)
    base = shared_run_options(shared)  # every step runs with these (its url, folder, cap added)
    client_setup(spec, base)  # headers and their ${VAR}s: refused before the first step
    integer = param == "max_in_flight"
    loads = _loads(spec, param, start, maximum, factor, steps_text)
    proposed = _load_value(spec, param, proposed_limit, "--proposed-limit")
    out = out_dir or Path("reports") / f"capacity-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    console = output_console()
    axis = load_axis(spec, param)
    for rule in rule_lines(spec, min_tail, min_lifetimes, warmup_s, param):
        console.print(rule)

    def on_start(load: float, spec_at: WorkloadSpec) -> None:
        console.print(start_line(load, spec_at, axis))

    def on_step(step: Step) -> None:
        for line in step_lines(step, axis):
            console.print(line)
        if (cached := step_cache_line(step)) is not None:
            console.print(cached)

    price = base.price_per_hour
    fleet = None if price is None else price * base.replicas
    live = open_live(prometheus_listen, prometheus_grace_s, otlp_endpoint, otlp_interval_s,
                     price_per_hour=fleet, network=base.network)  # fmt: skip
    session = ray_session(ray, quiet=base.quiet) if ray is not None else contextlib.nullcontext()
    with live as exporter, session:
        spans_url = receiver.endpoint if receiver is not None else None
        with _target_url(base.url, spec, base.quiet, spans_url) as (base_url, builtin_sim):
            one = run_one_against(base_url, options=base, out=out / "steps", live=exporter,
                                  ray=ray)  # fmt: skip
            run_one = _memory_checked(one, base.seed, shared["max_memory_gb"])
            run_step = step_runner(spec, run_one, param=param, min_tail=min_tail,
                                   warmup_s=warmup_s, min_lifetimes=min_lifetimes,
                                   lag_bound_ms=base.lag_bound_ms, on_start=on_start,
                                   max_extend=max_extend, rule=base.verdict)  # fmt: skip
            found = search(run_step, loads, resolution=resolution, integer=integer,
                           on_step=on_step)  # fmt: skip
        verdict = judge(found, proposed, safety_margin=safety_margin) if proposed else None
        console.print(steps_table(found, axis))
        base_rate = base_rate_per_s(spec) if param == "rate" else None
        settings = settings_json(param, loads, resolution, min_tail, min_lifetimes, warmup_s,
                                 safety_margin, proposed, base_rate, max_extend,
                                 base.verdict)  # fmt: skip
        write_files(out, capacity_files(found, verdict, axis, settings))
        for line in conclusion(found, verdict, axis, safety_margin):
            console.print(line)
        if builtin_sim:  # said under -q too: a job that lost its --url must not read as a test
            console.print(f"target: {SIM_NOTE}", style="bold yellow", markup=False)
        for path, render in ((junit_path, render_capacity_junit),
                             (markdown_path, render_capacity_markdown)):  # fmt: skip
            if path is not None:
                text = render(found, verdict, axis, safety_margin=safety_margin,
                              builtin_sim=builtin_sim)  # fmt: skip
                write_text(path, text)
                console.print(f"wrote {path}", markup=False)
        if judged_steps(found):
            console.print(f"knee plot, capacity.json and step runs: {out}")
        else:
            console.print(f"capacity.json and step runs: {out} (no knee plot: no step judged)")
    sys.exit(exit_code(found, verdict))


def _memory_checked(run_one: RunOne, seed: int | None, max_memory_gb: float | None) -> RunOne:
    """Each step's plan is refused over the memory cap (--max-memory-gb), as `run` refuses
    its plan, before it is run."""

    def checked(spec_at: WorkloadSpec, cap: int | None, run_id: str) -> Any:
        check_memory_line(spec_at, seed, max_memory_gb)
        return run_one(spec_at, cap, run_id)

    return checked


def step_cache_line(step: Step) -> str | None:
    """`  cache: cold (nonce …), prefix-cache hit share 4.0% (…)`: a step's cache warmth
    (each step starts cold of the others by default), from its summary.json."""
    if step.run_dir is None:
        return None
    try:
        cache = read_summary(Path(step.run_dir)).cache
    except LoadgenError:  # an interrupted step may have written none
        return None
    return f"  {cache_line(cache)}" if cache is not None else None


def _load_value(spec: WorkloadSpec, param: str, text: str | None, flag: str) -> float | None:
    """A load in search units: a rate multiplier (from `2x` or total req/s), or a cap."""

    if text is None:
        return None
    if param == "rate":
        try:
            return rate_scale(spec, text)
        except ConfigError as exc:
            raise OptionError(flag, exc.problem, exc.fix) from None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise OptionError(flag, f"must be a cap >= 1 (got {text!r})", "e.g. 16")
    return float(value)


def _loads(
    spec: WorkloadSpec, param: str, start: str | None, maximum: str | None, factor: float,
    steps_text: str | None,
) -> list[float]:  # fmt: skip
    integer = param == "max_in_flight"
    if steps_text:
        loads = [_load_value(spec, param, t.strip(), "--steps") for t in steps_text.split(",")]
        values = [v for v in loads if v is not None]
        if values != sorted(set(values)):
            raise OptionError("--steps", "loads must increase", "e.g. 1x,2x,4x")
        return values
    first = _load_value(spec, param, start or ("1" if integer else "0.5x"), "--start")
    last = _load_value(spec, param, maximum or ("256" if integer else "16x"), "--max")
    assert first is not None  # defaults given
    assert last is not None
    if last < first:
        raise OptionError("--max", f"must be >= --start (got {maximum})")
    return geometric_loads(first, last, factor, integer=integer)


@contextlib.contextmanager
def _target_url(
    url: str | None, spec: WorkloadSpec, quiet: bool, spans_url: str | None
) -> Iterator[tuple[str, bool]]:
    """The URL, the file's, or one built-in simulator kept up for every step (sending its
    spans to `spans_url`, each step's receiver in turn); and whether it is the simulator."""
    with target_url(url, spec, spans_url=spans_url) as (base_url, args):
        if args is not None and not quiet:
            click.echo(f"started the built-in simulator at {base_url} {' '.join(args)}", err=True)
        yield base_url, args is not None
