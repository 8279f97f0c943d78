"""`loadgen compare`: parse → `compare.load_sides` → `compare.compare_sides` → render
(`render.compare_view` for the table and Markdown, `render.junit` for JUnit XML)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

import click

from loadgen.analysis.compare import (
    Comparison,
    NoBaseline,
    RefusedSide,
    Side,
    compare_exit,
    compare_sides,
    load_sides,
    parse_tolerances,
    to_json,
)
from loadgen.analysis.repeats import (
    REPEATS_FILE,
    Repeats,
    change_json,
    compare_repeats,
    repeats_exit,
)
from loadgen.analysis.repeats import from_json as repeats_from_json
from loadgen.analysis.repeats import to_json as to_repeats_json
from loadgen.analysis.rolling import parse_duration
from loadgen.analysis.server import (
    ServerDelta,
    ServerThreshold,
    parse_server_thresholds,
    server_deltas,
)
from loadgen.cli.exits import COMPARE_EXITS, UsageErrorsExitOne
from loadgen.cli.options import clean_errors, output_console
from loadgen.errors import ConfigError, LoadgenError, OptionError, RunBusy
from loadgen.render.cache_view import CacheSide, cache_json, compare_cache_line
from loadgen.render.compare_view import (
    render_markdown,
    render_not_compared_markdown,
    render_server_table,
    render_table,
    server_json,
)
from loadgen.render.junit import render_junit, render_not_compared_junit
from loadgen.render.repeats_view import changes_table
from loadgen.results.liveness import live_writer
from loadgen.results.runfolder import SUMMARY_FILE, read_run_info, read_summary
from loadgen.results.summary import CacheWarmth, ServerAudit


@click.command(
    cls=UsageErrorsExitOne,
    epilog=COMPARE_EXITS,
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
    help="Also use runs that are no measure of the server, stopped early (interrupted, "
    "watchdog, recovered) or whose generator fell behind: in the baseline window, or as "
    "BASELINE/CURRENT.",
)
@click.option(
    "--server-threshold",
    "server_threshold_texts",
    multiple=True,
    metavar="FIGURE=VALUE",
    help="Judge a server figure's change (repeatable): queue_depth_p99=50%, "
    "kv_usage_mean=0.1, preemptions=0; without one the server's side is informational.",
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
    server_threshold_texts: tuple[str, ...],
    fmt: str,
) -> None:
    """Compare CURRENT with BASELINE per class and figure; exit 2 on a regression.

    BASELINE and CURRENT may also be two `run --repeats` folders (each with repeats.json):
    every headline figure is then compared by the means of the runs, REGRESSED when the
    Welch t-interval of the change lies wholly on the worse side and the change exceeds
    the default tolerance.

    Checks TTFT/TPOT/ITL/E2E p50/p90/p99 (and TTFT/E2E with failures ranked worst),
    attainment, error rate and goodput. A check REGRESSED only when the change exceeds
    its tolerance (default: latency +10 % and +2 ms, attainment -1 pp, error rate
    +1 pp, goodput -10 %) AND the confidence intervals of the two sides do not overlap
    (order-statistic intervals for percentiles, Wilson for shares). A percentile whose
    interval reaches beyond the sample (p99 under 368 requests at 95 %) is "not enough
    data". Classes in only one side are listed, not compared. Only runs of one workload
    (name + spec fingerprint) are compared: the baseline window pools CURRENT's workload
    only; BASELINE of another workload needs --force. Runs that stopped early or whose
    generator fell behind are left out (refused as a side, saying why; --junit/--markdown
    say so too) unless --include-incomplete. A baseline window with no valid run of the
    workload is the first night of a series: "no baseline yet", exit 0, with --junit and
    --markdown written. Runs that scraped the server
    (run --server-metrics-url) add its figures side by side: informational unless a
    --server-threshold is set.

    \b
    Example:
      loadgen compare reports/run-a reports/run-b
      loadgen compare reports/run-b --baseline-window 30d --junit compare.xml
      loadgen compare reports/run-a reports/run-b --tolerance ttft_p99=20ms --format json
      loadgen compare reports/chat-run reports/mixed-run --force
      loadgen compare reports/run-a reports/run-b --server-threshold queue_depth_p99=50%
      loadgen compare reports/before reports/after     # two run --repeats folders
    """

    options = (window_text, store, tolerance_texts, confidence, class_names)
    clean_errors(_compare)(
        runs, *options, junit_path, markdown_path, fmt, force=force,
        include_incomplete=include_incomplete, server_thresholds=server_threshold_texts,
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
    server_thresholds: tuple[str, ...] = (),
) -> None:
    window = _window(runs, window_text, store, force)
    if window is None and all((run / REPEATS_FILE).is_file() for run in runs):
        _compare_repeats(runs[0], runs[1], fmt, force=force)
        return
    tolerances = parse_tolerances(tolerance_texts)
    try:
        thresholds = parse_server_thresholds(server_thresholds)
    except ValueError as exc:
        raise OptionError("--server-threshold", str(exc), "") from None
    for run in runs:  # a run still writing its folder is no side yet: exit 6, as `report`
        if (why := live_writer(run)) is not None:
            raise RunBusy(f"{run} is running: {why}. Cannot compare a run that is still "
                          "writing its folder; compare it once it ends")  # fmt: skip
    baseline_dir = runs[0] if window is None else None
    try:
        baseline, current, slos = load_sides(
            runs[-1], baseline_dir=baseline_dir, window=window, store=store, force=force,
            include_incomplete=include_incomplete,
        )  # fmt: skip
    except (NoBaseline, RefusedSide) as exc:
        _not_compared(runs[-1], exc, junit_path, markdown_path, fmt)
        return
    comparison = compare_sides(
        baseline,
        current,
        slos=slos,
        tolerances=tolerances,
        confidence=confidence,
        classes=class_names,
    )
    deltas = _server_deltas(baseline, current, thresholds)
    exit_code = compare_exit(comparison, deltas)
    written = []
    if junit_path is not None:
        written.append(_write(junit_path, render_junit(comparison)))
    if markdown_path is not None:
        written.append(_write(markdown_path, render_markdown(comparison)))
    cache = _cache_sides(baseline, current)
    show = _print_json if fmt == "json" else _print_text
    show(comparison, deltas, exit_code, cache, written)
    sys.exit(exit_code)


def _window(
    runs: tuple[Path, ...], window_text: str | None, store: Path | None, force: bool
) -> timedelta | None:
    """--baseline-window as a duration (None: BASELINE CURRENT), the flags that go with it
    checked."""
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
        return parse_duration(window_text) if window_text is not None else None
    except ConfigError as exc:  # parse_duration names --window; this flag is another
        raise ConfigError(exc.source, "--baseline-window", exc.problem, exc.fix) from None


def _print_json(
    comparison: Comparison, deltas: Sequence[ServerDelta], exit_code: int,
    cache: tuple[CacheSide, CacheSide] | None, written: Sequence[Path],
) -> None:  # fmt: skip
    """The comparison for machines on stdout (`analysis.compare.to_json`), with the server's
    figures and the cache warmth where the runs have them; what was written on stderr."""
    out = to_json(comparison)
    if deltas:
        out["server"] = server_json(deltas)
    out["exit_code"] = exit_code
    if cache is not None:
        out["cache"] = {"baseline": cache_json(cache[0]), "current": cache_json(cache[1]),
                        "differs": compare_cache_line(*cache)[1]}  # fmt: skip
    click.echo(json.dumps(out, indent=2))
    for path in written:
        click.echo(f"wrote {path}", err=True)


def _print_text(
    comparison: Comparison, deltas: Sequence[ServerDelta], exit_code: int,
    cache: tuple[CacheSide, CacheSide] | None, written: Sequence[Path],
) -> None:  # fmt: skip
    """The table of checks, the cache warmth and the server's figures, for people."""
    console = output_console()
    console.print(render_table(comparison))
    if cache is not None:
        cache_text, cache_differs = compare_cache_line(*cache)
        console.print(cache_text, style="yellow" if cache_differs else "")
    if deltas:
        console.print(render_server_table(deltas))
        if exit_code != comparison.exit_code:
            console.print(
                f"a server figure passed its --server-threshold (exit {exit_code})",
                style="bold red",
            )
    for path in written:
        console.print(f"wrote {path}")


