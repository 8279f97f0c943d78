"""Each command's help lists its own exit codes, not another command's table."""

from __future__ import annotations

import re

from click.testing import CliRunner

from loadgen.cli import cli


def exit_table(command: str) -> dict[int, str]:
    """The `Exit codes:` rows of `loadgen COMMAND --help`: code -> its first line."""
    text = CliRunner().invoke(cli, [command, "--help"], terminal_width=100).output
    table = text.split("Exit codes:", 1)[1]
    return {int(code): meaning for code, meaning in re.findall(r"^\s+(\d+)\s+(.+)$", table, re.M)}


def test_report_lists_its_own_exit_codes_not_runs() -> None:
    """`report --help` repeated run's table word for word; now report says what it returns
    for the run it re-audits (6 included: it refuses a live run) and run never lists 6."""
    run, report = exit_table("run"), exit_table("report")
    assert sorted(run) == [0, 1, 2, 3, 4, 5, 7, 130]
    assert sorted(report) == [0, 1, 2, 3, 4, 5, 6, 7, 130]
    assert report[6].startswith("the run is still running")
    assert "results store" in report[0]
    assert report != run
    assert all(report[code] != run[code] for code in (0, 1, 2, 3, 4, 5, 130))
