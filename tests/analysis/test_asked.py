"""What a workload asked for, in its own unit: a session or mixed workload's report and
terminal line say "1.0 sessions/s" or "closed loop of 8" where they showed a dash, and no
request rate is made up for work whose requests follow earlier answers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.analysis.objectives import Objective
from loadgen.cli import cli
from loadgen.render.terminal import asked_text
from loadgen.results.runfolder import _recorded_class
from loadgen.results.summary import AskedLoad, GeneratorHealth, LagStats
from loadgen.testing import ScriptedServer, simple_chat
from loadgen.testing.builders import workload_file
from loadgen.workload.spec import load

WORKLOADS = Path(__file__).parents[2] / "workloads"
LAX = ["--lag-bound-ms", "1000"]  # a shared test machine: the verdict is not under test


def sessions(rate: float, unit: str = "sessions") -> AskedLoad:
    return AskedLoad(unit=unit, rate_per_s=rate)


@pytest.mark.parametrize(
    ("workload", "expected", "requested"),
    [
        ("chat.yaml", {"chat": sessions(1.0)}, None),  # turns: sessions/s
        ("chat-smoke.yaml", {"chat": sessions(4.0, "requests")}, 4.0),
        ("mixed.yaml", {"chat": sessions(2.0, "requests"),
                        "summarize": AskedLoad(unit="closed_loop", concurrency=8)}, None),
        ("agent.yaml", {"agent": sessions(0.25, "trajectories")}, None),
        # conversations replayed whole are sessions: 4 req/s + 0.5 sessions/s is not 4.5 req/s
        ("dataset-chat.yaml", {"chat": sessions(4.0, "requests"),
                               "conversations": sessions(1.0)}, None),
        ("trace-azure-conv.yaml", {"conversation": AskedLoad(unit="trace")}, None),
    ],
)  # fmt: skip
def test_each_shipped_workload_asks_in_its_own_unit(
    workload: str, expected: dict[str, AskedLoad], requested: float | None
) -> None:
    """From the spec (a run) and from run.json's resolved spec (a re-audit): the same."""
    spec = load(WORKLOADS / workload)
    stored = json.loads(json.dumps(dataclasses.asdict(spec), default=str))["classes"]
    objectives = {name: Objective.of(cls) for name, cls in spec.classes.items()}
    assert {name: o.asked for name, o in objectives.items()} == expected
    for name in spec.classes:
        recorded = _recorded_class(name, stored[name])
        assert recorded.asked == expected[name]
        assert recorded.requested_rate_per_s == objectives[name].requested_rate_per_s
    rates = [o.requested_rate_per_s for o in objectives.values()]
    assert (None if None in rates else sum(r for r in rates if r is not None)) == requested


def generator(asked: dict[str, AskedLoad], requested: float | None = None) -> GeneratorHealth:
    lag = LagStats(p50=1.0, p99=1.0, max=1.0)
    return GeneratorHealth(planned=1, sent=1, recorded=1, retries=0, lag_ms=lag, send_lag_ms=lag,
                           chained_lag_ms=lag, target_rate_per_s=1.7, achieved_rate_per_s=1.7,
                           client_errors=0, fell_behind=False, lag_bound_ms=5.0,
                           requested_rate_per_s=requested, asked=asked)  # fmt: skip


def test_the_asked_text_names_each_class_in_its_unit() -> None:
    assert asked_text(generator({"chat": sessions(1.0)})) == "1.0 sessions/s"
    mixed = {"chat": sessions(2.0, "requests"),
             "summarize": AskedLoad(unit="closed_loop", concurrency=8)}  # fmt: skip
    assert asked_text(generator(mixed)) == "chat 2.0 req/s + summarize closed loop of 8"
    assert asked_text(generator({"a": AskedLoad(unit="trace")})) == "a trace's times"
    assert asked_text(generator({"chat": sessions(5.0, "requests")}, 5.0)) == "5.0 req/s"
    assert asked_text(generator({})) is None  # a summary from before loadgen recorded it
    agent = {"agent": sessions(0.25, "trajectories")}
    assert asked_text(generator(agent)) == "0.25 trajectories/s"  # as written, not "0.2"
    assert asked_text(generator({"c": sessions(1 / 3)})) == "0.333 sessions/s"
    assert asked_text(generator({"c": sessions(1500.0, "requests")}, 1500.0)) == "1500.0 req/s"


