"""`loadgen run`: run a workload against an endpoint and audit its SLOs."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.text import Text

from loadgen.analysis.repeats import repeats_of
from loadgen.cli.exits import RUN_EXITS
from loadgen.cli.live_options import live_options, open_live, price_options
from loadgen.cli.options import (
    LOAD,
    OUTPUT,
    VERDICT,
    GroupedHelp,
    check_memory_line,
    check_report_paths,
    check_run_id,
    check_run_step_options,
    check_url,
    clean_errors,
    option,
    output_console,
    run_step_options,
    shared_run_options,
    shared_spec,
    url_option,
    workload_options,
    write_text,
)
from loadgen.cli.ray_options import ray_options, ray_settings
from loadgen.cli.span_options import check_receiver, receiver_options
from loadgen.engine.preflight import check_reachable
from loadgen.engine.transport import make_endpoint
from loadgen.engine.warmup import warm_capped_note, warm_count
from loadgen.errors import VERDICT_PRECEDENCE, OptionError
from loadgen.render.cache_view import cache_plan_line
from loadgen.render.plan_view import render_plan
from loadgen.render.repeats_view import repeats_file, spread_markdown, spread_table
from loadgen.render.run_checks import (
    render_repeats_junit,
    render_repeats_markdown,
    render_run_junit,
    render_run_markdown,
)
from loadgen.render.terminal import render_processes, render_summary, target_line
from loadgen.results.runfolder import new_run_id
from loadgen.results.write import write_files
from loadgen.run.execute import RunResult, execute
from loadgen.run.live import parse_listen
from loadgen.run.options import RunOptions
from loadgen.run.prepare import prepare
from loadgen.workload.shards import parse_share, parse_start_at
from loadgen.workload.spec import WorkloadSpec, redact_url


@click.command(cls=GroupedHelp, epilog=RUN_EXITS)
@click.argument("workload", type=click.Path(dir_okay=False, path_type=Path))
@url_option
@workload_options
@run_step_options
@option(
    OUTPUT,
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports"),
    show_default=True,
    help="Results store; the run lands in OUT/<run-id>/.",
)
@option(
    OUTPUT,
    "--run-id",
    help="Name of the run folder: letters, digits and -_. (default: UTC time, workload name, "
    "random).",
)
@option(
    LOAD,
    "--max-in-flight",
    type=click.IntRange(min=1, max=1_000_000),
    help="Cap on concurrent requests; waits for a slot count in latency.",
)
@option(
    OUTPUT,
    "--sim-trace",
    is_flag=True,
    help="With the built-in simulator, keep its server-side trace in the run folder.",
)
@option(
    VERDICT,
    "--repeats",
    type=click.IntRange(min=1, max=1000),
    default=1,
    show_default=True,
    help="Run the workload this many times, one run folder each (RUN-ID-r1, ...), then print "
    "the between-run spread of each class's figures with a t-interval and write it to "
    "OUT/RUN-ID/repeats.json; exits with the worst run's code.",
)
@option(
    LOAD,
    "--shard",
    "shard_text",
    metavar="I/N",
    help="Run only shard I (from 0) of N of the schedule; needs --start-at. Merge the N run "
    "folders with `loadgen merge`.",
)
@option(
    LOAD,
    "--start-at",
    "start_at_text",
    metavar="EPOCH",
    help="Agreed wall-clock start of t0: unix seconds or ISO 8601 (UTC without an offset).",
)
@receiver_options
@ray_options
@option(
    LOAD,
    "--start-when-told",
    is_flag=True,
    hidden=True,  # the driver's side of `--ray` (run.processes.told): not for people
    help="With --shard: say ready on stdout, read the agreed start from stdin.",
)
@live_options
@price_options
@option(
    OUTPUT,
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the run's SLO checks as JUnit XML: a testcase per class per check (with "
    "--repeats, every run's, each run's suites named RUN-ID.CLASS).",
)
@option(
    OUTPUT,
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the same checks as a Markdown table (for a CI job summary; with --repeats, "
    "every run's checks and the between-run spread).",
)
@option(
    OUTPUT,
    "--dry-run",
    is_flag=True,
    help="Validate everything the run would use (file, flags, URL, headers, run folder, "
    "memory), print the plan, then stop: nothing is sent or written (the URL is connected "
    "to, and the connection closed, to see it accepts connections).",
)
@clean_errors
def run(
    workload: Path,
    out_dir: Path,
    run_id: str | None,
    max_in_flight: int | None,
    sim_trace: bool,
    otlp_receiver: str | None,
    otlp_receiver_grace_s: float,
    repeats: int,
    shard_text: str | None,
    start_at_text: str | None,
    start_when_told: bool,
    dry_run: bool,
    prometheus_listen: str | None,
    prometheus_grace_s: float,
    otlp_endpoint: str | None,
    otlp_interval_s: float,
    junit_path: Path | None,
    markdown_path: Path | None,
    ray_address: str | None,
    ray_shards: int | None,
    max_clock_skew_ms: float,
    **shared: Any,
) -> None:  # the shared options (loadgen.cli.options) come in `shared`
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
      loadgen run workloads/chat.yaml --url http://gpu:8000 --ray auto --shards 8
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --dry-run
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --warm-connections 0
      loadgen run workloads/mixed.yaml --server-metrics-url /metrics
      loadgen run workloads/chat.yaml --url http://gw:8000 --server-metrics-url \\
        http://gpu:8000/metrics --server-metrics-header 'Authorization: Bearer ${TOKEN}'
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --prometheus-port 9464
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --otlp-receiver 4318
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000 --otlp-receiver grpc:4317
      loadgen run workloads/chat.yaml --url http://gpu:8000 --junit junit.xml --markdown slo.md
      loadgen run workloads/chat.yaml --url http://gpu:8000 --price-per-hour 2.50 --replicas 4
      loadgen run workloads/chat.yaml --url http://gpu:8000 --cache warm
      loadgen run workloads/chat-smoke.yaml --url http://gpu:8000 --repeats 5 --run-id tonight
    """

    check_run_id(run_id)
    check_report_paths(("--junit", junit_path), ("--markdown", markdown_path))
    if prometheus_listen is not None:
        parse_listen(prometheus_listen)  # a bad value is refused by --dry-run too
    if repeats > 1:
        check_repeats(shard_text)
    if start_when_told and (shard_text is None or start_at_text is not None):
        raise OptionError(
            "--start-when-told", "needs --shard and no --start-at",
            "it is how `--ray` starts its shards; use --start-at by hand",
        )  # fmt: skip
    if shard_text is not None and start_at_text is None and not start_when_told:
        raise OptionError("--shard", "needs an agreed start",
                          "add --start-at EPOCH, the same for every shard")  # fmt: skip
    ray = ray_settings(
        ray_address, ray_shards, max_clock_skew_ms, **{
            "--shard": shard_text, "--start-at": start_at_text, "--repeats": repeats > 1,
            "--workers": (shared.get("workers") or 1) > 1, "--prometheus-port": prometheus_listen,
            "--otlp-endpoint": otlp_endpoint, "--sim-trace": sim_trace,
            "--otlp-receiver": otlp_receiver,
        },
    )  # fmt: skip
    check_url(shared["url"])
    spec = shared_spec(workload, shared)
    check_receiver(otlp_receiver, simulator=not (shared["url"] or spec.target.url))
    check_run_step_options(shared, spec)
    memory = check_memory_line(spec, shared["seed"], shared["max_memory_gb"])
    options = shared_run_options(
        shared, out_dir=out_dir, run_id=run_id, max_in_flight=max_in_flight,
        sim_trace=sim_trace, otlp_receiver=otlp_receiver,
        otlp_receiver_grace_s=otlp_receiver_grace_s,
        shard=parse_share(shard_text) if shard_text is not None else None,
        start_at_unix_ns=parse_start_at(start_at_text) if start_at_text is not None else None,
        start_when_told=start_when_told,
    )  # fmt: skip
    if dry_run:
        _dry_run(spec, options, memory)
        return
    price_per_hour = shared["price_per_hour"]
    fleet = None if price_per_hour is None else price_per_hour * shared["replicas"]
    live = open_live(prometheus_listen, prometheus_grace_s, otlp_endpoint, otlp_interval_s,
                     price_per_hour=fleet, network=options.network)  # fmt: skip
    if repeats > 1:
        base = run_id or new_run_id(spec.name)
        check_run_id(f"{base}-r{repeats}")
    with live as exporter:
        results = []
        for index in range(1, repeats + 1):
            each = options if repeats == 1 else replace(options, run_id=f"{base}-r{index}")
            with sigterm_as_ctrl_c():  # the run's engine takes both signals over from t0
                result = execute(spec, each, ray=ray, live=exporter)
            results.append(result)
            if repeats == 1:
                _print_result(result, junit_path, markdown_path)
            else:  # each repeat's table; the JUnit and Markdown cover them all, at the end
                _print_result(result, None, None)
            if result.interrupted:  # Ctrl-C, SIGTERM or the watchdog: no more repeats
                break
        if repeats > 1:
            _print_repeats(results, out_dir / base, junit_path, markdown_path)
    sys.exit(worst_exit(r.exit_code for r in results))


