"""`loadgen calibrate`: measure how much load this machine's client measures truthfully.

A thin command: parse the flags into a `Ladder` and `Thresholds`, let
`loadgen.studies.calibrate.calibrate` drive the levels (printing each as it lands), render the
table or JSON (`render.calibrate_view`), and save the result for `loadgen run`'s envelope
warning.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import click

from loadgen.analysis.calibration import QUICK_LADDER, Ladder, Level, Thresholds
from loadgen.cli.exits import CALIBRATE_EXITS
from loadgen.cli.live_options import live_options, open_live
from loadgen.cli.options import clean_errors, network_options, output_console, read_network
from loadgen.errors import EXIT_SLO_MISSED, OptionError
from loadgen.render.calibrate_view import conclusion, level_line, levels_table, start_line
from loadgen.run.envelope import calibration_path, save_calibration
from loadgen.studies.calibrate import calibrate as run_calibration
from loadgen.studies.calibrate import measure_level

DEFAULT_FILE = "\0default"  # `--save` with no PATH (no real path holds a NUL)


def _levels(text: str | None, quick: bool) -> tuple[int, ...]:
    if text is None:
        return QUICK_LADDER.streams if quick else Ladder().streams
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise OptionError("--levels", f"must be stream counts ≥ 1 (got {text!r})",
                          "e.g. --levels 64,128,256")  # fmt: skip
    return values


def old_format(value: str) -> str:
    """`--format table`, calibrate's old name for what every command calls `text`: it still
    works, saying its new name."""
    if value != "table":
        return value
    click.echo("warning: --format table is deprecated: its new name is --format text "
               "(the old one still works)", err=True)  # fmt: skip
    return "text"


@click.command(
    "calibrate", epilog=CALIBRATE_EXITS, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option(
    "--levels",
    metavar="S1,S2,...",
    help="Concurrent streams per level (total over all processes).  [default: 64,128,256,512,1024]",
)
@click.option(
    "--tokens-per-s",
    type=click.FloatRange(min=0, min_open=True),
    default=50.0,
    show_default=True,
    help="Token rate of each stream (the simulator's decode step is 1/this).",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.1),
    default=4.0,
    show_default=True,
    help="Each stream's token phase; tokens per stream = rate × this.",
)
@click.option(
    "--workers",
    "--processes",
    "processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Engine processes, each with every N-th stream, as `loadgen run --workers N` "
    "splits a schedule (the saved envelope is per process).",
)
@click.option(
    "--max-timestamp-err-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Threshold: chunk timestamp error p99.",
)
@click.option(
    "--max-ttft-err-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=2.0,
    show_default=True,
    help="Threshold: TTFT error p99.",
)
@click.option(
    "--max-send-lag-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Threshold: send lag p99.",
)
@click.option("--all-levels", is_flag=True, help="Go on past the first level that misses.")
@click.option(
    "--quick",
    is_flag=True,
    help="A smoke check: 8 and 16 streams, 1 s each; not saved unless --save is given.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "table"]),  # table: the old name of text
    metavar="[text|json]",
    default="text",
    show_default=True,
    callback=lambda ctx, param, value: old_format(value),
    help="json: the result on stdout, for machines.",
)
@click.option(
    "--save",
    "save_path",
    is_flag=False,
    flag_value=DEFAULT_FILE,
    metavar="[PATH]",
    help="Save the envelope (the default without --quick) to PATH, or without PATH to "
    "$LOADGEN_CALIBRATION, else ${XDG_CACHE_HOME:-~/.cache}/loadgen/calibration.json.",
)
@click.option("--no-save", is_flag=True, help="Do not save (loadgen run will not see it).")
@live_options
@network_options
def calibrate(
    levels: str | None, tokens_per_s: float, seconds: float, processes: int,
    max_timestamp_err_ms: float, max_ttft_err_ms: float, max_send_lag_ms: float,
    all_levels: bool, quick: bool, fmt: str, save_path: str | None, no_save: bool,
    prometheus_listen: str | None, prometheus_grace_s: float, otlp_endpoint: str | None,
    otlp_interval_s: float, **network: Any,
) -> None:  # fmt: skip
    """Find the highest load this machine's client measures truthfully (its envelope).

    Starts the built-in simulator with its ground-truth trace once per level, sends the
    level's streams through the same engine `loadgen run` uses, and compares every client
    chunk timestamp with the simulator's write time of that chunk (one monotonic clock on
    this host). Per level: timestamp error p50/p99/max, TTFT error p99, send lag p99 and
    client CPU per chunk. The envelope is the highest level at which it and every lower
    level met the thresholds; it is saved per host, and `loadgen run` warns when a
    workload's expected peak exceeds it. Run it on an otherwise idle machine.

    \b
    Example:
      loadgen calibrate
      loadgen calibrate --levels 256,512,1024 --workers 2 --format json
      loadgen calibrate --quick
      loadgen calibrate --quick --prometheus-port 9464
      loadgen calibrate --quick --otlp-endpoint https://otel:4318/v1/metrics --cacert ca.pem

    Its streams go to a simulator of its own on loopback; the TLS and proxy options are
    for --otlp-endpoint.
    """

    clean_errors(_calibrate)(
        Ladder(
            streams=_levels(levels, quick),
            tokens_per_s=tokens_per_s,
            stream_s=QUICK_LADDER.stream_s if quick else seconds,
            ramp_s=QUICK_LADDER.ramp_s if quick else Ladder().ramp_s,
            processes=processes,
            all_levels=all_levels,
            quick=quick,
        ),
        Thresholds(
            timestamp_p99_ms=max_timestamp_err_ms,
            ttft_p99_ms=max_ttft_err_ms,
            send_lag_p99_ms=max_send_lag_ms,
        ),
        fmt,
        (save_path, no_save),
        (prometheus_listen, prometheus_grace_s, otlp_endpoint, otlp_interval_s),
        network,
    )


def save_target(save_path: str | None, *, quick: bool, no_save: bool) -> Path | None:
    """Where to save: nowhere with --no-save, or with --quick unless --save was given."""
    if save_path is not None and no_save:
        raise OptionError("--save/--no-save", "are contradictory", "give one")
    if no_save or (quick and save_path is None):
        return None
    return calibration_path(None if save_path in (None, DEFAULT_FILE) else Path(save_path))


def _calibrate(
    ladder: Ladder, thresholds: Thresholds, fmt: str, saving: tuple[str | None, bool],
    live_flags: tuple[str | None, float, str | None, float] = (None, 0.0, None, 5.0),
    network_flags: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    save = save_target(saving[0], quick=ladder.quick, no_save=saving[1])
    network = read_network(network_flags or {})

    def progress(level: Level) -> None:
        if fmt == "text":
            print(level_line(level), file=sys.stderr, flush=True)

    if fmt == "text":
        print(start_line(ladder), file=sys.stderr, flush=True)
    with open_live(*live_flags, network=network) as live:
        measure = functools.partial(measure_level, live=live)
        result = run_calibration(ladder, thresholds, progress, measure=measure)
        if save is not None:
            save_calibration(result, save)
        if fmt == "json":
            click.echo(json.dumps(result, indent=2))
        else:
            console = output_console()
            console.print(levels_table(result))
            for line in conclusion(result, save):
                console.print(line)
    if result["envelope"] is None:
        sys.exit(EXIT_SLO_MISSED)
