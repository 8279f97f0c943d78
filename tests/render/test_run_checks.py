"""`run --junit` / `--markdown`: a testcase per class per SLO check, failures with figures."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.analysis.repeats import repeats_of
from loadgen.cli import cli
from loadgen.render.repeats_view import spread_markdown
from loadgen.render.run_checks import (
    render_repeats_junit,
    render_repeats_markdown,
    render_run_junit,
    render_run_markdown,
    rows,
)
from loadgen.results.runfolder import read_summary
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import chat_workload, workload_file

JUNIT_SCHEMA = {  # the common JUnit schema's (junit-10.xsd) elements and attributes we use
    "testsuites": {"name", "time", "tests", "failures", "errors"},
    "testsuite": {"name", "tests", "failures", "errors", "skipped", "time"},
    "properties": set(),
    "property": {"name", "value"},
    "testcase": {"name", "classname", "time"},
    "failure": {"message", "type"},
    "skipped": {"message", "type"},
    "system-out": set(),
}


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, Path]:
    """A run whose TTFT target (100 ms) cannot hold: the server waits 500 ms before the first
    token, a miss no client lag under 400 ms could explain; TPOT's 1 s target holds (the
    tokens come back to back). 30 requests: a p90 is bounded from above by 29 (at 95 %),
    so both checks are decided."""
    tmp = tmp_path_factory.mktemp("checks")
    text = chat_workload(requests=30, rate_per_s=20,
                         slo="{ttft_ms: 100, tpot_ms: 1000, percentile: 90}")  # fmt: skip
    path = workload_file(tmp, text)
    with ScriptedServer(lambda r: simple_chat(3, first_delay_s=0.5)) as server:
        result = CliRunner().invoke(
            cli, ["run", str(path), "--url", server.url, "--out", str(tmp), "--run-id", "f",
                  "-q", "--junit", str(tmp / "junit.xml"),
                  "--markdown", str(tmp / "slo.md")],
        )  # fmt: skip
    return result.exit_code, result.output, tmp


def test_junit_has_the_failing_check_with_its_figures(failing_run: tuple[int, str, Path]) -> None:
    """One testcase per check of the class plus the generator's; the TTFT case fails with
    summary.json's measured value, its bounds, the target and the request count; TPOT
    passes."""
    code, output, tmp = failing_run
    assert code == 2, output
    root = ET.fromstring((tmp / "junit.xml").read_text())
    assert root.get("tests") == "3"
    assert root.get("failures") == "1"
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    assert set(cases) == {("run.chat", "ttft_ms p90"), ("run.chat", "tpot_ms p90"),
                          ("run.generator", "client time")}  # fmt: skip
    check = json.loads((tmp / "f" / "summary.json").read_text())["classes"]["chat"]["slo"]
    ttft = next(c for c in check["checks"] if c["metric"] == "ttft_ms")
    assert ttft["value_ms"] >= 500  # the server's own wait: a floor, whatever the load
    failure = cases[("run.chat", "ttft_ms p90")].find("failure")
    assert failure is not None
    message = failure.get("message", "")
    assert f"{ttft['value_ms']:,.1f} ms" in message
    assert ttft["low_ms"] > 100  # MISSED: the lower bound misses the target
    assert f"95% bounds {ttft['low_ms']:.0f}–{ttft['high_ms']:.0f} ms" in message
    assert "target ≤ 100.0 ms" in message
    assert "over 30 requests" in message
    assert cases[("run.chat", "tpot_ms p90")].find("failure") is None
    for element in root.iter():
        assert set(element.attrib) <= JUNIT_SCHEMA[element.tag], element.tag


def test_markdown_is_the_same_table(failing_run: tuple[int, str, Path]) -> None:
    """The Markdown twin: a row per testcase in the terminal's words (it said `pass` and
    `FAIL` where the terminal says MET and MISSED), the miss in bold and explained below."""
    _, _, tmp = failing_run
    text = (tmp / "slo.md").read_text()
    assert text.startswith("### loadgen run: SLO MISSED (exit 2)")
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 3  # header + the three cases
    assert "| chat | TTFT p90 (failures worst) |" in text
    assert "| **MISSED** |" in table[1]
    assert "| MET |" in table[2]
    assert "pass" not in text
    assert "- TTFT p90 (failures worst) of class chat:" in text


def test_a_stopped_run_skips_every_case(failing_run: tuple[int, str, Path]) -> None:
    """An interrupted run judges nothing: each case is skipped, saying how it stopped."""
    _, _, tmp = failing_run
    summary = read_summary(tmp / "f")
    stopped = dataclasses.replace(
        summary,
        verdict=dataclasses.replace(summary.verdict, status="interrupted", slo_met=None,
                                    exit_code=130),
    )  # fmt: skip
    assert all(r.status == "skipped" for r in rows(stopped))
    root = ET.fromstring(render_run_junit(stopped))
    assert root.get("failures") == "0"
    assert len(list(root.iter("skipped"))) == 3
    assert all(s.get("message", "").startswith("not judged: ") for s in root.iter("skipped"))
    markdown = render_run_markdown(stopped)
    assert "no verdict" in markdown
    assert "| not judged |" in markdown
    assert "MISSED" not in markdown


def test_a_missing_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    """--junit into a folder that does not exist: exit 1 before any traffic, no traceback."""
    path = workload_file(tmp_path, chat_workload())
    result = CliRunner().invoke(
        cli, ["run", str(path), "--url", "http://127.0.0.1:9", "--out", str(tmp_path), "-q",
              "--junit", str(tmp_path / "nope" / "j.xml")],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "--junit" in result.output
    assert "does not exist" in result.output
    assert not list(tmp_path.glob("*/run.json"))


def test_a_generator_that_fell_behind_fails_as_invalid(failing_run: tuple[int, str, Path]) -> None:
    """A run whose generator fell behind: the generator's case fails as `invalid` with the
    rule's sentence, and the Markdown title says the run is invalid."""
    _, _, tmp = failing_run
    summary = read_summary(tmp / "f")
    behind = dataclasses.replace(
        summary,
        generator=dataclasses.replace(summary.generator, fell_behind=True, reason="the reason"),
        verdict=dataclasses.replace(summary.verdict, status="fell_behind", exit_code=3),
    )
    root = ET.fromstring(render_run_junit(behind))
    failures = {f.get("type"): f.get("message", "") for f in root.iter("failure")}
    assert set(failures) == {"slo", "invalid"}
    assert failures["invalid"] == "the generator fell behind: the reason"
    assert render_run_markdown(behind).startswith(
        "### loadgen run: INVALID (the generator fell behind) (exit 3)"
    )


