"""The command line: one module per command, each only parsing, calling the library, rendering.

`cli` is the `loadgen` group. Its commands are imported when they are used, so `loadgen
check` does not pay for matplotlib and `loadgen sim` not for polars; each command module
imports what it needs at its top. Shared options, the clean-error wrapper and the console
are in `loadgen.cli.options`; the exit codes, which `loadgen --help` lists, in
`loadgen.errors`.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import click

from loadgen import __version__
from loadgen.cli.exits import LOADGEN_EXITS, UsageErrorsExitOne
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


@click.group(
    cls=LoadgenGroup, epilog=LOADGEN_EXITS, context_settings={"help_option_names": ["-h", "--help"]}
)
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
    matplotlib_home()
    cli()


MPLCONFIGDIR = "MPLCONFIGDIR"  # matplotlib's config and font-cache folder


def matplotlib_home() -> Path | None:
    """Point matplotlib's config and font cache at a folder of this user's under the system's
    temp folder (`loadgen-matplotlib-UID`, owner-only), unless MPLCONFIGDIR says where:
    left to itself matplotlib writes its font cache to ~/.cache/matplotlib, and loadgen
    leaves nothing in the home folder. A folder of that name another user made, or one open
    to others, is not used: a fresh one is, removed at exit (the font cache is then rebuilt,
    ~0.3 s). Returns the folder chosen (None: the user's MPLCONFIGDIR)."""
    if os.environ.get(MPLCONFIGDIR):
        return None
    uid = os.getuid() if hasattr(os, "getuid") else None
    folder = Path(tempfile.gettempdir()) / f"loadgen-matplotlib-{uid if uid is not None else 0}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        found = folder.lstat()
        mine = uid is None or found.st_uid == uid
        usable = stat.S_ISDIR(found.st_mode) and mine and not found.st_mode & 0o077
    except OSError:
        usable = False
    if not usable:
        folder = Path(tempfile.mkdtemp(prefix="loadgen-matplotlib-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ[MPLCONFIGDIR] = str(folder)
    return folder