SESSIONS = """name: sessions
target: {api: openai-chat, model: m}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 20}
    requests: 6
    turns: {dist: fixed, value: 2}
    think_time_s: {dist: fixed, value: 0.01}
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 3}
"""
MIXED = (
    SESSIONS.replace("name: sessions", "name: mixed")
    + """  docs:
    kind: summarization
    arrival: {process: constant, rate_per_s: 1}
    requests: 4
    concurrency: 2
    prompt_tokens: {dist: fixed, value: 50}
    output_tokens: {dist: fixed, value: 3}
"""
)


@pytest.mark.parametrize(
    ("text", "asked", "line", "cell"),
    [
        (SESSIONS, {"chat": {"unit": "sessions", "rate_per_s": 20.0, "concurrency": None}},
         "asked 20.0 sessions/s; requests", "| rate asked | 20.0 sessions/s (no run-wide"),
        (MIXED, {"chat": {"unit": "sessions", "rate_per_s": 20.0, "concurrency": None},
                 "docs": {"unit": "closed_loop", "rate_per_s": None, "concurrency": 2}},
         "asked chat 20.0 sessions/s + docs closed loop of 2; requests",
         "| rate asked | chat 20.0 sessions/s + docs closed loop of 2 (no run-wide"),
    ],
)  # fmt: skip
@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_a_session_and_a_mixed_run_show_what_was_asked(
    tmp_path: Path, text: str, asked: dict[str, object], line: str, cell: str
) -> None:
    """A real run (scripted server): summary.json's generator.asked, the terminal's line and
    the report's generator row say what was asked, where they showed "—" before."""
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, ["run", str(workload_file(tmp_path, text)), "--url",
                                          server.url, "--out", str(tmp_path), "--run-id", "r",
                                          *LAX])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["generator"]["asked"] == asked
    assert summary["generator"]["requested_rate_per_s"] is None  # no request rate was asked
    assert line in " ".join(result.output.split())
    report = CliRunner().invoke(cli, ["report", str(tmp_path / "r")])
    assert report.exit_code == 0, report.output
    markdown = (tmp_path / "r" / "report" / "report.md").read_text()
    assert cell in markdown
    assert "no run-wide request rate was asked" in markdown
    assert "| request rate scheduled | " in markdown  # one unit per row: req/s apart
    assert "| request rate achieved | " in markdown


OPEN_BATCH = """name: open-batch
target: {api: openai-chat, model: m}
classes:
  chat:
    arrival: {process: poisson, rate_per_s: 4}
    requests: 6
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 3}
  docs:
    kind: summarization
    arrival: {process: poisson, rate_per_s: 4}
    requests: 6
    prompt_tokens: {dist: fixed, value: 50}
    output_tokens: {dist: fixed, value: 3}
"""


@pytest.mark.slow  # ~3 s on 2 cores: left to .ci/run's second part
def test_an_open_loop_summarization_class_asks_a_request_rate(tmp_path: Path) -> None:
    """A summarization class without concurrency sends one document per arrival: Poisson at
    4/s asks 4.0 req/s, so with a 4/s chat class the run asked 8.0 req/s, from the spec,
    from run.json's resolved spec, and in a real run's summary.json and terminal line."""
    spec = load(workload_file(tmp_path, OPEN_BATCH))
    stored = json.loads(json.dumps(dataclasses.asdict(spec), default=str))["classes"]
    docs = Objective.of(spec.classes["docs"])
    assert docs.asked == sessions(4.0, "requests")
    assert docs.requested_rate_per_s == 4.0
    assert _recorded_class("docs", stored["docs"]).requested_rate_per_s == 4.0
    with ScriptedServer(lambda r: simple_chat(3)) as server:
        result = CliRunner().invoke(cli, ["run", str(workload_file(tmp_path, OPEN_BATCH)),
                                          "--url", server.url, "--out", str(tmp_path),
                                          "--run-id", "r", *LAX])  # fmt: skip
    assert result.exit_code == 0, result.output
    generator = json.loads((tmp_path / "r" / "summary.json").read_text())["generator"]
    assert generator["requested_rate_per_s"] == 8.0
    assert "rate 8.0 req/s asked, " in " ".join(result.output.split())
    report = CliRunner().invoke(cli, ["report", str(tmp_path / "r"), "--out", str(tmp_path / "a")])
    assert report.exit_code == 0, report.output
    again = json.loads((tmp_path / "a" / "summary.json").read_text())["generator"]
    assert again["requested_rate_per_s"] == 8.0  # the re-audit reads it from run.json