def test_an_inconclusive_check_fails_its_case_as_inconclusive(tmp_path: Path) -> None:
    """Ten quick requests against a p99 target: exit 7; the TTFT case fails with type
    `inconclusive` saying 299 requests are needed (CI must not read it as a pass), the
    Markdown title says INCONCLUSIVE and its row is in bold."""
    text = chat_workload(requests=10, rate_per_s=20, slo="{ttft_ms: 1000, percentile: 99}")
    path = workload_file(tmp_path, text)
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(
            cli, ["run", str(path), "--url", server.url, "--out", str(tmp_path), "--run-id",
                  "i", "-q", "--lag-bound-ms", "1000", "--junit", str(tmp_path / "j.xml"),
                  "--markdown", str(tmp_path / "i.md")],
        )  # fmt: skip
    assert result.exit_code == 7, result.output
    root = ET.fromstring((tmp_path / "j.xml").read_text())
    failures = {f.get("type"): f.get("message", "") for f in root.iter("failure")}
    assert set(failures) == {"inconclusive"}
    assert "open (needs 299 requests)" in failures["inconclusive"]
    markdown = (tmp_path / "i.md").read_text()
    assert markdown.startswith("### loadgen run: SLO INCONCLUSIVE")
    assert "**INCONCLUSIVE**" in markdown


