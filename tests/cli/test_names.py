"""One name per concept across commands (docs/commands.md, "One name per concept"), and
the old spellings still working, hidden, each saying its new name."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from loadgen.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def commands() -> dict[str, click.Command]:
    """Every `loadgen` command by name."""
    found = {}
    for name, target in COMMANDS.items():
        module, _, attribute = target.partition(":")
        found[name] = getattr(importlib.import_module(module), attribute)
    return found


def options(command: click.Command) -> dict[str, click.Option]:
    """A command's visible options by each of their flags."""
    return {flag: p for p in command.params if isinstance(p, click.Option) and not p.hidden
            for flag in p.opts}  # fmt: skip


def test_each_concept_has_one_name_and_one_form_in_every_command() -> None:
    """--format is text|json wherever it is (calibrate said table|json); --class repeatable
    wherever it is (report's took one); the price is --price-per-hour (plan took
    --gpu-hour-usd × --gpus-per-replica); a decode table is --decode-table (sim called it
    --decode-step-ms, plan's one step time)."""
    every = {name: options(command) for name, command in commands().items()}
    formats = {name: opts["--format"] for name, opts in every.items() if "--format" in opts}
    assert sorted(formats) == ["calibrate", "compare", "plan", "report"]
    for name, option in formats.items():
        assert isinstance(option.type, click.Choice)
        shown = option.get_help_record(click.Context(commands()[name]))
        assert shown is not None
        assert shown[0] == "--format [text|json]", name
    classes = {name: opts["--class"] for name, opts in every.items() if "--class" in opts}
    assert sorted(classes) == ["compare", "plan", "report"]
    assert all(option.multiple for option in classes.values())
    priced = sorted(name for name, opts in every.items() if "--price-per-hour" in opts)
    assert priced == ["capacity", "plan", "run"]
    assert not any("--gpu-hour-usd" in opts or "--gpus-per-replica" in opts
                   for opts in every.values())  # fmt: skip
    assert sorted(name for name, opts in every.items() if "--decode-table" in opts) == [
        "plan", "sim"
    ]  # fmt: skip
    assert sorted(name for name, opts in every.items() if "--decode-step-ms" in opts) == ["plan"]


def test_calibrate_format_table_still_works_as_text_and_says_so() -> None:
    """`calibrate --format table` (its old name for text) parses as text, with a warning."""
    calibrate = commands()["calibrate"]
    runner = CliRunner()
    with runner.isolation() as (_, err, *_):
        context = calibrate.make_context("calibrate", ["--format", "table"])
    assert context.params["fmt"] == "text"
    assert "--format table is deprecated: its new name is --format text" in err.getvalue().decode()
    assert calibrate.make_context("calibrate", ["--format", "json"]).params["fmt"] == "json"


def test_the_docs_table_names_every_old_spelling_with_its_new_one() -> None:
    """docs/commands.md's table of names has a row for each renamed spelling."""
    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    table = text.split("## One name per concept", 1)[1].split("\n## ", 1)[0]
    for old, new in (("sim --decode-step-ms", "--decode-table"),
                     ("sim.decode_step_ms", "decode_table"),
                     ("plan --gpu-hour-usd", "--price-per-hour"),
                     ("calibrate --format table", "--format text")):  # fmt: skip
        row = next((line for line in table.splitlines() if old in line), None)
        assert row is not None, old
        assert new in row


@pytest.mark.parametrize("command", ["report", "compare", "plan", "calibrate"])
def test_each_format_option_says_json_is_for_machines(command: str) -> None:
    """The same words for the same option."""
    help_text = CliRunner().invoke(commands()[command], ["--help"], terminal_width=200).output
    assert re.search(r"--format \[text\|json\]\s+json: the [^.]*? on stdout", help_text), command
