"""`loadgen compare`: the command, and the comparison as a terminal table, Markdown and JUnit.

The command is thin (parse → `compare.load_sides` → `compare.compare_sides` → render);
the renderers are pure functions of a `Comparison`.
"""

from __future__ import annotations

import json
import math
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from loadgen.analysis.compare import (
    Check,
    CheckResult,
    Comparison,
    Estimate,
    Tolerance,
    Verdict,
    compare_sides,
    load_sides,
    min_samples,
    parse_tolerances,
    to_json,
)
from loadgen.analysis.rolling import parse_duration
from loadgen.cli.options import clean_errors, output_console
from loadgen.errors import ConfigError, LoadgenError
from loadgen.render.terminal import fmt_ms

EXIT_CODES_HELP = """\b
Exit codes:
  0    no check regressed
  1    usage error (missing run, no class in common, bad flag), runs of different
       workloads (without --force), or a run that stopped early (without
       --include-incomplete)
  2    at least one check REGRESSED"""


class CompareCommand(click.Command):
    """Usage errors exit 1 when the command runs on its own, as under the `loadgen` group
    (click's own 2 would read as "regressed")."""

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
    cls=CompareCommand,
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


# --- cells --------------------------------------------------------------------------------


def format_value(check: Check, value: float | None) -> str:
    """A value in the check's unit: ms as `fmt_ms`, shares as %, rates per second."""
    if value is None:
        return "—"
    if math.isinf(value):
        return "fail"
    if check.kind == "latency":
        return fmt_ms(value)
    if check.kind == "share":
        return f"{value * 100:.1f}%"
    return f"{value:.2f}" if value < 100 else f"{value:,.0f}"


def format_estimate(check: Check, e: Estimate) -> str:
    """`value [low, high]`; an open side shows the sample's extreme with `<` or `>`."""
    if e.value is None:
        return "—"
    low = ("<" if e.low_open else "") + format_value(check, e.low)
    high = (">" if e.high_open else "") + format_value(check, e.high)
    if check.kind == "share":  # one % sign for the three numbers keeps the column narrow
        low, high = low.removesuffix("%"), high.removesuffix("%")
    return f"{format_value(check, e.value)} [{low}, {high}]"


def format_change(result: CheckResult) -> str:
    """Relative change in % (shares: in percentage points); "fail" when a side is a failure."""
    change = result.change
    if change is None:
        return "—"
    if math.isinf(change):
        return "+fail" if change > 0 else "-fail"
    if result.check.kind == "share":
        return f"{change * 100:+.1f} pp"
    relative = result.change_relative
    return f"{relative * 100:+.1f}%" if relative is not None else f"{change:+g}"


def format_tolerance(check: Check, tolerance: Tolerance) -> str:
    """The limits a change must exceed, signed in the worse direction: `+10% and +2 ms`."""
    sign = "+" if check.higher_is_worse else "-"
    parts = []
    if tolerance.relative is not None:
        parts.append(f"{sign}{tolerance.relative * 100:g}%")
    if tolerance.absolute is not None:
        unit = " pp" if check.kind == "share" else " ms"
        scale = 100 if check.kind == "share" else 1
        parts.append(f"{sign}{tolerance.absolute * scale:g}{unit}")
    return " and ".join(parts) or "any"


def _cells(result: CheckResult) -> tuple[str, ...]:
    check = result.check
    return (
        result.class_name,
        check.label,
        f"{result.baseline.n}/{result.current.n}",
        format_estimate(check, result.baseline),
        format_estimate(check, result.current),
        format_change(result),
        format_tolerance(check, result.tolerance),
        str(result.verdict),
    )


HEADERS = (
    "class",
    "metric",
    "n base/cur",
    "baseline [CI]",
    "current [CI]",
    "change",
    "tolerance",
    "verdict",
)
_STYLE = {
    Verdict.OK: "green",
    Verdict.IMPROVED: "bold green",
    Verdict.REGRESSED: "bold red",
    Verdict.NO_DATA: "yellow",
}


def verdict_line(comparison: Comparison) -> str:
    """`no regression (exit 0)` or `REGRESSED: chat TTFT p50, ... (exit 2)`."""
    bad = comparison.regressions
    if not bad:
        return f"verdict: no regression (exit {comparison.exit_code})"
    names = ", ".join(f"{r.class_name} {r.check.label}" for r in bad)
    return f"verdict: REGRESSED: {names} (exit {comparison.exit_code})"


def _notes(comparison: Comparison) -> list[str]:
    notes = []
    if comparison.forced:
        notes.append(
            f"FORCED: different workloads ({comparison.baseline_workload} vs "
            f"{comparison.current_workload}); a change may be the workload's, not the server's"
        )
    if comparison.left_out:
        notes.append(f"left out of the baseline window (another workload, or stopped early): "
                     f"{', '.join(comparison.left_out)}")  # fmt: skip
    if comparison.incomplete:
        notes.append(f"includes runs that stopped early (partial figures): "
                     f"{', '.join(comparison.incomplete)}")  # fmt: skip
    if comparison.only_in_baseline:
        notes.append(f"only in baseline, not compared: {', '.join(comparison.only_in_baseline)}")
    if comparison.only_in_current:
        notes.append(f"only in current, not compared: {', '.join(comparison.only_in_current)}")
    no_data = sum(r.verdict is Verdict.NO_DATA for r in comparison.results)
    if no_data:
        need = min_samples(0.99, comparison.confidence)[1]
        notes.append(
            f"{no_data} checks: not enough data (an interval the test needs reaches beyond the "
            f"sample: at {comparison.confidence:.0%} a p99 needs >= {need} baseline values)"
        )
    return notes