def _print_result(result: RunResult, junit_path: Path | None, markdown_path: Path | None) -> None:
    """One run's table, its processes, where it went, and its JUnit/Markdown files."""
    console = output_console()
    console.print(render_summary(result.summary))
    if (against := target_line(result.run_info.target)) is not None:
        console.print(against)
    for line in render_processes(result.run_info):
        console.print(line)
    console.print(f"records and summary: {result.run_dir}")
    target = result.run_info.target
    for path, text in ((junit_path, render_run_junit), (markdown_path, render_run_markdown)):
        if path is not None:
            write_text(path, text(result.summary, target))
            console.print(f"wrote {path}")
    if result.watchdog:
        console.print(Text.assemble(("stopped by the watchdog:", "bold red"),
                                    f" {result.watchdog} (exit 4)"))  # fmt: skip


def _print_repeats(
    results: list[RunResult], folder: Path, junit_path: Path | None, markdown_path: Path | None
) -> None:
    """The between-run spread of the repeats, and repeats.json in `folder`; the JUnit (each
    run's suites) and the Markdown (every run's checks, the spread) of them all."""
    summaries = [r.summary for r in results]
    spread = repeats_of(summaries)
    console = output_console()
    console.print(spread_table(spread))
    verdicts = ", ".join(f"{r.run_dir.name} {r.summary.verdict.status}" for r in results)
    console.print(f"repeats: {verdicts}")
    for path in write_files(folder, repeats_file(spread)):
        console.print(f"wrote {path}")
    target = results[0].run_info.target
    if junit_path is not None:
        write_text(junit_path, render_repeats_junit(summaries, target))
        console.print(f"wrote {junit_path}")
    if markdown_path is not None:
        worst = worst_exit(r.exit_code for r in results)
        text = render_repeats_markdown(summaries, worst, spread_markdown(spread), target)
        write_text(markdown_path, text)
        console.print(f"wrote {markdown_path}")


