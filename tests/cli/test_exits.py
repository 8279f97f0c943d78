"""Each command's help lists its own exit codes, not another command's table; the codes,
their meanings and each command's rows are written once (`loadgen.errors`), and the README's
and docs' tables are what `scripts/exit_codes.py` writes from them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen import errors
from loadgen.analysis.slo import EXIT_OF
from loadgen.cli import COMMANDS, cli
from loadgen.cli.exits import PAGES, regenerated
from loadgen.errors import COMMAND_EXITS, EXIT_CODES, EXIT_FELL_BEHIND, command_exits
from loadgen.results.runfolder import STOPS

ROOT = Path(__file__).resolve().parents[2]


def exit_table(command: str) -> dict[int, str]:
    """The `Exit codes:` rows of `loadgen COMMAND --help`: code -> its first line."""
    text = CliRunner().invoke(cli, [*command.split(), "--help"], terminal_width=100).output
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


def test_every_exit_code_has_one_meaning_and_every_listed_code_is_one() -> None:
    """Each EXIT_* value of loadgen.errors has exactly one row of meanings, and every code a
    command lists or the verdict's precedence names is one of them."""
    values = sorted(
        v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)
    )
    assert sorted(e.code for e in EXIT_CODES) == values
    listed = {code for command in COMMAND_EXITS for code, _ in command_exits(command)}
    assert listed | set(errors.VERDICT_PRECEDENCE) <= set(values)
    assert all(e.summary and e.meaning and e.in_ci for e in EXIT_CODES)


def test_each_commands_help_lists_the_codes_errors_gives_it() -> None:
    """Every command but the simulator's has an `Exit codes:` help of exactly its rows in
    loadgen.errors, and `loadgen --help` lists every code with its summary."""
    assert set(COMMAND_EXITS) == set(COMMANDS) - {"sim"}
    for command in COMMAND_EXITS:
        rows = command_exits(command)
        table = exit_table(command)
        assert list(table) == [code for code, _ in rows], command
        for code, meaning in rows:
            assert meaning.startswith(table[code]), (command, code)
    every = exit_table("")
    assert list(every) == [e.code for e in EXIT_CODES]
    assert all(e.summary.startswith(every[e.code]) for e in EXIT_CODES)


def test_commands_that_judge_a_run_list_every_verdict_and_every_stop() -> None:
    """run, report and merge exit with a run's verdict (met, missed, inconclusive, fell
    behind) or its stop (interrupted, watchdog, incomplete), so each lists all of them
    (merge's help listed no stop though a stopped shard makes the merged run one)."""
    verdicts = {*EXIT_OF.values(), EXIT_FELL_BEHIND, *STOPS.values()}
    for command in ("run", "report", "merge"):
        assert verdicts <= set(exit_table(command)), command


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_readme_and_docs_tables_are_the_ones_errors_writes(page: str) -> None:
    """README.md's and docs/exit-codes.md's generated blocks are what `python
    scripts/exit_codes.py` writes from loadgen.errors today (run it after editing a code)."""
    link_base, blocks = PAGES[page]
    text = (ROOT / page).read_text(encoding="utf-8")
    assert regenerated(text, link_base, blocks) == text, (
        f"run python scripts/exit_codes.py ({page})"
    )


def test_the_script_checks_the_pages_as_the_test_does() -> None:
    """`python scripts/exit_codes.py --check` finds every page current (exit 0, says nothing)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "exit_codes.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_a_page_that_drifted_or_lost_its_markers_is_caught() -> None:
    """The check can fail: code 5's row without its Ray clause (the README's drift) is
    rewritten, and a page whose markers are gone is an error, not a pass."""
    link_base, blocks = PAGES["README.md"]
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    ray = ", or (`run --ray`) a shard's process was killed or its node lost, each named"
    assert ray in text
    drifted = text.replace(ray, "")
    assert regenerated(drifted, link_base, blocks) == text
    with pytest.raises(ValueError, match="end of exit codes"):
        regenerated(drifted.replace("<!-- end of exit codes -->", ""), link_base, blocks)
