"""The exit codes of the commands as they say them: every command's help text (from the
codes of `loadgen.errors`), and a usage error exit 1, whichever way a command runs.

Light on purpose (click alone): the `loadgen` group imports it before any command, and
`loadgen sim` must not pay for polars.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from loadgen.errors import (
    EXIT_BUSY,
    EXIT_FELL_BEHIND,
    EXIT_INCOMPLETE,
    EXIT_INCONCLUSIVE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SLO_MISSED,
    EXIT_USAGE,
    EXIT_WATCHDOG,
)


def exit_help(*rows: tuple[int, str]) -> str:
    """A command's `Exit codes:` epilog, one row per code (a row's own lines indented)."""
    lines = ["\b", "Exit codes:"]
    for code, meaning in rows:
        first, *rest = meaning.split("\n")
        lines.append(f"  {code:<5}{first}")
        lines.extend(f"       {line}" for line in rest)
    return "\n".join(lines)


INTERRUPTED_ROW = (EXIT_INTERRUPTED, "interrupted")
INCONCLUSIVE_ROW = (
    EXIT_INCONCLUSIVE,
    "inconclusive: no SLO missed, but one could not be judged at the confidence asked (its\n"
    "target lies within its interval, or too few requests to bound it: the report says how\n"
    "many); a miss anywhere is 2, a generator that fell behind 3",
)

# `run`: its own verdict (each command's help lists only the codes it returns)
RUN_EXITS = exit_help(
    (EXIT_OK, "every SLO of every class met"),
    (EXIT_USAGE, "usage or configuration error (bad file, unreachable target)"),
    (EXIT_SLO_MISSED, "an SLO was missed"),
    (EXIT_FELL_BEHIND, "the generator fell behind (its own time could have changed the verdict),\n"
                       "or the client failed (out of disk space, file descriptors or permission\n"
                       "mid-run): its numbers are not the server's"),
    (EXIT_WATCHDOG, "the watchdog stopped a run where nothing progressed; records are written"),
    (EXIT_INCOMPLETE, "incomplete (--ray): a shard's process was killed or its node lost; every\n"
                      "plan recorded, no verdict"),
    INCONCLUSIVE_ROW,
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C / SIGTERM); records and summary are still written (no\n"
                       "verdict: the figures are partial); a second Ctrl-C exits at once and\n"
                       "names the folder: report --recover finishes it, still 130"),
)  # fmt: skip

# `report`: a run folder's verdict as re-audited, or a results store's windows
REPORT_EXITS = exit_help(
    (EXIT_OK, "every SLO of every class met (a results store: the windows were written)"),
    (EXIT_USAGE, "usage error (bad flag, no run in PATH, --slo or --window unreadable)"),
    (EXIT_SLO_MISSED, "the run missed an SLO"),
    (EXIT_FELL_BEHIND, "the run's generator fell behind, or its client failed: its numbers are\n"
                       "not the server's"),
    (EXIT_WATCHDOG, "the run was stopped by the watchdog (no verdict)"),
    (EXIT_INCOMPLETE, "the run is incomplete: killed outright, finished by --recover (no verdict)"),
    (EXIT_BUSY, "the run is still running: refused (--wait waits for it)"),
    INCONCLUSIVE_ROW,
    (EXIT_INTERRUPTED, "the run was interrupted (Ctrl-C / SIGTERM): its figures are partial\n"
                       "(no verdict)"),
)  # fmt: skip

CAPACITY_EXITS = exit_help(
    (EXIT_OK, "the proposed limit passes; without --proposed-limit, the knee was found"),
    (EXIT_USAGE, "usage or configuration error (bad file, bad flag, unreachable target)"),
    (EXIT_SLO_MISSED, "the proposed limit fails; without it, no knee in range (no step passed,\n"
                      "or every step up to --max passed)"),
    (EXIT_FELL_BEHIND, "the generator fell behind before the answer was known: the proposed limit\n"
                       "is NOT JUDGED (a load that decided it was a step the generator could\n"
                       "not run), or, without one, no load above the last pass was judged (the\n"
                       "first step included: then no knee.png is drawn): rerun on a bigger or\n"
                       "quieter machine"),
    INTERRUPTED_ROW,
)  # fmt: skip

COMPARE_EXITS = exit_help(
    (EXIT_OK, "no check regressed, or no baseline yet (the window holds no valid run of the\n"
              "workload: the first night)"),
    (EXIT_USAGE, "usage error (missing run, no class in common, bad flag), runs of different\n"
                 "workloads (without --force), or a side that stopped early or fell behind\n"
                 "(without --include-incomplete)"),
    (EXIT_SLO_MISSED, "at least one check REGRESSED (or a server figure passed its "
                      "--server-threshold)"),
    (EXIT_BUSY, "BASELINE or CURRENT is still running: compare it once it ends"),
)  # fmt: skip

MERGE_EXITS = exit_help(
    (EXIT_OK, "every SLO of every class met"),
    (EXIT_USAGE, "the folders are not the N shards of one run (or not run folders)"),
    (EXIT_SLO_MISSED, "an SLO was missed"),
    (EXIT_FELL_BEHIND, "the generator fell behind, judged on every shard's records: its numbers\n"
                       "are not the server's"),
    INCONCLUSIVE_ROW,
)  # fmt: skip

CALIBRATE_EXITS = exit_help(
    (EXIT_OK, "calibrated: at least the lowest level met every threshold"),
    (EXIT_USAGE, "usage or configuration error"),
    (EXIT_SLO_MISSED, "no level met the thresholds (this machine cannot measure even the lowest)"),
    INTERRUPTED_ROW,
)


class UsageErrorsExitOne(click.Command):
    """A command whose usage errors exit 1 even when it runs on its own, as under the
    `loadgen` group: click's own 2 would read as "an SLO missed" (or "regressed", or "the
    proposed limit fails"). Ctrl-C is "aborted" and 130. A reader that stopped reading
    (`loadgen report RUN | head -1`) ends it quietly with 0, as standard tools do."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Abort:
            click.echo("aborted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as exc:
            exc.show()
            sys.exit(EXIT_USAGE)
        except BrokenPipeError:
            quiet_stdout()
            sys.exit(EXIT_OK)


def quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush would hit the closed pipe
    again and print "Exception ignored ... BrokenPipeError" (and exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (an embedding program's): nothing to do
        pass
