"""`loadgen capacity`: step the load up, bisect to the knee, judge a proposed limit.

A thin command: parse the flags, start one simulator when there is no URL (so the server
keeps its state between steps, like a real one), hand `loadgen.studies.capacity.search` a step
function that runs `loadgen.run.execute.execute`, then render the table, the knee plot and
capacity.json. The search logic lives in `loadgen.studies.capacity`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import polars as pl
from rich import box
from rich.table import Table
from rich.text import Text

from loadgen.cli.options import check_url, clean_errors, output_console
from loadgen.errors import ConfigError
from loadgen.render.knee_plot import knee_png
from loadgen.results.records import read_records
from loadgen.run.execute import RunOptions, execute
from loadgen.run.simulator import target_url
from loadgen.studies.capacity import (
    FAIL,
    INVALID,
    MIN_LIFETIMES,
    PARAMS,
    PASS,
    RATE_TOLERANCE,
    WARMUP_LIFETIMES,
    Search,
    Step,
    Verdict,
    base_rate_per_s,
    exit_code,
    geometric_loads,
    judge,
    planned_size,
    required_requests,
    search,
    step_runner,
    to_json,
)
from loadgen.workload.spec import WorkloadSpec, load, rate_scale

F = TypeVar("F", bound=Callable[..., Any])

EXIT_HELP = """\b
Exit codes:
  0    the proposed limit passes; without --proposed-limit, the knee was found
  1    usage or configuration error (bad file, bad flag, unreachable target)
  2    the proposed limit fails; without it, no knee in range (no step passed,
       or every step up to --max passed)
  3    the generator fell behind before the answer was known: rerun on a bigger machine
  130  interrupted"""


class CapacityCommand(click.Command):
    """Usage errors exit 1 when the command runs on its own too (click's 2 reads as "fails")."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            exc.show()
            sys.exit(1)


@click.command(
    cls=CapacityCommand, epilog=EXIT_HELP, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--url",
    help="Base URL of the endpoint; without it one built-in simulator "
    "is started for the whole search (the workload's sim: section).",
)
@click.option(
    "--param",
    type=click.Choice(PARAMS),
    default="rate",
    show_default=True,
    help="rate: multiply every class's arrival rate; max_in_flight: step a "
    "concurrency cap, each class sending closed-loop so the cap stays full.",
)
@click.option(
    "--start",
    help="First load: a multiplier (0.5x) or total req/s (rate), "
    "a cap (max_in_flight). Default 0.5x / 1.",
)
@click.option("--max", "maximum", help="Highest load to try. Default 16x / 256.")
@click.option(
    "--factor",
    type=click.FloatRange(min=1, min_open=True),
    default=2.0,
    show_default=True,
    help="Geometric step between loads.",
)
@click.option(
    "--steps",
    "steps_text",
    metavar="L1,L2,...",
    help="Explicit increasing loads instead of --start/--max/--factor.",
)
@click.option(
    "--resolution",
    type=click.FloatRange(min=0, min_open=True),
    default=0.05,
    show_default=True,
    help="Bisect until first fail <= highest pass × (1 + this).",
)
@click.option(
    "--min-tail",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="Requests each class needs beyond its SLO percentile (p99: n >= 10/0.01).",
)
@click.option(
    "--min-lifetimes",
    type=click.FloatRange(min=1),
    default=MIN_LIFETIMES,
    show_default=True,
    help="Mean request lifetimes (intended → end) each step's judged part must last.",
)
@click.option(
    "--warmup-s",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds at the start of each step left out of the audit "
    f"(default the larger of 10 % and {WARMUP_LIFETIMES:g} lifetimes).",
)
@click.option(
    "--proposed-limit",
    help="A load to judge (same units as --start): pass only "
    "if <= highest passing load × (1 − safety margin).",
)
@click.option(
    "--safety-margin",
    type=click.FloatRange(min=0, max=1, max_open=True),
    default=0.10,
    show_default=True,
    help="Share kept below the highest pass.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for capacity.json, knee.png and the steps' runs "
    "(default reports/capacity-<UTC time>).",
)
@click.option("--seed", type=int, help="Seed for arrivals, lengths and prompts.")
@click.option(
    "--lag-bound-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Send lag above which a send is late; too many late sends make a step invalid.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress line during the steps.")
@clean_errors
def capacity(
    workload: Path, url: str | None, param: str, start: str | None, maximum: str | None,
    factor: float, steps_text: str | None, resolution: float, min_tail: int,
    min_lifetimes: float, warmup_s: float | None, proposed_limit: str | None, safety_margin: float,
    out_dir: Path | None, seed: int | None, lag_bound_ms: float, quiet: bool,
) -> None:  # fmt: skip
    """Find the highest load the server sustains with every SLO of every class met (the knee).

    Steps the load up geometrically (or through --steps) until a step fails, then
    bisects between the highest passing and the lowest failing load. A step passes only
    at a steady state: long enough (every class's SLO percentile rests on --min-tail
    requests beyond it, and the judged part lasts --min-lifetimes mean request
    lifetimes), completing within 3 % of the offered rate, with no rise in requests in
    flight or TTFT beyond what noise allows, and every SLO met; its warm-up is left out.
    An over-saturated step (completing less than offered) bounds the search: no load
    above what it served is run. A step whose generator fell behind is invalid, not
    failed: the search stops raising load there. Goodput (requests and tokens within
    SLO) is the objective; raw throughput is shown beside it.

    \b
    Example:
      loadgen capacity workloads/chat-smoke.yaml
      loadgen capacity workloads/mixed.yaml --url http://candidate:8000 --proposed-limit 3
      loadgen capacity workloads/chat-smoke.yaml --param max_in_flight --start 4 --max 64
    """

    check_url(url)
    spec = load(workload)
    integer = param == "max_in_flight"
    loads = _loads(spec, param, start, maximum, factor, steps_text)
    proposed = _load_value(spec, param, proposed_limit, "--proposed-limit")
    out = out_dir or Path("reports") / f"capacity-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    console = output_console()
    scale, unit = _x_axis(spec, param)
    for rule in rule_lines(spec, min_tail, min_lifetimes, warmup_s, param):
        console.print(rule, highlight=False)

    def on_start(load: float, spec_at: WorkloadSpec) -> None:
        seconds, requests = planned_size(spec_at)
        length = f"{seconds:,.0f} s of sending, " if seconds else ""
        console.print(f"running {_label(load, param, scale)}: {length}~{requests:,.0f} requests",
                      highlight=False)  # fmt: skip

    def on_step(step: Step) -> None:
        console.print(Text.assemble(f"step {_label(step.load, param, scale)}: ",
                                    _status_text(step)))  # fmt: skip
        if step.steady is not None:
            console.print(f"  {evidence_line(step)}", highlight=False)

    with _target_url(url, spec, quiet) as base_url:
        run_one = _run_one(base_url, seed, out / "steps", lag_bound_ms, quiet)
        run_step = step_runner(spec, run_one, param=param, min_tail=min_tail, warmup_s=warmup_s,
                               min_lifetimes=min_lifetimes, lag_bound_ms=lag_bound_ms,
                               on_start=on_start)  # fmt: skip
        found = search(run_step, loads, resolution=resolution, integer=integer, on_step=on_step)
    verdict = judge(found, proposed, safety_margin=safety_margin) if proposed else None
    console.print(steps_table(found, param, scale))
    base_rate = base_rate_per_s(spec) if param == "rate" else None
    settings = locals_for_json(param, loads, resolution, min_tail, min_lifetimes, warmup_s,
                               safety_margin, proposed, base_rate)  # fmt: skip
    _write(out, found, verdict, (scale, unit, base_rate), settings)
    for line in _conclusion(found, verdict, param, scale, safety_margin):
        console.print(line)
    console.print(f"knee plot, capacity.json and step runs: {out}")
    sys.exit(exit_code(found, verdict))


def _load_value(spec: WorkloadSpec, param: str, text: str | None, flag: str) -> float | None:
    """A load in search units: a rate multiplier (from `2x` or total req/s), or a cap."""

    if text is None:
        return None
    if param == "rate":
        try:
            return rate_scale(spec, text)
        except ConfigError as exc:
            raise ConfigError("command line", flag, exc.problem, exc.fix) from None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError("command line", flag, f"must be a cap >= 1 (got {text!r})", "e.g. 16")
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
            raise ConfigError("command line", "--steps", "loads must increase", "e.g. 1x,2x,4x")
        return values
    first = _load_value(spec, param, start or ("1" if integer else "0.5x"), "--start")
    last = _load_value(spec, param, maximum or ("256" if integer else "16x"), "--max")
    assert first is not None  # defaults given
    assert last is not None
    if last < first:
        raise ConfigError("command line", "--max", f"must be >= --start (got {maximum})")
    return geometric_loads(first, last, factor, integer=integer)


def _x_axis(spec: WorkloadSpec, param: str) -> tuple[float, str]:
    """What one load unit is on the page: req/s in rate mode when the rate is known."""
    if param == "max_in_flight":
        return 1.0, "max in flight (concurrent requests)"
    base = base_rate_per_s(spec)
    if base is None:
        return 1.0, "load (× the workload's rates)"
    return base, "arrival rate (req/s, all classes)"


def _label(load: float, param: str, scale: float) -> str:
    if param == "max_in_flight":
        return f"{load:g} in flight"
    return f"{load:.3g}x ({load * scale:.3g} req/s)" if scale != 1.0 else f"{load:.3g}x"


def rule_lines(
    spec: WorkloadSpec, min_tail: int, min_lifetimes: float, warmup_s: float | None, param: str
) -> list[str]:
    """The rules every step is judged by, stated before the first step runs."""
    required = required_requests(spec, min_tail)
    parts = [
        f"{name} p{spec.classes[name].slo.percentile:g} needs >= {n:,} judged requests"
        for name, n in required.items()
    ]
    warmup = (
        f"the first {warmup_s:g} s"
        if warmup_s is not None
        else f"the first 10 % or {WARMUP_LIFETIMES:g} mean lifetimes, whichever is longer,"
    )
    lines = [
        f"each step: {'; '.join(parts) or 'no percentile SLOs'} ({min_tail} beyond the "
        f"percentile: n >= {min_tail}/(1 - p/100)), and its judged part lasts >= "
        f"{min_lifetimes:g} mean lifetimes (intended → end) of its own requests; {warmup} "
        "of each step is warm-up, left out",
    ]
    if param == "rate":
        lines.append(
            f"a step passes only at a steady state: completed within {RATE_TOLERANCE:.0%} of "
            "the offered rate, requests in flight and TTFT from intended not rising across "
            "the judged part (10 slices; beyond a 99.9 % one-sided bound from their scatter "
            "and beyond one request's worth), and every SLO met"
        )
    else:
        lines.append(
            "a closed loop sends as fast as it completes, so every step is steady at its cap; "
            "latencies are judged from the send, and every SLO must be met"
        )
    return lines


def evidence_line(step: Step) -> str:
    """One step's steady-state evidence: rates, lifetimes, trends."""
    steady = step.steady
    assert steady is not None
    share = steady.completed_share
    parts = [
        f"offered {steady.offered_per_s:.3g} req/s, completed {steady.completed_per_s:.3g}"
        + (f" ({share:.1%})" if share is not None else ""),
        f"judged {steady.window_s:.1f} s = "
        + (f"{steady.lifetimes:.1f} lifetimes of {steady.lifetime_s:.3g} s"
           if steady.lifetimes is not None and steady.lifetime_s is not None
           else "no lifetime measured"),
        f"mean in flight {steady.mean_in_flight:.3g}",
    ]  # fmt: skip
    for trend in steady.trends:
        unit = " ms" if trend.series == "ttft_ms" else ""
        name = "TTFT" if trend.series == "ttft_ms" else "in flight"
        parts.append(
            f"{name} {trend.rise:+.3g}{unit} (bound {trend.allowance:.2g}, floor "
            f"{trend.floor:.2g}){' RISING' if trend.rising else ''}"
        )
    if step.attempts > 1:
        parts.append("run twice (the first was too short)")
    return " · ".join(parts)


@contextlib.contextmanager
def _target_url(url: str | None, spec: WorkloadSpec, quiet: bool) -> Iterator[str]:
    """The URL, the file's, or one built-in simulator kept up for every step."""
    with target_url(url, spec) as (base_url, args):
        if args is not None and not quiet:
            click.echo(f"started the built-in simulator at {base_url} {' '.join(args)}", err=True)
        yield base_url


def _run_one(
    url: str, seed: int | None, out: Path, lag_bound_ms: float, quiet: bool
) -> Callable[[WorkloadSpec, int | None, str], tuple[pl.DataFrame, bool, bool, Path]]:
    first = [True]

    def run_one(
        spec: WorkloadSpec, cap: int | None, run_id: str
    ) -> tuple[pl.DataFrame, bool, bool, Path]:
        options = RunOptions(
            url=url, seed=seed, out_dir=out, run_id=run_id, max_in_flight=cap, quiet=quiet,
            lag_bound_ms=lag_bound_ms, check_target=first[0],
        )  # fmt: skip
        first[0] = False
        result = execute(spec, options)
        fell_behind = bool(result.summary["verdict"]["fell_behind"])
        return read_records(result.run_dir), fell_behind, result.interrupted, result.run_dir

    return run_one


def _status_text(step: Step) -> Text:
    colour = {PASS: "green", FAIL: "red", INVALID: "yellow"}.get(step.status, "magenta")
    text = Text(step.status.upper(), style=f"bold {colour}")
    if step.note:
        text.append(f" ({step.note})")
    return text


def steps_table(found: Search, param: str, scale: float) -> Table:
    """One row per step, in load order: counts, attainment, goodput vs throughput, latencies."""
    names = sorted({n for s in found.steps for n in s.classes})
    required = max((c.required or 0 for s in found.steps for c in s.classes.values()), default=0)
    title = "capacity steps (after warm-up" + (f"; judged >= {required:,}" if required else "")
    table = Table(box=box.SIMPLE_HEAD, title=title + "; latencies in ms)")
    table.add_column("load", justify="right")
    if param == "rate" and scale != 1.0:
        table.add_column("req/s", justify="right")
    for heading in ("judged", "done\n%", "life-\ntimes", "in flight\nrise", "TTFT\nrise",
                    "attain.", "good\ntok/s", "thru\ntok/s"):  # fmt: skip
        table.add_column(heading, justify="right")
    for name in names:
        p = next(s.classes[name].percentile for s in found.steps if name in s.classes)
        table.add_column(f"{name}\nTTFT p{p:g}", justify="right")
        table.add_column(f"{name}\nTPOT p{p:g}", justify="right")
    table.add_column("verdict")
    for step in sorted(found.steps, key=lambda s: s.load):
        cells: list[str | Text] = [f"{step.load:.3g}" + ("x" if param == "rate" else "")]
        if param == "rate" and scale != 1.0:
            cells.append(f"{step.load * scale:.3g}")
        cells += [
            f"{step.requests:,}",
            *_steady_cells(step),
            "—" if step.attainment is None else f"{step.attainment:.1%}",
            _num(step.goodput_tok_per_s),
            _num(step.throughput_tok_per_s),
        ]
        for name in names:
            figures = step.classes.get(name)
            cells += [_ms(figures, "ttft"), _ms(figures, "tpot")]
        colour = {PASS: "green", FAIL: "red", INVALID: "yellow"}.get(step.status, "magenta")
        cells.append(Text(step.status.upper(), style=f"bold {colour}"))
        table.add_row(*cells)
    return table


def _steady_cells(step: Step) -> list[str | Text]:
    """Completed req/s (share of offered), lifetimes judged, in-flight and TTFT rise."""
    steady = step.steady
    if steady is None:
        return ["—"] * 4
    share = steady.completed_share
    done = "—" if share is None else f"{share:.0%}"
    trends = {t.series: t for t in steady.trends}
    cells: list[str | Text] = [
        Text(done, style="red") if step.over_saturated else done,
        "—" if steady.lifetimes is None else f"{steady.lifetimes:.0f}",
    ]
    for series, form in (("in_flight", "{:+,.1f}"), ("ttft_ms", "{:+,.0f}")):
        trend = trends.get(series)
        if trend is None:
            cells.append("—")
            continue
        text = form.format(trend.rise)
        cells.append(Text(text, style="red") if trend.rising else text)
    return cells


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _ms(figures: Any, metric: str) -> str | Text:
    if figures is None:
        return "—"
    value = getattr(figures, f"{metric}_ms")
    slo = getattr(figures, f"{metric}_slo_ms")
    if value is None:
        return Text("fail", style="red") if figures.requests else "—"
    text = f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
    return Text(text, style="red") if slo is not None and value > slo else text


def _conclusion(
    found: Search, verdict: Verdict | None, param: str, scale: float, safety_margin: float
) -> list[Text]:
    lines = []
    stopped = found.stopped_by
    if stopped is not None and stopped.status == INVALID:
        lines.append(Text(
            f"stopped at {_label(stopped.load, param, scale)}: {stopped.note}; the search "
            "went no further, so loads above the highest pass stay unjudged", style="yellow",
        ))  # fmt: skip
    if found.capacity is not None:
        lines.append(Text(
            f"over-saturated, the server served at most {_label(found.capacity, param, scale)}; "
            f"no load at or above {_label(found.ceiling or 0, param, scale)} "
            f"({1 - RATE_TOLERANCE:.0%} of it) can pass"
        ))  # fmt: skip
    if found.highest_pass is None:
        lines.append(Text("no load passed every SLO: lower --start", style="bold red"))
    elif found.upper is None:
        lines.append(Text(f"highest passing load {_label(found.highest_pass, param, scale)}; "
                          "no step failed, so the knee lies above it: raise --max"))  # fmt: skip
    else:
        bound = (
            f"the first failing load {_label(found.first_fail, param, scale)}"
            if found.first_fail is not None and found.upper == found.first_fail
            else f"the capacity bound {_label(found.upper, param, scale)}"
        )
        lines.append(Text(
            f"highest passing load {_label(found.highest_pass, param, scale)}, "
            f"{found.margin:.1%} below {bound}", style="bold",
        ))  # fmt: skip
    if verdict is not None:
        lines.append(_verdict_line(verdict, param, scale, safety_margin))
    return lines


def _verdict_line(verdict: Verdict, param: str, scale: float, safety_margin: float) -> Text:
    word = Text("PASS", style="bold green") if verdict.passed else Text("FAIL", style="bold red")
    proposed = _label(verdict.proposed, param, scale)
    if verdict.allowed is None:
        reason = "no load passed every SLO"
    else:
        allowed = _label(verdict.allowed, param, scale)
        relation = "<=" if verdict.passed else ">"
        reason = (f"{proposed} {relation} {allowed} = highest pass less the "
                  f"{safety_margin:.0%} safety margin")  # fmt: skip
    return Text.assemble("proposed limit ", proposed, ": ", word, f" ({reason})")


def locals_for_json(
    param: str, loads: list[float], resolution: float, min_tail: int, min_lifetimes: float,
    warmup_s: float | None, safety_margin: float, proposed: float | None,
    base_rate: float | None,
) -> dict[str, Any]:  # fmt: skip
    """The settings capacity.json records beside the steps."""
    return {
        "param": param, "loads": loads, "resolution": resolution, "min_tail": min_tail,
        "min_lifetimes": min_lifetimes, "rate_tolerance": RATE_TOLERANCE, "warmup_s": warmup_s,
        "safety_margin": safety_margin, "proposed_limit": proposed,
        "load_unit": "max_in_flight" if param == "max_in_flight" else "rate multiplier",
        "base_rate_per_s": base_rate,
    }  # fmt: skip


def _write(
    out: Path, found: Search, verdict: Verdict | None, axis: tuple[float, str, float | None],
    settings: dict[str, Any],
) -> None:  # fmt: skip
    scale, unit, base_rate = axis
    out.mkdir(parents=True, exist_ok=True)
    data = to_json(found, verdict, settings, base_rate)
    (out / "capacity.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out / "knee.png").write_bytes(knee_png(found, x_scale=scale, x_label=unit))