def _not_compared(
    current: Path, exc: NoBaseline | RefusedSide, junit_path: Path | None,
    markdown_path: Path | None, fmt: str,
) -> None:  # fmt: skip
    """Nothing to compare: the first night of a series (no baseline yet: exit 0, said on
    stdout) or a side that is no measure of the server (exit 1, on stderr). Either way the
    JUnit and Markdown asked for are written, saying so, so a CI job's summary step finds
    them; `--format json` gets `{compared: false, reason, exit_code}`."""
    first_night = isinstance(exc, NoBaseline)
    why, code = str(exc), exc.exit_code
    written = []
    if junit_path is not None:
        written.append(_write(junit_path, render_not_compared_junit(
            current.name, why, first_night=first_night)))  # fmt: skip
    if markdown_path is not None:
        written.append(_write(markdown_path, render_not_compared_markdown(
            why, first_night=first_night)))  # fmt: skip
    if fmt == "json":
        click.echo(json.dumps({"compared": False, "reason": why, "exit_code": code}, indent=2))
    else:
        click.echo(why, err=not first_night)
    for path in written:
        click.echo(f"wrote {path}", err=fmt == "json")
    sys.exit(code)


def _compare_repeats(baseline_dir: Path, current_dir: Path, fmt: str, *, force: bool) -> None:
    """Two `run --repeats` folders: every headline figure's mean, between-run interval and
    Welch interval of the change; exit 2 when one REGRESSED (`analysis.repeats`)."""
    sides = [_read_repeats(d) for d in (baseline_dir, current_dir)]
    keys = [_repeats_workload(d, r) for d, r in zip((baseline_dir, current_dir), sides,
                                                    strict=True)]  # fmt: skip
    if keys[0] != keys[1] and not force:
        raise LoadgenError(
            f"{baseline_dir} and {current_dir} repeat different workloads ({keys[0]} vs "
            f"{keys[1]}): add --force to compare them anyway"
        )
    changes = compare_repeats(*sides)
    code = repeats_exit(changes)
    if fmt == "json":
        click.echo(json.dumps({"baseline": to_repeats_json(sides[0]),
                               "current": to_repeats_json(sides[1]),
                               "changes": [change_json(c) for c in changes],
                               "exit_code": code}, indent=2))  # fmt: skip
    else:
        output_console().print(changes_table(changes, min(s.level for s in sides)))
    sys.exit(code)