def test_repeats_write_every_runs_checks_and_the_spread(failing_run: tuple[int, str, Path]) -> None:
    """`run --repeats` with --junit/--markdown (refused before): the JUnit holds each run's
    suites (`RUN-ID.class`), failing where that run missed; the Markdown names the worst
    verdict and exit, every run's checks in one table with a run column, the between-run
    spread, and why each miss is one, after its run id."""
    _, _, tmp = failing_run
    missed = read_summary(tmp / "f")
    met = dataclasses.replace(
        missed, run_id="f-r2",
        verdict=dataclasses.replace(missed.verdict, status="met", slo_met=True, exit_code=0),
    )  # fmt: skip
    first = dataclasses.replace(missed, run_id="f-r1")
    root = ET.fromstring(render_repeats_junit([first, met]))
    suites = [s.get("name") for s in root.iter("testsuite")]
    assert suites == ["f-r1.chat", "f-r1.generator", "f-r2.chat", "f-r2.generator"]
    assert [s.get("failures") for s in root.iter("testsuite")] == ["1", "0", "1", "0"]
    markdown = render_repeats_markdown([first, met], 2, spread_markdown(repeats_of([first, met])))
    assert markdown.startswith("### loadgen run --repeats 2: SLO MISSED (exit 2, the worst run's)")
    table = [line for line in markdown.splitlines() if line.startswith("| `f-r")]
    assert len(table) == 2 * 3  # two runs, two checks and the generator each
    assert "| `f-r1` | chat | TTFT p90 (failures worst) |" in markdown
    assert "**between-run spread of 2 repeats**" in markdown
    assert "| chat | ttft_ms p90 |" in markdown
    assert "- f-r1: TTFT p90 (failures worst) of class chat:" in markdown


@pytest.mark.slow  # ~3 s: the built-in simulator is started
def test_a_run_against_the_built_in_simulator_says_so_everywhere(tmp_path: Path) -> None:
    """No --url, -q: the terminal, the JUnit (its name, a `target` property, a case named
    for it), the Markdown and run.json all name the built-in simulator, so a nightly job
    that lost its --url cannot pass for a test of the server."""
    path = workload_file(tmp_path, chat_workload(requests=5, rate_per_s=20))
    junit, markdown = tmp_path / "junit.xml", tmp_path / "slo.md"
    result = CliRunner().invoke(cli, ["run", str(path), "--out", str(tmp_path), "--run-id", "s",
                                      "-q", "--junit", str(junit), "--markdown", str(markdown)])  # fmt: skip
    assert result.exit_code == 0, result.output
    note = "the built-in simulator (no --url): these figures are the simulator's, not a server's"
    assert f"target: {note}" in " ".join(result.stdout.split())
    root = ET.parse(junit).getroot()
    assert root.get("name") == "loadgen run s against the built-in simulator (no --url)"
    names = {(c.get("classname"), c.get("name")) for c in root.iter("testcase")}
    assert ("run.target", "built-in simulator (no --url)") in names
    targets = {p.get("value") for p in root.iter("property") if p.get("name") == "target"}
    assert targets == {note}
    assert f"**target: {note}**" in markdown.read_text()
    info = json.loads((tmp_path / "s" / "run.json").read_text())
    assert info["target"]["builtin_sim"] is True


def test_a_run_against_a_url_names_no_simulator(failing_run: tuple[int, str, Path]) -> None:
    """A run with --url: its JUnit's `target` property is the URL, and nothing says
    simulator."""
    _, output, tmp = failing_run
    summary = read_summary(tmp / "f")
    info = json.loads((tmp / "f" / "run.json").read_text())
    assert info["target"]["builtin_sim"] is False
    assert "simulator" not in output
    assert "simulator" not in (tmp / "junit.xml").read_text()
    assert "simulator" not in render_run_markdown(summary)
