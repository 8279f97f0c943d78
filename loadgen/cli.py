"""The command line: thin commands that parse, call the library, and render.

Exit codes: 0 every SLO met; 1 usage or configuration error; 2 an SLO missed;
3 the generator fell behind or the client failed (its numbers are not the server's);
4 stopped by the watchdog; 5 incomplete (killed, then recovered); 130 interrupted.
4, 5 and 130 are no verdict.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from loadgen import __version__
from loadgen.errors import LoadgenError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES_HELP = """\b
Exit codes:
  0    every SLO of every class met
  1    usage or configuration error (bad file, unreachable target)
  2    an SLO was missed
  3    the generator fell behind, or the client failed (out of disk space, file
       descriptors or permission mid-run): its numbers are not the server's
  4    the watchdog stopped a run where nothing progressed; records are written
  5    incomplete: a run killed outright, finished by report --recover (no verdict)
  130  interrupted (Ctrl-C / SIGTERM); records and summary are still written (no
       verdict: the figures are partial)"""


def clean_errors(func: F) -> F:
    """Turn a LoadgenError into its message on stderr and its exit code (1 for a bad input,
    3 for a client-side failure mid-run), never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except LoadgenError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature


class FiniteFloat(click.ParamType):  # type: ignore[type-arg]  # generic only in click's stubs
    """A finite number in [low, high] (or (low, high] with `low_open`): click's FloatRange
    lets `nan` through, and `inf` wherever there is no upper bound."""

    name = "number"

    def __init__(self, low: float, high: float, *, low_open: bool = False) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        low_ok = number > self.low if self.low_open else number >= self.low
        if not (math.isfinite(number) and low_ok and number <= self.high):
            bound = ">" if self.low_open else ">="
            span = f"{bound} {self.low:g} and <= {self.high:,.0f}"
            self.fail(f"must be a finite number {span} (got {value!r})", param, ctx)
        return number


MAX_WAIT_S = 31 * 86_400  # = loadgen.spec.MAX_SPAN_S (loadgen.spec is imported lazily)
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str | None) -> None:
    """A run id names one folder inside --out: letters, digits and `-_.`, never a path."""
    if run_id is not None and not RUN_ID.match(run_id):
        raise click.BadParameter(
            f"{run_id!r:.80} is not a safe folder name: use letters, digits and -_. (starting "
            "with a letter or digit, at most 128 characters), e.g. nightly-2026-11-29",
            param_hint="--run-id",
        )


def check_url(url: str | None) -> None:
    """A base URL that can be connected to: http(s), a host, a port in 1-65535."""
    from loadgen.spec import url_problem

    if url is not None and (problem := url_problem(url)):
        raise click.BadParameter(f"it {problem}", param_hint="--url")


def memory_cap(max_memory_gb: float | None) -> tuple[int, str]:
    """The plan memory cap in bytes, and where it came from (for the error)."""
    from loadgen.plans import default_memory_cap

    if max_memory_gb is not None:
        return round(max_memory_gb * 1024**3), f"--max-memory-gb {max_memory_gb:g}"
    return default_memory_cap()


class LoadgenGroup(click.Group):
    """A click group whose usage errors exit with 1, not click's 2 (2 means an SLO missed)."""

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


