"""`loadgen report`: one run re-audited and rendered, or a results store over rolling windows."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import polars as pl

from loadgen import codec
from loadgen.analysis.audit import apply_slo_override, parse_slo_override, reaudit
from loadgen.analysis.confidence import RULES
from loadgen.analysis.join import join_line, span_account, trace_id
from loadgen.analysis.rolling import parse_duration, rolling_view, to_json
from loadgen.analysis.windows import WindowError
from loadgen.cli.exits import REPORT_EXITS
from loadgen.cli.options import (
    check_report_paths,
    clean_errors,
    network_options,
    output_console,
    read_network,
    write_text,
)
from loadgen.engine.network import Network
from loadgen.engine.span_query import query_spans
from loadgen.errors import LoadgenError, OptionError, RunBusy
from loadgen.render.report.folder import report_files
from loadgen.render.report.model import build_run_report
from loadgen.render.rolling_view import left_out_line, render_rolling_table, rolling_files
from loadgen.render.run_checks import render_run_junit, render_run_markdown
from loadgen.render.terminal import recovery_line, render_summary, target_line
from loadgen.results.liveness import busy_message, live_writer, run_lock, wait_until_idle
from loadgen.results.runfolder import (
    RECORDS_FILE,
    REPORT_DIR,
    REPORT_HTML,
    REPORT_MD,
    ROLLING_REPORT_DIR,
    RUN_FILE,
    SPANS_FILE,
    SUMMARY_FILE,
    is_run_folder,
    read_records,
    read_run_info,
)
from loadgen.results.spans import read_span_file, with_source
from loadgen.results.store import discover_runs, select_runs
from loadgen.results.write import recover, write_audit, write_files, write_report, write_spans
from loadgen.workload.spec import redact_url


@click.command(epilog=REPORT_EXITS)
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--slo",
    "slo_text",
    metavar="KEY=VALUE,...",
    help="Re-audit against other targets, e.g. ttft_ms=800,tpot_ms=40,percentile=95.",
)
@click.option(
    "--verdict",
    "rule",
    type=click.Choice(RULES),
    help="Re-judge by this rule (interval: by each check's confidence bounds; point: by "
    "its point estimate) instead of the one run.json records; --slo confidence=0.9 "
    "changes the level.",
)
@click.option(
    "--window",
    "window_text",
    default=None,
    help="One run: window length in s (default: chosen by the run's length and requests; "
    "see docs/commands.md). Results store: trailing window, e.g. 30d (default).",
)
@click.option(
    "--step",
    "step_text",
    default=None,
    help="One run: slide windows by this many s (default: tumbling). "
    "Results store: step between windows, e.g. 1d (default).",
)
@click.option(
    "--class", "class_names", multiple=True, help="Results store: only this class (repeatable)."
)
@click.option(
    "--workload",
    "workload_name",
    metavar="NAME",
    help="Results store: only this workload (a name, or NAME@FINGERPRINT as the table shows).",
)
@click.option(
    "--include-incomplete",
    is_flag=True,
    help="Results store: also pool runs that are no measure of the server: stopped early "
    "(interrupted, watchdog, recovered) or whose generator fell behind.",
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
    help="Where to write the report (default: PATH/report for a run; for a results store "
    "./rolling-report, in the current folder: never inside the store).",
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
    help="One run that never wrote its end (killed, or interrupted twice): join its record "
    "parts and give every planned request a record (cancelled if it was due, not_sent if "
    "not), mark it incomplete (killed: exit 5) or keep it interrupted (exit 130), write its "
    "summary.json, then report (`report` alone reports the same records without writing "
    "them). Refused (exit 6) while the run is still running.",
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="One run: write its SLO checks as re-judged here (with --slo, --verdict) as JUnit "
    "XML, as `run --junit` does.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="One run: the same checks as a Markdown table (for a CI job summary).",
)
@click.option(
    "--wait",
    is_flag=True,
    help="One run that is still running: wait until it ends (or dies), then report "
    "(and recover, with --recover) instead of refusing it (exit 6).",
)
@click.option(
    "--spans",
    "spans_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="One run: join the server's spans from this file (OTLP JSON as a collector's file "
    "exporter writes it, one document a line; Jaeger's or Tempo's JSON; gzip or not) to the "
    "records, keep them as the run's server-spans.parquet, and report the join.",
)
@click.option(
    "--spans-from",
    "spans_url",
    metavar="URL",
    help="One run: ask Jaeger (http://HOST:16686) or Tempo (http://HOST:3200) for each "
    "record's trace (GET URL/api/traces/TRACE-ID) and join them as --spans does (with "
    "the TLS trust and proxy options below, as a run's connections).",
)
@network_options
@clean_errors
def report(
    path: Path,
    slo_text: str | None,
    rule: str | None,
    window_text: str | None,
    step_text: str | None,
    class_names: tuple[str, ...],
    workload_name: str | None,
    include_incomplete: bool,
    exact: bool,
    out_dir: Path | None,
    fmt: str,
    recover: bool,
    junit_path: Path | None,
    markdown_path: Path | None,
    wait: bool,
    spans_file: Path | None,
    spans_url: str | None,
    **network: Any,
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
      loadgen report reports/20261129T101500Z-chat-1a2b --verdict point
      loadgen report reports/ --window 30d --step 1d --class chat
      loadgen report reports/ --workload chat-smoke --format json
      loadgen report --recover reports/20261129T101500Z-chat-1a2b    # after SIGKILL or 2 Ctrl-C
      loadgen report reports/20261129T101500Z-chat-1a2b --slo ttft_ms=800 --junit slo.xml
      loadgen report reports/20261129T101500Z-chat-1a2b --spans otel-traces.json
      loadgen report reports/20261129T101500Z-chat-1a2b --spans-from http://127.0.0.1:16686
    """
    check_report_paths(("--junit", junit_path), ("--markdown", markdown_path))
    if is_run_folder(path):
        _refuse_live(path, wait=wait, doing="recover" if recover else "report on")
        if recover:
            _recover(path)
        if spans_file is not None or spans_url is not None:
            _join_spans(path, spans_file, spans_url, read_network(network))
        _report_run(path, slo_text, window_text, step_text, out_dir, fmt, rule=rule,
                    checks=(junit_path, markdown_path))  # fmt: skip
    else:
        for flag, given in (("--junit", junit_path), ("--markdown", markdown_path)):
            if given is not None:
                raise OptionError(flag, "takes one run folder, not a results store",
                                  "give it a run folder (reports/<run-id>)")  # fmt: skip
        if spans_file is not None or spans_url is not None:
            raise OptionError("--spans/--spans-from", "join spans to one run",
                              "give a run folder, not a results store")  # fmt: skip
        _report_store(
            path, window_text or "30d", step_text or "1d", class_names, exact, out_dir, fmt,
            workload=workload_name, include_incomplete=include_incomplete,
        )  # fmt: skip