def worst_exit(codes: Iterable[int]) -> int:
    """The code that speaks for several runs (`errors.VERDICT_PRECEDENCE`)."""
    seen = set(codes)
    return next((code for code in VERDICT_PRECEDENCE if code in seen), max(seen, default=0))


def check_repeats(shard_text: str | None) -> None:
    """--repeats runs whole runs on one host, each judged on its own."""
    if shard_text is not None:
        raise OptionError("--repeats", "does not combine with --shard",
                          "repeat the sharded run (and its merge) instead")  # fmt: skip


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM before t0 (during the preflight, the simulator's start) stops the command as
    Ctrl-C does: exit 130, as the run maps it (README, Exit codes), not the default 143."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread (an embedding program's call)
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _dry_run(spec: WorkloadSpec, options: RunOptions, memory: str) -> None:
    """Everything `run` checks before it sends (`run.prepare`: plans, shard, headers and
    their ${VAR}s, the simulator profile, the cache mode, the run folder), then the plan;
    nothing is sent or written."""

    ready = prepare(spec, options)
    work, url = ready.work, ready.url
    proxy = options.network.proxy_for(url) if url is not None else None
    if url is not None:  # a URL that cannot be reached is not valid: a TCP connect, no request
        check_reachable(make_endpoint(url, "/", {}, proxy=proxy))  # to its proxy, behind one
    console = output_console()
    console.print(render_plan(spec, work.plans))
    console.print(memory)
    console.print(cache_plan_line(spec.cache, options.nonce))
    warm = warm_count(work, options.warm_connections, None, options.max_in_flight)
    how = "auto" if options.warm_connections is None else "--warm-connections"
    capped = warm_capped_note(work, options.warm_connections, None, options.max_in_flight)
    console.print(f"warm connections: {warm:,} opened before t0 ({capped or how})",
                  soft_wrap=True)  # fmt: skip
    reached = f"its proxy {proxy.shown} accepts connections" if proxy else "it accepts connections"
    target = f"{redact_url(url)} ({reached})" if url else "the built-in simulator"
    count = len(work.plans)
    console.print(f"dry run: valid; would send {count:,} requests to {target}; nothing was sent")
