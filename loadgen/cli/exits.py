"""The exit-code base of the commands: a usage error is exit 1, whichever way a command runs.

Light on purpose (click alone): the `loadgen` group imports it before any command, and
`loadgen sim` must not pay for polars.
"""

from __future__ import annotations

import sys
from typing import Any

import click


class UsageErrorsExitOne(click.Command):
    """A command whose usage errors exit 1 even when it runs on its own, as under the
    `loadgen` group: click's own 2 would read as "an SLO missed" (or "regressed", or "the
    proposed limit fails"). Ctrl-C is "aborted" and 130."""

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
