"""The exit codes as the commands and the docs say them, from `loadgen.errors` (the one
place they are written): every command's `Exit codes:` help, the Markdown tables of the
README and docs/exit-codes.md (`scripts/exit_codes.py` writes them; a test checks them),
and a usage error exit 1, whichever way a command runs.

Light on purpose (click alone): the `loadgen` group imports it before any command, and
`loadgen sim` must not pay for polars.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Iterable
from typing import Any

import click

from loadgen.errors import (
    COMMAND_EXITS,
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    VERDICT_PRECEDENCE,
    command_exits,
)

HELP_WIDTH = 84  # a row's text, after its code: rows end by column 93, as click wraps


def exit_help(rows: Iterable[tuple[int, str]]) -> str:
    """An `Exit codes:` epilog, one row per code, wrapped under its text (`\\b`: click keeps
    the lines as they are)."""
    lines = ["\b", "Exit codes:"]
    for code, meaning in rows:
        first, *rest = textwrap.wrap(meaning, HELP_WIDTH, break_on_hyphens=False)
        lines.append(f"  {code:<5}{first}")
        lines.extend(f"       {line}" for line in rest)
    return "\n".join(lines)


LOADGEN_EXITS = exit_help((e.code, e.summary) for e in EXIT_CODES)  # the `loadgen` group's
CHECK_EXITS = exit_help(command_exits("check"))
RUN_EXITS = exit_help(command_exits("run"))
REPORT_EXITS = exit_help(command_exits("report"))
COMPARE_EXITS = exit_help(command_exits("compare"))
MERGE_EXITS = exit_help(command_exits("merge"))
CAPACITY_EXITS = exit_help(command_exits("capacity"))
CALIBRATE_EXITS = exit_help(command_exits("calibrate"))
PLAN_EXITS = exit_help(command_exits("plan"))


# --- the Markdown pages -------------------------------------------------------------------

TABLE, BY_COMMAND = "exit codes", "exit codes by command"  # the generated blocks
# page -> the prefix of its links into docs/, and the blocks it holds
PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "README.md": ("docs/", (TABLE,)),
    "docs/exit-codes.md": ("", (TABLE, BY_COMMAND)),
}
_LINK = re.compile(r"\]\((?![a-z]+:|#)")  # a relative link's target begins after it


def markdown_table(link_base: str = "") -> str:
    """Every exit code's row: what it means and what a CI job does about it."""
    rows = ["| code | meaning | in a CI job |", "|---|---|---|"]
    rows += [f"| {e.code} | {e.meaning} | {e.in_ci} |" for e in EXIT_CODES]
    return _LINK.sub(f"]({link_base}", "\n".join(rows))


def markdown_by_command() -> str:
    """Each command's codes in its own words (its help's rows), and the verdict's precedence."""
    order = ", ".join(map(str, VERDICT_PRECEDENCE))
    parts = [f"A run's verdict (and that of `run --repeats`: its worst run's) is the first of "
             f"{order} that applies: a stop, then a generator that fell behind, then a miss, "
             "then an inconclusive check, else met."]  # fmt: skip
    for command in COMMAND_EXITS:
        rows = [f"| {code} | {meaning} |" for code, meaning in command_exits(command)]
        parts.append("\n".join([f"### `loadgen {command}`", "", "| code | meaning |",
                                 "|---|---|", *rows]))  # fmt: skip
    return "\n\n".join(parts)


def regenerated(text: str, link_base: str, blocks: Iterable[str]) -> str:
    """`text` with each generated block written anew between its markers; ValueError when a
    block's markers are missing (a page that lost them would never be checked again)."""
    content = {TABLE: lambda: markdown_table(link_base), BY_COMMAND: markdown_by_command}
    for block in blocks:
        begin = (f"<!-- {block}: generated from loadgen/errors.py by scripts/exit_codes.py; "
                 "edit them there -->")  # fmt: skip
        end = f"<!-- end of {block} -->"
        head, found, rest = text.partition(begin)
        _, ended, tail = rest.partition(end)
        if not (found and ended):
            raise ValueError(f"no {begin!r} ... {end!r} block")
        text = f"{head}{begin}\n\n{content[block]()}\n\n{end}{tail}"  # Markdown apart
    return text


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