def _refuse_live(run_dir: Path, *, wait: bool, doing: str) -> None:
    """A run folder a live run is writing: wait for it (`--wait`), or refuse it (exit 6)."""
    why = live_writer(run_dir)
    if why is None:
        return
    if not wait:
        raise RunBusy(busy_message(run_dir, why, doing))
    click.echo(f"waiting: {run_dir} is running ({why}); {doing} it once it ends", err=True)
    wait_until_idle(run_dir)


def _recover(run_dir: Path) -> None:
    """Give a run that never wrote its end one record per plan, then write its summary and
    histograms."""

    with run_lock(run_dir, doing="recover"):  # a run that started writing since: refused
        done = recover(run_dir)
        if done.nothing_to_do:
            click.echo(f"nothing to recover: {run_dir} already has its {RECORDS_FILE}",
                       err=True)  # fmt: skip
            return
        write_audit(run_dir, *reaudit(run_dir))
    click.echo(recovery_line(run_dir, done), err=True)


def _join_spans(
    run_dir: Path, spans_file: Path | None, spans_url: str | None, network: Network
) -> None:
    """Read the spans (a file, or Jaeger's or Tempo's answers for the records' trace ids)
    into the run's server-spans.parquet, replacing any it had; the report joins them."""
    if spans_file is not None and spans_url is not None:
        raise OptionError("--spans/--spans-from", "give one source of spans", "drop one")
    if spans_file is not None:
        source = spans_file.name
        spans = with_source(read_span_file(spans_file), source)
    else:
        assert spans_url is not None
        ids = read_records(run_dir).select(trace_id(pl.col("traceparent"))).to_series()
        wanted = sorted(set(ids.drop_nulls().to_list()))
        if not wanted:
            why = "its records carry no traceparent, so there is no trace id to ask for"
            raise LoadgenError(f"{run_dir}: {why}; give the spans as a file (--spans)")
        source = redact_url(spans_url)
        spans = with_source(query_spans(spans_url, wanted, network), source)
    with run_lock(run_dir, doing="join spans into"):
        if (run_dir / SPANS_FILE).exists():
            click.echo(f"replacing the run's {SPANS_FILE}", err=True)
        write_spans(run_dir, spans)
    info = read_run_info(run_dir)
    account = span_account(read_records(run_dir), spans, info.t0, source=source)
    click.echo(join_line(account), err=True)