def workload_options(func: F) -> F:
    """--requests, --duration, --rate, --seed, --api, --model, --force-output-tokens: what
    `check` and `run` both change (applied by `spec.override`)."""
    from loadgen.adapters import APIS
    from loadgen.spec import MAX_REQUESTS, MAX_SEED, MAX_SPAN_S

    options = [
        click.option("--requests", type=click.IntRange(min=1, max=MAX_REQUESTS),
                     help="Requests (or sessions, trajectories) per class, replacing the file's."),
        click.option("--duration", type=FiniteFloat(0, MAX_SPAN_S, low_open=True),
                     help="Seconds of arrivals per class, replacing the file's."),
        click.option("--rate", help="Total req/s across classes (e.g. 8), or a multiplier (2x)."),
        click.option("--seed", type=click.IntRange(min=0, max=MAX_SEED),
                     help="Seed for arrivals, lengths and prompts (default: the file's, else 0)."),
        click.option("--api", type=click.Choice(APIS),
                     help="API family, replacing target.api; the path follows it unless "
                     "target.path is set."),
        click.option("--model", help="Model name sent in every request, replacing target.model."),
        click.option("--force-output-tokens/--no-force-output-tokens", default=None,
                     help="Send ignore_eos + min_tokens (OpenAI APIs), replacing "
                     "target.force_output_tokens; servers that reject them answer HTTP 422."),
        click.option("--max-memory-gb", type=FiniteFloat(0, 1e6, low_open=True),
                     help="Refuse a plan whose estimated client memory (plans, records and "
                     "their audit) exceeds this many GiB (default: half of this host's memory)."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


@click.group(cls=LoadgenGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="loadgen")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Log to stderr (and the run's loadgen.log): -v info, -vv debug with every request.",
)
def cli(verbose: int) -> None:
    """loadgen: load generator and SLO auditor for streaming LLM endpoints.

    \b
    Example:
      loadgen check workloads/chat.yaml
      loadgen run workloads/chat.yaml                      # against the built-in simulator
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000
    """
    from loadgen.logs import configure

    configure(verbose)


@cli.command()
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@workload_options
@click.option(
    "--schedule", "show_schedule", is_flag=True, help="Also print the first intended send times."
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
    max_memory_gb: float | None,
    show_schedule: bool,
) -> None:
    """Validate a workload file and print its plan; sends nothing.

    \b
    Example:
      loadgen check workloads/chat.yaml
      loadgen check workloads/chat.yaml --rate 2x --schedule
      loadgen check workloads/chat.yaml --api anthropic --model claude-haiku-4-5
    """
    from loadgen.plan_view import render_plan
    from loadgen.plans import plan_run
    from loadgen.sim.launch import sim_args_from_mapping
    from loadgen.spec import load, override

    spec = override(load(workload), requests=requests, duration_s=duration, rate=rate,
                    api=api, model=model, force_output_tokens=force_output_tokens)  # fmt: skip
    sim_args_from_mapping(spec.sim, spec.source)  # the built-in simulator's profile
    memory = _check_memory(spec, seed, max_memory_gb)
    plans = plan_run(spec, seed)
    console = output_console()
    console.print(render_plan(spec, plans, show_schedule=show_schedule))
    console.print(memory)


def _check_memory(spec: Any, seed: int | None, max_memory_gb: float | None) -> str:
    """Refuse a plan over the memory cap (before building it); the line `check` prints."""
    from loadgen.inputs import size_text
    from loadgen.plans import check_memory

    cap, source = memory_cap(max_memory_gb)
    estimate = check_memory(spec, cap, source, seed)
    return f"client memory: {estimate.text()} (cap {size_text(cap)}: {source})"


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--url",
    help="Base URL of the endpoint, e.g. http://127.0.0.1:8000. "
    "Without it (and without target.url) the built-in simulator is started.",
)
@workload_options
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports"),
    show_default=True,
    help="Results store; the run lands in OUT/<run-id>/.",
)
@click.option(
    "--run-id",
    help="Name of the run folder: letters, digits and -_. (default: UTC time, workload name, "
    "random).",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1, max=1_000_000),
    help="Cap on concurrent requests; waits for a slot count in latency.",
)
@click.option(
    "--lag-bound-ms",
    type=FiniteFloat(0, 3_600_000, low_open=True),
    default=5.0,
    show_default=True,
    help="Send lag above which a send is late; > 1 % (and > 1) late sends: exit 3.",
)
@click.option(
    "--grace",
    "grace_s",
    type=FiniteFloat(0, 86_400),
    default=5.0,
    show_default=True,
    help="Seconds in-flight requests get to finish after Ctrl-C.",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="NAME:VALUE",
    help="Extra request header (repeatable); ${VAR} is read from the environment.",
)
@click.option("--no-preflight", is_flag=True, help="Skip the one-request check of the target.")
@click.option(
    "--preflight-timeout",
    "preflight_timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    help="The preflight's overall deadline in seconds (default: the longest "
    "deadlines.first_token_s of the classes; never more than --watchdog).",
)
@click.option(
    "--sim-trace",
    is_flag=True,
    help="With the built-in simulator, keep its server-side trace in the run folder.",
)
@click.option(
    "--watchdog",
    "watchdog_s",
    type=FiniteFloat(0, MAX_WAIT_S, low_open=True),
    default=300.0,
    show_default=True,
    help="Abort (exit 4) when nothing progresses this many seconds while requests are due.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=256),
    help="Engine processes sharing the schedule (default 1; one per core when the expected "
    "peak exceeds this host's calibrated envelope).",
)
@click.option(
    "--shard",
    "shard_text",
    metavar="I/N",
    help="Run only shard I (from 0) of N of the schedule; needs --start-at. Merge the N run "
    "folders with `loadgen merge`.",
)
@click.option(
    "--start-at",
    "start_at_text",
    metavar="EPOCH",
    help="Agreed wall-clock start of t0: unix seconds or ISO 8601 (UTC without an offset).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress line, only the final table.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate everything the run would use (file, flags, URL, headers, run folder, "
    "memory), print the plan, then stop: nothing is sent or written.",
)
@clean_errors
def run(
    workload: Path,
    url: str | None,
    requests: int | None,
    duration: float | None,
    rate: str | None,
    seed: int | None,
    api: str | None,
    model: str | None,
    force_output_tokens: bool | None,
    out_dir: Path,
    run_id: str | None,
    max_in_flight: int | None,
    lag_bound_ms: float,
    grace_s: float,
    headers: tuple[str, ...],
    no_preflight: bool,
    preflight_timeout_s: float | None,
    sim_trace: bool,
    watchdog_s: float,
    workers: int | None,
    shard_text: str | None,
    start_at_text: str | None,
    quiet: bool,
    max_memory_gb: float | None,
    dry_run: bool,
) -> None:
    """Run a workload against an endpoint and audit its SLOs.

    Writes OUT/<run-id>/records.parquet (one row per planned request), run.json and
    summary.json, prints a table per class, and exits with the verdict.

    \b
    Example:
      loadgen run workloads/chat.yaml
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --rate 2x --requests 200
      loadgen run workloads/chat.yaml --url http://127.0.0.1:11434 --api ollama-chat --model tiny
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --workers 2
      loadgen run workloads/chat.yaml --url http://gpu:8000 --shard 0/4 --start-at 1764417600
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --dry-run
    """
    from loadgen.errors import ConfigError
    from loadgen.run import RunOptions, execute
    from loadgen.shards import parse_share, parse_start_at
    from loadgen.spec import load, override
    from loadgen.terminal import render_processes, render_summary

    check_url(url)
    check_run_id(run_id)
    if shard_text is not None and start_at_text is None:
        raise ConfigError("command line", "--shard", "needs an agreed start",
                          "add --start-at EPOCH, the same for every shard")  # fmt: skip
    spec = override(load(workload), requests=requests, duration_s=duration, rate=rate,
                    api=api, model=model, force_output_tokens=force_output_tokens)  # fmt: skip
    memory = _check_memory(spec, seed, max_memory_gb)
    options = RunOptions(
        url=url,
        seed=seed,
        out_dir=out_dir,
        run_id=run_id,
        max_in_flight=max_in_flight,
        quiet=quiet,
        lag_bound_ms=lag_bound_ms,
        grace_s=grace_s,
        check_target=not no_preflight,
        preflight_timeout_s=preflight_timeout_s,
        sim_trace=sim_trace,
        watchdog_s=watchdog_s,
        extra_headers=parse_headers(headers),
        workers=workers,
        shard=parse_share(shard_text) if shard_text is not None else None,
        start_at_unix_ns=parse_start_at(start_at_text) if start_at_text is not None else None,
    )
    if dry_run:
        _dry_run(spec, options, memory)
        return
    result = execute(spec, options)
    console = output_console()
    console.print(render_summary(result.summary))
    for line in render_processes(result.run_info):
        console.print(line)
    console.print(f"records and summary: {result.run_dir}")
    if result.watchdog:
        console.print(f"[bold red]stopped by the watchdog:[/] {result.watchdog} (exit 4)")
    sys.exit(result.exit_code)


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--slo",
    "slo_text",
    metavar="KEY=VALUE,...",
    help="Re-audit against other targets, e.g. ttft_ms=800,tpot_ms=40,percentile=95.",
)
@click.option(
    "--window",
    "window_text",
    default=None,
    help="One run: window length in s (default 10). Results store: trailing window, "
    "e.g. 30d (default).",
)
@click.option(
    "--step",
    "step_text",
    default=None,
    help="One run: slide windows by this many s (default: tumbling). "
    "Results store: step between windows, e.g. 1d (default).",
)
@click.option("--class", "class_name", help="Results store: only this class.")
@click.option(
    "--workload",
    "workload_name",
    metavar="NAME",
    help="Results store: only this workload (a name, or NAME@FINGERPRINT as the table shows).",
)
@click.option(
    "--include-incomplete",
    is_flag=True,
    help="Results store: also pool runs that stopped early (interrupted, watchdog, recovered).",
)
@click.option(
    "--exact",
    is_flag=True,
    help="Results store: also compute exact values from records, and the difference.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to write the report (default: PATH/report).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: the summary (or windows) on stdout, for machines.",
)
@click.option(
    "--recover",
    is_flag=True,
    help="One run that was killed: join its record parts and give every planned request a "
    "record (cancelled if it was due, not_sent if not), mark it incomplete (exit 5), write "
    "its summary.json, then report.",
)
@clean_errors
def report(
    path: Path,
    slo_text: str | None,
    window_text: str | None,
    step_text: str | None,
    class_name: str | None,
    workload_name: str | None,
    include_incomplete: bool,
    exact: bool,
    out_dir: Path | None,
    fmt: str,
    recover: bool,
) -> None:
    """Report on one run (HTML, Markdown, JSON) or on a results store over rolling windows.

    For a run folder: re-audits it from its records alone (optionally against other SLOs)
    and writes report.html (self-contained, plots embedded), report.md and summary.json;
    exits with the verdict. For a results store (a folder of runs): each workload's
    classes' percentiles and attainment over a trailing window of its runs, at every step;
    two workloads (name + spec fingerprint) are never pooled, and runs that stopped early
    are left out unless --include-incomplete.

    \b
    Example:
      loadgen report reports/20261129T101500Z-chat-1a2b
      loadgen report reports/20261129T101500Z-chat-1a2b --slo ttft_ms=800,tpot_ms=40
      loadgen report reports/ --window 30d --step 1d --class chat
      loadgen report reports/ --workload chat-smoke --format json
      loadgen report --recover reports/20261129T101500Z-chat-1a2b    # after a SIGKILL
    """
    if (path / "run.json").exists():
        if recover:
            _recover(path)
        _report_run(path, slo_text, window_text, step_text, out_dir, fmt)
    else:
        _report_store(
            path, window_text or "30d", step_text or "1d", class_name, exact, out_dir, fmt,
            workload=workload_name, include_incomplete=include_incomplete,
        )  # fmt: skip


