"""`loadgen compare`: parse → `compare.load_sides` → `compare.compare_sides` → render
(`render.compare_view` for the table and Markdown, `render.junit` for JUnit XML)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from loadgen.analysis.compare import (
    compare_sides,
    load_sides,
    parse_tolerances,
    to_json,
)
from loadgen.analysis.rolling import parse_duration
from loadgen.cli.exits import UsageErrorsExitOne
from loadgen.cli.options import clean_errors, output_console
from loadgen.errors import ConfigError, LoadgenError
from loadgen.render.compare_view import render_markdown, render_table
from loadgen.render.junit import render_junit

EXIT_CODES_HELP = """\b
Exit codes:
  0    no check regressed
  1    usage error (missing run, no class in common, bad flag), runs of different
       workloads (without --force), or a run that stopped early (without
       --include-incomplete)
  2    at least one check REGRESSED"""


@click.command(
    cls=UsageErrorsExitOne,
    epilog=EXIT_CODES_HELP,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.argument("runs", nargs=-1, metavar="[BASELINE] CURRENT", type=click.Path(path_type=Path))
@click.option(
    "--baseline-window",
    "window_text",
    help="Pool every run that started this long before CURRENT (e.g. 30d) as the baseline.",
)
@click.option(
    "--store",
    type=click.Path(file_okay=False, path_type=Path),
    help="With --baseline-window: the folder of runs (default: CURRENT's parent folder).",
)
@click.option(
    "--tolerance",
    "tolerance_texts",
    multiple=True,
    metavar="CHECK=VALUE",
    help="Override a tolerance (repeatable): ttft_p99=5%, ttft_p99=20ms, ttft=15%, "
    "latency=3ms, attainment=2pp, error_rate=0.5pp, goodput=5%.",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0.5, 1.0, max_open=True),
    default=0.95,
    show_default=True,
    help="Confidence of every interval.",
)
@click.option("--class", "class_names", multiple=True, help="Only this class (repeatable).")
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write JUnit XML: one testcase per class and check.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write a Markdown table (e.g. for $GITHUB_STEP_SUMMARY).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Compare BASELINE and CURRENT even when they are runs of different workloads "
    "(the output says so).",
)
@click.option(
    "--include-incomplete",
    is_flag=True,
    help="Also use runs that stopped early (interrupted, watchdog, recovered): in the "
    "baseline window, or as BASELINE/CURRENT.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: the comparison on stdout, for machines.",
)
def compare(
    runs: tuple[Path, ...],
    window_text: str | None,
    store: Path | None,
    tolerance_texts: tuple[str, ...],
    confidence: float,
    class_names: tuple[str, ...],
    junit_path: Path | None,
    markdown_path: Path | None,
    force: bool,
    include_incomplete: bool,
    fmt: str,
) -> None:
    """Compare CURRENT with BASELINE per class and figure; exit 2 on a regression.

    Checks TTFT/TPOT/ITL/E2E p50/p90/p99 (and TTFT/E2E with failures ranked worst),
    attainment, error rate and goodput. A check REGRESSED only when the change exceeds
    its tolerance (default: latency +10 % and +2 ms, attainment -1 pp, error rate
    +1 pp, goodput -10 %) AND the confidence intervals of the two sides do not overlap
    (order-statistic intervals for percentiles, Wilson for shares). A percentile whose
    interval reaches beyond the sample (p99 under 368 requests at 95 %) is "not enough
    data". Classes in only one side are listed, not compared. Only runs of one workload
    (name + spec fingerprint) are compared: the baseline window pools CURRENT's workload
    only; BASELINE of another workload needs --force. Runs that stopped early are left
    out (refused as a side) unless --include-incomplete.

    \b
    Example:
      loadgen compare reports/run-a reports/run-b
      loadgen compare reports/run-b --baseline-window 30d --junit compare.xml
      loadgen compare reports/run-a reports/run-b --tolerance ttft_p99=20ms --format json
      loadgen compare reports/chat-run reports/mixed-run --force
    """

    options = (window_text, store, tolerance_texts, confidence, class_names)
    clean_errors(_compare)(
        runs, *options, junit_path, markdown_path, fmt, force=force,
        include_incomplete=include_incomplete,
    )  # fmt: skip


def _compare(
    runs: tuple[Path, ...],
    window_text: str | None,
    store: Path | None,
    tolerance_texts: tuple[str, ...],
    confidence: float,
    class_names: tuple[str, ...],
    junit_path: Path | None,
    markdown_path: Path | None,
    fmt: str,
    *,
    force: bool = False,
    include_incomplete: bool = False,
) -> None:
    ctx = click.get_current_context()
    if window_text is None and len(runs) != 2:
        raise click.UsageError(
            "give BASELINE and CURRENT run folders (or CURRENT with --baseline-window)", ctx
        )
    if window_text is not None and len(runs) != 1:
        raise click.UsageError("with --baseline-window give only CURRENT", ctx)
    if store is not None and window_text is None:
        raise click.UsageError("--store only applies with --baseline-window", ctx)
    if force and window_text is not None:
        raise click.UsageError("--force applies to BASELINE CURRENT: a baseline window pools "
                               "only CURRENT's workload", ctx)  # fmt: skip
    try:
        window = parse_duration(window_text) if window_text is not None else None
    except ConfigError as exc:  # parse_duration names --window; this flag is another
        raise ConfigError(exc.source, "--baseline-window", exc.problem, exc.fix) from None
    tolerances = parse_tolerances(tolerance_texts)
    baseline_dir = runs[0] if window is None else None
    baseline, current, slos = load_sides(
        runs[-1], baseline_dir=baseline_dir, window=window, store=store, force=force,
        include_incomplete=include_incomplete,
    )  # fmt: skip
    comparison = compare_sides(
        baseline,
        current,
        slos=slos,
        tolerances=tolerances,
        confidence=confidence,
        classes=class_names,
    )
    written = []
    if junit_path is not None:
        written.append(_write(junit_path, render_junit(comparison)))
    if markdown_path is not None:
        written.append(_write(markdown_path, render_markdown(comparison)))
    if fmt == "json":
        click.echo(json.dumps(to_json(comparison), indent=2))
        for path in written:
            click.echo(f"wrote {path}", err=True)
    else:
        console = output_console()
        console.print(render_table(comparison))
        for path in written:
            console.print(f"wrote {path}")
    sys.exit(comparison.exit_code)


def _write(path: Path, text: str) -> Path:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise LoadgenError(f"cannot write {path}: {exc.strerror}") from None
    return path