def _title(comparison: Comparison) -> str:
    workload = (
        f"FORCED across workloads {comparison.baseline_workload} → {comparison.current_workload}"
        if comparison.forced
        else f"workload {comparison.current_workload}"
    )
    return (
        f"compare {comparison.baseline} → {comparison.current} · {workload} · "
        f"{comparison.confidence:.0%} intervals · latencies in ms"
    )


# --- renderers ----------------------------------------------------------------------------


def render_table(comparison: Comparison) -> RenderableType:
    """The terminal table, notes and the verdict line."""
    table = Table(
        title=_title(comparison),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    for header in HEADERS:
        right = header in ("n base/cur", "change")
        table.add_column(header, justify="right" if right else "left", no_wrap=True)
    for result in comparison.results:
        cells = _cells(result)
        table.add_row(*cells[:-1], Text(cells[-1], style=_STYLE[result.verdict]))
    style = "bold red" if comparison.regressions else "bold green"
    parts: list[RenderableType] = [table, *(Text(n, style="dim") for n in _notes(comparison))]
    return Group(*parts, Text(verdict_line(comparison), style=style))


def render_markdown(comparison: Comparison) -> str:
    """A heading, the table (for a CI job summary) and the notes."""
    verdict = "REGRESSED" if comparison.regressions else "no regression"
    lines = [f"### loadgen compare: {verdict}", "", _md(_title(comparison)), ""]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append(
        "|" + "|".join("---:" if h in ("n base/cur", "change") else "---" for h in HEADERS) + "|"
    )
    for result in comparison.results:
        cells = [_md(c) for c in _cells(result)]
        if result.verdict is Verdict.REGRESSED:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    lines.extend(
        ["", *(f"- {_md(n)}" for n in _notes(comparison)), "", _md(verdict_line(comparison))]
    )
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """Safe in a Markdown table cell: no HTML, pipes escaped, one line."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;")  # a lone ">" is plain text
    return escaped.replace("|", "\\|").replace("\n", " ")


def render_junit(comparison: Comparison) -> str:
    """JUnit XML: a testsuite per class, a testcase per check; a REGRESSED check is a
    failure, "not enough data" is skipped, and every number is a property of the suite
    (testcase-level properties are outside the common JUnit schema)."""
    root = ET.Element("testsuites", name="loadgen compare")
    classes = dict.fromkeys(r.class_name for r in comparison.results)
    for name in classes:
        results = [r for r in comparison.results if r.class_name == name]
        root.append(_suite(name, results, comparison))
    for name, side in [
        *((n, "baseline") for n in comparison.only_in_baseline),
        *((n, "current") for n in comparison.only_in_current),
    ]:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"compare.{name}",
            tests="1",
            failures="0",
            errors="0",
            skipped="1",
            time="0",
        )
        case = ET.SubElement(
            suite, "testcase", name="compared", classname=f"compare.{name}", time="0"
        )
        ET.SubElement(case, "skipped", message=f"only in the {side}: not compared")
    suites = root.findall("testsuite")
    for key in ("tests", "failures", "errors"):
        root.set(key, str(sum(int(s.get(key, "0")) for s in suites)))
    root.set("time", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, "unicode") + "\n"


def _suite(name: str, results: Sequence[CheckResult], comparison: Comparison) -> ET.Element:
    failures = sum(r.verdict is Verdict.REGRESSED for r in results)
    skipped = sum(r.verdict is Verdict.NO_DATA for r in results)
    suite = ET.Element(
        "testsuite",
        name=f"compare.{name}",
        tests=str(len(results)),
        failures=str(failures),
        errors="0",
        skipped=str(skipped),
        time="0",
    )
    properties = ET.SubElement(suite, "properties")
    shared = {
        "baseline": comparison.baseline,
        "current": comparison.current,
        "baseline_workload": comparison.baseline_workload,
        "current_workload": comparison.current_workload,
        "forced": str(comparison.forced).lower(),
        "confidence": f"{comparison.confidence:g}",
    }
    for key, value in shared.items():
        ET.SubElement(properties, "property", name=key, value=value)
    for r in results:
        for key, value in _numbers(r).items():
            ET.SubElement(properties, "property", name=f"{r.check.name}.{key}", value=value)
    for r in results:
        case = ET.SubElement(
            suite, "testcase", name=r.check.name, classname=f"compare.{name}", time="0"
        )
        detail = "  ".join(f"{h}: {c}" for h, c in zip(HEADERS[1:], _cells(r)[1:], strict=True))
        if r.verdict is Verdict.REGRESSED:
            message = (
                f"{r.check.label} regressed: {format_value(r.check, r.baseline.value)} → "
                f"{format_value(r.check, r.current.value)} ({format_change(r)}), beyond "
                f"{format_tolerance(r.check, r.tolerance)} and the intervals"
            )
            ET.SubElement(case, "failure", message=message, type="regression").text = detail
        elif r.verdict is Verdict.NO_DATA:
            ET.SubElement(case, "skipped", message=f"not enough data: {r.reason}")
        ET.SubElement(case, "system-out").text = f"{detail}\n{r.reason}"
    return suite


def _numbers(r: CheckResult) -> dict[str, str]:
    """The figures of one check as property values (empty where a value is missing)."""

    def text(value: float | None) -> str:
        return "" if value is None else ("inf" if math.isinf(value) else f"{value:.6g}")

    return {
        "baseline": text(r.baseline.value),
        "baseline_low": text(r.baseline.low),
        "baseline_high": text(r.baseline.high),
        "baseline_n": str(r.baseline.n),
        "current": text(r.current.value),
        "current_low": text(r.current.low),
        "current_high": text(r.current.high),
        "current_n": str(r.current.n),
        "change": text(r.change),
        "verdict": str(r.verdict),
    }
