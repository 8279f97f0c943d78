"""`loadgen run`: run a workload against an endpoint and audit its SLOs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from loadgen.cli.live_options import live_options, open_live, price_options
from loadgen.cli.options import (
    EXIT_CODES_HELP,
    MAX_WAIT_S,
    FiniteFloat,
    cache_options,
    check_memory_line,
    check_run_id,
    check_url,
    clean_errors,
    output_console,
    parse_headers,
    workload_options,
)
from loadgen.engine.warmup import warm_count
from loadgen.errors import ConfigError, LoadgenError
from loadgen.render.cache_view import cache_plan_line
from loadgen.render.plan_view import render_plan
from loadgen.render.run_checks import render_run_junit, render_run_markdown
from loadgen.render.terminal import render_processes, render_summary
from loadgen.run.execute import RunOptions, cache_warmth, client_setup, execute
from loadgen.run.live import parse_listen
from loadgen.run.simulator import sim_args_from_mapping
from loadgen.workload.plans import plan_work
from loadgen.workload.shards import check_start_at, parse_share, parse_start_at, split_work
from loadgen.workload.spec import load, metrics_url_problem, override


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--url",
    help="Base URL of the endpoint, e.g. http://127.0.0.1:8000. "
    "Without it (and without target.url) the built-in simulator is started.",
)
@workload_options
@cache_options
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
    "--warm-connections",
    "warm_text",
    default="auto",
    show_default=True,
    metavar="N|auto|0",
    help="Connections opened (and checked) before t0, so the first sends carry no "
    "connection setup in their latency; auto: the requests that can be in flight in the "
    "first second (capped at 1024); 0: today's cold start (setup inside TTFT).",
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
@click.option(
    "--server-metrics-url",
    metavar="URL",
    help="Scrape the server's Prometheus endpoint during the run: a URL, or a path on the "
    "target such as /metrics (default: the workload's target.server_metrics_url).",
)
@click.option(
    "--server-metrics-header",
    "metrics_headers",
    multiple=True,
    metavar="NAME:VALUE",
    help="Header sent with each scrape (repeatable; ${VAR} is read from the environment): "
    "the endpoint's own credentials. The target's are sent only to the target's origin.",
)
@click.option(
    "--server-metrics-interval",
    "server_metrics_interval_s",
    type=FiniteFloat(0.05, 3600),
    help="Seconds between scrapes (default: target.server_metrics_interval_s, else 1).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress line, only the final table.")
@live_options
@price_options
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the run's SLO checks as JUnit XML: a testcase per class per check.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the same checks as a Markdown table (for a CI job summary).",
)
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
    cache: str | None,
    nonce: str | None,
    out_dir: Path,
    run_id: str | None,
    max_in_flight: int | None,
    warm_text: str,
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
    server_metrics_url: str | None,
    metrics_headers: tuple[str, ...],
    server_metrics_interval_s: float | None,
    quiet: bool,
    max_memory_gb: float | None,
    dry_run: bool,
    prometheus_listen: str | None,
    prometheus_grace_s: float,
    otlp_endpoint: str | None,
    otlp_interval_s: float,
    junit_path: Path | None,
    markdown_path: Path | None,
    price_per_hour: float | None,
    replicas: int,
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
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --warm-connections 0
      loadgen run workloads/mixed.yaml --server-metrics-url /metrics
      loadgen run workloads/chat.yaml --url http://gw:8000 --server-metrics-url \\
        http://gpu:8000/metrics --server-metrics-header 'Authorization: Bearer ${TOKEN}'
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --prometheus-port 9464
      loadgen run workloads/chat.yaml --url http://gpu:8000 --junit junit.xml --markdown slo.md
      loadgen run workloads/chat.yaml --url http://gpu:8000 --price-per-hour 2.50 --replicas 4
      loadgen run workloads/chat.yaml --url http://gpu:8000 --cache warm
    """

    check_url(url)
    check_run_id(run_id)
    if server_metrics_url is not None and (problem := metrics_url_problem(server_metrics_url)):
        raise click.BadParameter(f"it {problem}", param_hint="--server-metrics-url")
    check_report_paths(("--junit", junit_path), ("--markdown", markdown_path))
    if prometheus_listen is not None:
        parse_listen(prometheus_listen)  # a bad value is refused by --dry-run too
    if shard_text is not None and start_at_text is None:
        raise ConfigError("command line", "--shard", "needs an agreed start",
                          "add --start-at EPOCH, the same for every shard")  # fmt: skip
    spec = override(load(workload), requests=requests, duration_s=duration, rate=rate,
                    api=api, model=model, force_output_tokens=force_output_tokens,
                    cache=cache)  # fmt: skip
    memory = check_memory_line(spec, seed, max_memory_gb)
    if metrics_headers and not (server_metrics_url or spec.target.server_metrics_url):
        raise ConfigError("command line", "--server-metrics-header", "scrapes nothing: no "
                          "metrics URL", "add --server-metrics-url URL (or a path such as "
                          "/metrics), or set target.server_metrics_url")  # fmt: skip
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
        warm_connections=parse_warm(warm_text),
        server_metrics_url=server_metrics_url,
        server_metrics_interval_s=server_metrics_interval_s,
        server_metrics_headers=parse_headers(metrics_headers, "--server-metrics-header"),
        price_per_hour=price_per_hour,
        replicas=replicas,
        nonce=nonce,
    )
    if dry_run:
        _dry_run(spec, options, memory)
        return
    fleet = None if price_per_hour is None else price_per_hour * replicas
    live = open_live(prometheus_listen, prometheus_grace_s, otlp_endpoint, otlp_interval_s,
                     price_per_hour=fleet)  # fmt: skip
    with live as exporter:
        result = execute(spec, options, live=exporter)
        console = output_console()
        console.print(render_summary(result.summary))
        for line in render_processes(result.run_info):
            console.print(line)
        console.print(f"records and summary: {result.run_dir}")
        for path, text in ((junit_path, render_run_junit), (markdown_path, render_run_markdown)):
            if path is not None:
                write_text(path, text(result.summary))
                console.print(f"wrote {path}")
        if result.watchdog:
            console.print(f"[bold red]stopped by the watchdog:[/] {result.watchdog} (exit 4)")
    sys.exit(result.exit_code)


