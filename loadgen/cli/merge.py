"""`loadgen merge`: parse the shard folders, call `run.merge`, render the merged run's summary
and its shards (`render.terminal`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from loadgen.cli.exits import MERGE_EXITS
from loadgen.cli.options import check_report_paths, clean_errors, output_console, write_text
from loadgen.render.run_checks import render_run_junit, render_run_markdown
from loadgen.render.terminal import render_summary, shard_lines
from loadgen.run.merge import merge_shards


@click.command(
    "merge", epilog=MERGE_EXITS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.argument(
    "dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("reports"),
    show_default=True,
    help="Results store; the merged run lands in OUT/<run-id>/.",
)
@click.option(
    "--run-id", help="Name of the merged run folder (default: UTC time, workload, random)."
)
@click.option(
    "--junit",
    "junit_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the merged run's SLO checks as JUnit XML, as `run --junit` does.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the same checks as a Markdown table (for a CI job summary).",
)
def merge(
    dirs: tuple[Path, ...],
    out_dir: Path,
    run_id: str | None,
    junit_path: Path | None,
    markdown_path: Path | None,
) -> None:
    """Combine the run folders of N shards (`run --shard i/N --start-at T`) into one run.

    Checks that the folders are shards 0..N-1 of one workload, seed and start, each exactly
    once; shifts each shard's times by its t0 anchor minus the agreed start onto one
    timeline; writes records.parquet, run.json (with each shard's skew), summary.json and
    histograms.parquet, so `loadgen report` and the results store read it like any run.

    \b
    Example:
      loadgen merge shards/s0 shards/s1 shards/s2 shards/s3 --out reports --run-id nightly-1
      loadgen merge shards/* && loadgen report reports/<merged-run-id>
      loadgen merge shards/* --junit slo-junit.xml --markdown slo.md
    """

    clean_errors(_merge)(dirs, out_dir, run_id, junit_path, markdown_path)


def _merge(
    dirs: tuple[Path, ...],
    out_dir: Path,
    run_id: str | None,
    junit_path: Path | None,
    markdown_path: Path | None,
) -> None:
    check_report_paths(("--junit", junit_path), ("--markdown", markdown_path))
    result = merge_shards(dirs, out_dir, run_id)
    console = output_console()
    console.print(render_summary(result.summary))
    if result.run_info.shards is not None:
        for line in shard_lines(result.run_info.shards):
            console.print(line)
    console.print(f"merged run: {result.run_dir}")
    for path, text in ((junit_path, render_run_junit), (markdown_path, render_run_markdown)):
        if path is not None:
            write_text(path, text(result.summary, result.run_info.target))
            console.print(f"wrote {path}")
    sys.exit(result.exit_code)
