"""The report's time windows end where the run's arrivals end: a real run at a constant rate
reads that rate in its last, partly run window, in windows sized by the run's length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.render.report.model import build_run_report
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, workload_file

LAX = ["--lag-bound-ms", "1000"]  # a shared test machine: the verdict is not under test


@pytest.fixture(scope="module")
def constant_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """50 requests at a constant 20/s: intended times 0, 50, ..., 2450 ms (the schedule's)."""
    folder = tmp_path_factory.mktemp("constant")
    path = workload_file(folder, chat_workload("constant", rate_per_s=20, requests=50))
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                          str(folder), "--run-id", "r", "-q", *LAX])  # fmt: skip
    assert result.exit_code == 0, result.output
    return folder / "r"


def test_the_default_window_fits_the_run_and_the_last_window_reads_the_true_rate(
    constant_run: Path,
) -> None:
    """2.5 s of arrivals at 20/s: 1 s windows (20 requests each; 10 s would be one window),
    and the last one, run for 0.5 s with 10 arrivals, reads 20/s, not 10/s."""
    report = build_run_report(constant_run)
    assert (report.window_s, report.window_chosen) == (1.0, True)
    assert report.schedule_end_s == pytest.approx(2.5)
    windows = report.windows
    assert windows.get_column("requests").to_list()[:3] == [20, 20, 10]
    assert windows.get_column("covered_s").to_list()[:3] == pytest.approx([1.0, 1.0, 0.5])
    assert windows.get_column("arrival_rate_per_s").to_list()[:3] == pytest.approx([20.0] * 3)


def test_the_report_marks_the_partial_window_and_names_the_rule(constant_run: Path) -> None:
    result = CliRunner().invoke(
        cli, ["report", str(constant_run), "--out", str(constant_run / "a")]
    )
    assert result.exit_code == 0, result.output
    markdown = (constant_run / "a" / "report.md").read_text()
    assert "| 2–3 s | 10 | 20.00 (over 0.5 s) |" in markdown
    assert "Windows: 1 s (chosen for this run:" in markdown
    assert "(the schedule ended at 2.5 s)" in markdown


def test_an_explicit_window_is_kept(constant_run: Path) -> None:
    """--window 10: one window as asked, its rate over the 2.5 s the schedule ran."""
    result = CliRunner().invoke(
        cli, ["report", str(constant_run), "--window", "10", "--out", str(constant_run / "b")]
    )
    assert result.exit_code == 0, result.output
    markdown = (constant_run / "b" / "report.md").read_text()
    assert "| 0–10 s | 50 | 20.00 (over 2.5 s) |" in markdown
    assert "Windows: 10 s, tumbling" in markdown


def test_a_step_longer_than_the_chosen_window_is_a_clear_error(constant_run: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(constant_run), "--step", "5"])
    assert result.exit_code == 1
    assert "longer than the window chosen for this run (1 s): give --window too" in result.output
    assert "Traceback" not in result.output


def test_a_step_that_would_make_billions_of_windows_is_refused_before_any_is_made(
    constant_run: Path,
) -> None:
    """`--window 1 --step 1e-9` (24 GiB and killed before the bound): exit 1 at once, with
    the count it would make, the bound, and the least step within it."""
    result = CliRunner().invoke(cli, ["report", str(constant_run), "--window", "1",
                                      "--step", "1e-9", "--out", str(constant_run / "c")])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "--window/--step: windows of 1 s every 1e-09 s would cut this run" in result.output
    assert "windows per class; the report makes at most 10,000: use a step of at least" in (
        result.output)  # fmt: skip
    assert "Traceback" not in result.output


def test_a_class_name_with_matplotlib_math_is_drawn_as_written(tmp_path: Path) -> None:
    """A class named `chat $\\q$` (mathtext with an unknown command) is reported like any
    other, its name in the figures as written: once `report` failed, blaming --window/--step."""
    text = chat_workload("math", rate_per_s=20, requests=5).replace("  chat:", '  "chat $\\\\q$":')
    path = workload_file(tmp_path, text)
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        ran = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                       str(tmp_path), "--run-id", "r", "-q", *LAX])  # fmt: skip
    assert ran.exit_code == 0, ran.output
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "r"), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "--window" not in result.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert list(summary["classes"]) == ["chat $\\q$"]
    assert list((tmp_path / "a").glob("*ttft_cdf.png"))


def test_report_writes_the_re_judged_checks_as_junit_and_markdown(tmp_path: Path) -> None:
    """`report RUN --slo ttft_ms=50 --junit --markdown` on a run whose first tokens took
    200 ms (met against its own 1,000 ms): the files hold the re-judged miss and the exit is
    2 (a 150 ms miss no send lag explains); the same flags on a results store are exit 1."""
    path = workload_file(tmp_path, chat_workload("slow", rate_per_s=20, requests=12))
    with ScriptedServer(lambda r: simple_chat(3, first_delay_s=0.2)) as server:
        ran = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                       str(tmp_path), "--run-id", "r", "-q", *LAX])  # fmt: skip
    assert ran.exit_code == 0, ran.output
    junit, markdown = tmp_path / "slo.xml", tmp_path / "slo.md"
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "r"), "--out", str(tmp_path / "o"),
                                      "--slo", "ttft_ms=50", "--junit", str(junit),
                                      "--markdown", str(markdown)])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert f"wrote {junit}" in result.output
    xml = junit.read_text()
    assert 'failures="1"' in xml  # TTFT, re-judged; TPOT and the generator pass
    assert '<property name="ttft_ms p50.target" value="≤ 50.0 ms" />' in xml
    assert "| chat | TTFT p50 (failures worst) | 2" in markdown.read_text()
    assert "**MISSED**" in markdown.read_text()
    store = CliRunner().invoke(cli, ["report", str(tmp_path), "--junit", str(junit)])
    assert store.exit_code == 1
    assert "--junit: takes one run folder, not a results store" in store.output