def check_report_paths(*paths: tuple[str, Path | None]) -> None:
    """--junit / --markdown must land in an existing folder: checked before any traffic."""
    for flag, path in paths:
        if path is not None and not (path.parent if str(path.parent) else Path(".")).is_dir():
            raise ConfigError("command line", flag, f"the folder of {path} does not exist",
                              "create it first, or write the file elsewhere")  # fmt: skip


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise LoadgenError(f"cannot write {path}: {exc.strerror}") from None


def _dry_run(spec: Any, options: Any, memory: str) -> None:
    """Everything `run` checks before it sends (plans, shard, headers and their ${VAR}s, the
    simulator profile, the run folder), then the plan; nothing is sent or written."""

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
    cache_warmth(spec, options)  # a --nonce outside cold mode is refused here too
    folder = options.out_dir / options.run_id if options.run_id is not None else None
    if folder is not None and folder.exists():
        raise ConfigError(
            "command line", "--run-id", f"{folder} already exists",
            "runs are never overwritten: choose another --run-id",
        )  # fmt: skip
    console = output_console()
    console.print(render_plan(spec, work.plans))
    console.print(memory)
    console.print(cache_plan_line(spec.cache, options.nonce))
    warm = warm_count(work, options.warm_connections, None)
    how = "auto" if options.warm_connections is None else "--warm-connections"
    console.print(f"warm connections: {warm:,} opened before t0 ({how})")
    target = url or "the built-in simulator"
    count = len(work.plans)
    console.print(f"dry run: valid; would send {count:,} requests to {target}; nothing was sent")


def parse_warm(text: str) -> int | None:
    """`--warm-connections`: a count ≥ 0, or auto (None)."""
    if text.strip().lower() == "auto":
        return None
    try:
        count = int(text)
    except ValueError:
        count = -1
    if not 0 <= count <= 1_000_000:
        problem = f"must be auto or a count 0..1000000 (got {text!r})"
        fix = "e.g. --warm-connections auto, 512, or 0 for a cold start"
        raise ConfigError("command line", "--warm-connections", problem, fix)
    return count