def _dry_run(spec: Any, options: Any, memory: str) -> None:
    """Everything `run` checks before it sends (plans, shard, headers and their ${VAR}s, the
    simulator profile, the run folder), then the plan; nothing is sent or written."""
    from loadgen.errors import ConfigError
    from loadgen.plan_view import render_plan
    from loadgen.plans import plan_work
    from loadgen.run import client_setup
    from loadgen.shards import check_start_at, split_work
    from loadgen.sim.launch import sim_args_from_mapping

    work = plan_work(spec, options.seed)
    if options.shard is not None:
        work = split_work(work, options.shard)
    if options.start_at_unix_ns is not None:
        check_start_at(options.start_at_unix_ns, time.time_ns())
    if not work.plans:
        raise ConfigError(
            spec.source, "classes", "plans no requests", "raise requests or duration_s"
        )
    _, _, _, url = client_setup(spec, options)
    if url is None:
        sim_args_from_mapping(spec.sim, spec.source)
    folder = options.out_dir / options.run_id if options.run_id is not None else None
    if folder is not None and folder.exists():
        raise ConfigError(
            "command line", "--run-id", f"{folder} already exists",
            "runs are never overwritten: choose another --run-id",
        )  # fmt: skip
    console = output_console()
    console.print(render_plan(spec, work.plans))
    console.print(memory)
    target = url or "the built-in simulator"
    count = len(work.plans)
    console.print(f"dry run: valid; would send {count:,} requests to {target}; nothing was sent")


