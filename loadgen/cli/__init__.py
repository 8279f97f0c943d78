"""The command line: one module per command, each only parsing, calling the library, rendering.

`cli` is the `loadgen` group. Its commands are imported when they are used, so `loadgen
check` does not pay for matplotlib and `loadgen sim` not for polars; each command module
imports what it needs at its top. Shared options, the clean-error wrapper and the console
are in `loadgen.cli.options`.

Exit codes: 0 every SLO met; 1 usage or configuration error; 2 an SLO missed;
3 the generator fell behind or the client failed (its numbers are not the server's);
4 stopped by the watchdog; 5 incomplete (killed, then recovered); 6 the run is still
running (report refuses it); 130 interrupted. 4, 5, 6 and 130 are no verdict.
"""

from __future__ import annotations

import importlib

import click

from loadgen import __version__
from loadgen.cli.exits import UsageErrorsExitOne
from loadgen.engine.logs import configure

# command name -> "module:attribute" of its click command, in the order `--help` lists them
COMMANDS: dict[str, str] = {
    "check": "loadgen.cli.check:check",
    "run": "loadgen.cli.run:run",
    "report": "loadgen.cli.report:report",
    "compare": "loadgen.cli.compare:compare",
    "merge": "loadgen.cli.merge:merge",
    "capacity": "loadgen.cli.capacity:capacity",
    "calibrate": "loadgen.cli.calibrate:calibrate",
    "plan": "loadgen.cli.plan:plan",
    "sim": "loadgen.sim.cli:sim",
}


class LoadgenGroup(UsageErrorsExitOne, click.Group):
    """The `loadgen` group: commands imported on first use, and usage errors exiting with 1,
    not click's 2 (2 means an SLO missed)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, name = target.partition(":")
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command), target
        return command


@click.group(cls=LoadgenGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="loadgen")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Log to stderr (and the run's loadgen.log): -v info, -vv debug with every request.",
)
def cli(verbose: int) -> None:
    """loadgen: load generator and SLO auditor for streaming LLM endpoints.

    \b
    Example:
      loadgen check workloads/chat.yaml
      loadgen run workloads/chat.yaml                      # against the built-in simulator
      loadgen run workloads/chat.yaml --url http://127.0.0.1:8000
    """
    configure(verbose)


def main() -> None:
    """Console-script entry point."""
    cli()