def _read_repeats(folder: Path) -> Repeats:
    try:
        return repeats_from_json(json.loads((folder / REPEATS_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise LoadgenError(f"cannot read {folder / REPEATS_FILE}: {exc}") from None


def _repeats_workload(folder: Path, repeats: Repeats) -> str:
    """The workload key of a repeats folder's runs (its sibling run folders)."""
    if not repeats.run_ids:
        raise LoadgenError(f"{folder / REPEATS_FILE} names no runs")
    return str(read_run_info(folder.parent / repeats.run_ids[0]).identity().get("key"))


def _server_deltas(
    baseline: Side, current: Side, thresholds: Mapping[str, ServerThreshold]
) -> list[ServerDelta]:
    """Both sides' server blocks (summary.json), compared; [] when CURRENT scraped none."""
    current_server = _server_blocks(current)
    if not current_server:
        return []
    return server_deltas(_server_blocks(baseline), current_server[0], thresholds)


def _server_blocks(side: Side) -> list[ServerAudit]:
    """The server blocks of a side's runs that have one (a run without summary.json, such as
    one killed and not yet recovered, has none)."""
    blocks = []
    for run_dir in side.run_dirs:
        if (run_dir / SUMMARY_FILE).exists() and (server := read_summary(run_dir).server):
            blocks.append(server)
    return blocks


def _caches(side: Side) -> list[CacheWarmth | None]:
    """The cache block of each of a side's runs that has a summary (None: written before
    cache modes)."""
    return [read_summary(run_dir).cache for run_dir in side.run_dirs
            if (run_dir / SUMMARY_FILE).exists()]  # fmt: skip


def _cache_sides(baseline: Side, current: Side) -> tuple[CacheSide, CacheSide] | None:
    """Both sides' cache warmth; None when no run of either recorded one (all written before
    cache modes: nothing to show)."""
    caches = _caches(baseline), _caches(current)
    if all(c is None for side in caches for c in side):
        return None
    return CacheSide.of(caches[0]), CacheSide.of(caches[1])


def _write(path: Path, text: str) -> Path:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise LoadgenError(f"cannot write {path}: {exc.strerror}") from None
    return path