def _recover(run_dir: Path) -> None:
    """Give a killed run one record per plan, then write its summary and histograms."""
    from loadgen.recover import recover
    from loadgen.report import audit_run
    from loadgen.run import write_json_atomic
    from loadgen.store import write_histograms

    done = recover(run_dir)
    if done.nothing_to_do:
        click.echo(f"nothing to recover: {run_dir} already has its records.parquet", err=True)
        return
    summary, frame, slos = audit_run(run_dir)
    write_json_atomic(run_dir / "summary.json", summary)
    write_histograms(run_dir, frame, slos)
    click.echo(
        f"recovered {run_dir}: planned {done.planned} · {done.kept} records kept from its "
        f"parts · {done.cancelled} cancelled (sent, no record survived) · {done.not_sent} "
        "not_sent; marked incomplete (no verdict, exit 5)",
        err=True,
    )


def _report_run(
    run_dir: Path, slo_text: str | None, window_text: str | None, step_text: str | None,
    out_dir: Path | None, fmt: str,
) -> None:  # fmt: skip
    import json

    from loadgen.errors import ConfigError
    from loadgen.report import (
        apply_slo_override,
        build_run_report,
        parse_slo_override,
        read_run_info,
        run_slos,
        write_run_report,
    )  # fmt: skip
    from loadgen.terminal import render_summary

    slos = None
    if slo_text:
        slos = apply_slo_override(run_slos(read_run_info(run_dir)), parse_slo_override(slo_text))
    try:
        window_s = float(window_text) if window_text else 10.0
        step_s = float(step_text) if step_text else None
        built = build_run_report(run_dir, slos=slos, window_s=window_s, sliding_step_s=step_s)
    except ValueError as exc:
        raise ConfigError(
            "command line",
            "--window/--step",
            str(exc),
            "one run takes seconds, e.g. --window 10 --step 5",
        ) from None
    written = write_run_report(built, out_dir or run_dir / "report")
    if fmt == "json":
        click.echo(json.dumps(built.summary, indent=2))
    else:
        console = output_console()
        console.print(render_summary(built.summary))
        for file in written:
            if file.suffix in (".html", ".md", ".json"):
                console.print(f"wrote {file}")
    sys.exit(int(built.summary["verdict"]["exit_code"]))


