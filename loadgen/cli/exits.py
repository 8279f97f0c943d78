"""The exit-code base of the commands: a usage error is exit 1, whichever way a command runs.

Light on purpose (click alone): the `loadgen` group imports it before any command, and
`loadgen sim` must not pay for polars.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click


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
            sys.exit(130)
        except click.ClickException as exc:
            exc.show()
            sys.exit(1)
        except BrokenPipeError:
            quiet_stdout()
            sys.exit(0)


def quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush would hit the closed pipe
    again and print "Exception ignored ... BrokenPipeError" (and exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (an embedding program's): nothing to do
        pass