def _report_run(
    run_dir: Path, slo_text: str | None, window_text: str | None, step_text: str | None,
    out_dir: Path | None, fmt: str, *, rule: str | None = None,
    checks: tuple[Path | None, Path | None] = (None, None),
) -> None:  # fmt: skip

    slos = None
    if slo_text:
        slos = apply_slo_override(read_run_info(run_dir).slos(), parse_slo_override(slo_text))
    fix = "one run takes seconds, e.g. --window 10 --step 5"
    try:
        window_s = float(window_text) if window_text else None  # None: by the run's length
        step_s = float(step_text) if step_text else None
    except ValueError as exc:
        raise OptionError("--window/--step", str(exc), fix) from None
    try:
        built = build_run_report(run_dir, slos=slos, window_s=window_s, sliding_step_s=step_s,
                                 rule=rule)  # fmt: skip
    except WindowError as exc:  # only the grid's own errors: any other is not the flags'
        raise OptionError("--window/--step", str(exc), fix) from None
    written = write_report(out_dir or run_dir / REPORT_DIR, report_files(built), built.summary)
    if fmt == "json":
        click.echo(json.dumps(codec.to_json(built.summary), indent=2))
    else:
        console = output_console()
        console.print(render_summary(built.summary))
        if (against := target_line(built.run_info.target)) is not None:
            console.print(against)
        for file in written:
            if file.name in (REPORT_HTML, REPORT_MD, SUMMARY_FILE):
                console.print(f"wrote {file}")
    for path, render in zip(checks, (render_run_junit, render_run_markdown), strict=True):
        if path is not None:  # said on stderr, so --format json keeps stdout to the JSON
            write_text(path, render(built.summary, built.run_info.target))
            click.echo(f"wrote {path}", err=True)
    sys.exit(built.summary.verdict.exit_code)


def _report_store(
    store: Path, window_text: str, step_text: str, class_names: tuple[str, ...], exact: bool,
    out_dir: Path | None, fmt: str, *, workload: str | None, include_incomplete: bool,
) -> None:  # fmt: skip

    runs = discover_runs(store, [])
    if not runs:
        raise LoadgenError(f"{store} holds no readable runs (no */{RUN_FILE}): give a run folder "
                           "or the results store that `loadgen run --out` writes to")  # fmt: skip
    window, step = parse_duration(window_text), parse_duration(step_text)
    selected = select_runs(runs, workload=workload, include_incomplete=True)
    skipped: list[str] = []
    view = rolling_view(store, window=window, step=step, class_name=class_names or None,
                        exact=exact, workload=workload, include_incomplete=include_incomplete,
                        skipped=skipped)  # fmt: skip
    for reason in skipped:
        click.echo(f"skipped {reason}", err=True)
    if fmt == "json":
        click.echo(json.dumps(to_json(view.windows), indent=2))
        return
    slos = {(run.workload_key, name): slo for run in runs for name, slo in run.slos.items()}
    console = output_console()
    console.print(render_rolling_table(view.windows, slos))
    invalid = [r for r in runs if not r.is_complete and (workload is None or r in selected)]
    notes = [left_out_line(invalid)] if invalid and not include_incomplete else []
    for note in notes:
        console.print(note, markup=False)
    for path in write_files(out_dir or Path(ROLLING_REPORT_DIR), rolling_files(view, slos, notes)):
        click.echo(f"wrote {path}")