def _report_store(
    store: Path, window_text: str, step_text: str, class_name: str | None, exact: bool,
    out_dir: Path | None, fmt: str, *, workload: str | None, include_incomplete: bool,
) -> None:  # fmt: skip
    import json

    from loadgen.rolling import (
        parse_duration,
        render_rolling_table,
        rolling_plot,
        rolling_windows,
        to_json,
    )  # fmt: skip
    from loadgen.store import discover_runs, select_runs

    runs = discover_runs(store)
    if not runs:
        raise LoadgenError(f"{store} holds no runs (no */run.json): give a run folder or the "
                           "results store that `loadgen run --out` writes to")  # fmt: skip
    window, step = parse_duration(window_text), parse_duration(step_text)
    selected = select_runs(runs, workload=workload, include_incomplete=True)
    frame = rolling_windows(store, window=window, step=step, class_name=class_name, exact=exact,
                            workload=workload, include_incomplete=include_incomplete)  # fmt: skip
    if fmt == "json":
        click.echo(json.dumps(to_json(frame), indent=2))
        return
    console = output_console()
    console.print(render_rolling_table(frame))
    stopped = [r for r in runs if not r.is_complete and (workload is None or r in selected)]
    if stopped and not include_incomplete:
        console.print("left out, stopped before their end (--include-incomplete pools them): "
                      + ", ".join(f"{r.run_id} ({r.stopped})" for r in stopped))  # fmt: skip
    target = out_dir or store / "rolling-report"
    target.mkdir(parents=True, exist_ok=True)
    slos = {(run.workload_key, name): slo for run in runs for name, slo in run.slos.items()}
    for metric in ("ttft", "tpot"):
        png = target / f"rolling-{metric}.png"
        png.write_bytes(rolling_plot(frame, slo_ms=slos, metric=metric))
        click.echo(f"wrote {png}")
    (target / "rolling.json").write_text(json.dumps(to_json(frame), indent=2) + "\n")
    click.echo(f"wrote {target / 'rolling.json'}")


def output_console() -> Console:
    """stdout for tables: the terminal's width, or 120 columns when piped to a file or CI log."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 120)


def parse_headers(values: tuple[str, ...]) -> dict[str, str]:
    """`NAME:VALUE` strings as a dict; a malformed one is a usage error."""
    from loadgen.spec import header_problem

    headers = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{value!r} is not NAME:VALUE", param_hint="--header")
        if problem := header_problem(name.strip(), rest.strip()):
            raise click.BadParameter(f"{value!r:.80}: {problem}", param_hint="--header")
        headers[name.strip()] = rest.strip()
    return headers


from loadgen.cli_calibrate import calibrate  # noqa: E402
from loadgen.cli_capacity import capacity  # noqa: E402
from loadgen.cli_compare import compare  # noqa: E402
from loadgen.cli_merge import merge  # noqa: E402
from loadgen.cli_plan import plan  # noqa: E402
from loadgen.sim.cli import sim  # noqa: E402

cli.add_command(sim)
cli.add_command(plan)
cli.add_command(compare)
cli.add_command(capacity)
cli.add_command(merge)
cli.add_command(calibrate)


def main() -> None:
    """Console-script entry point."""
    cli()
