"""The preflight's deadline: where it comes from, that it holds whatever the server sends,
and that its failure says what it waited for and the deadline, even under -q."""

from __future__ import annotations

from pathlib import Path
from time import perf_counter

import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.engine.preflight import preflight_deadline
from loadgen.testing import ScriptedServer
from loadgen.testing.builders import workload_file
from loadgen.testing.hostile import heartbeats_forever, silent_socket
from loadgen.workload.spec import loads

TWO_CLASSES = """
name: two
target: {api: openai-chat, model: m}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 10}
    requests: 3
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 3}
    deadlines: {first_token_s: 0.5, stall_s: 5, total_s: 10}
  batch:
    arrival: {process: constant, rate_per_s: 10}
    requests: 3
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 3}
    deadlines: {first_token_s: FIRST, stall_s: 5, total_s: 10}
"""


def test_the_deadline_is_the_longest_first_token_deadline_unless_told() -> None:
    """The longest class first-token deadline; --preflight-timeout replaces it; the
    watchdog caps either."""
    spec = loads(TWO_CLASSES.replace("FIRST", "1.5"))
    deadline_s, why = preflight_deadline(spec, None, 300.0)
    assert deadline_s == 1.5
    assert why.startswith("deadlines.first_token_s of class batch")
    assert preflight_deadline(spec, 4.0, 300.0) == (4.0, "--preflight-timeout")
    assert preflight_deadline(spec, 4.0, 2.0) == (2.0, "--watchdog, which caps it")


@pytest.mark.parametrize(
    ("script", "waiting_for"),
    [
        (heartbeats_forever, "answered HTTP 200 (text/event-stream) but streamed no generated"),
        (silent_socket, "accepted the connection but sent no response headers"),
    ],
    ids=["heartbeats", "silent"],
)
def test_a_stuck_preflight_fails_by_its_deadline_saying_why_under_quiet(
    script, waiting_for: str, tmp_path: Path
) -> None:
    """Heartbeats for ever or a silent socket: under -q the run exits 1 by the class's
    1 s first-token deadline, naming what it waited for, the deadline and its source."""
    path = workload_file(tmp_path, TWO_CLASSES.replace("FIRST", "1"))
    with ScriptedServer(script) as server:
        started = perf_counter()
        result = CliRunner().invoke(
            cli, ["run", str(path), "--url", server.url, "--out", str(tmp_path), "-q"]
        )
        elapsed_s = perf_counter() - started
    assert result.exit_code == 1, result.output
    assert waiting_for in result.output
    assert "within the preflight's 1 s deadline (deadlines.first_token_s of class batch" in (
        result.output
    )
    assert "Traceback" not in result.output
    assert elapsed_s < 15  # 1 s, plus a run's setup on a loaded machine; not minutes


def test_the_flag_sets_the_preflight_deadline(tmp_path: Path) -> None:
    """--preflight-timeout 0.5 ends the wait on heartbeats at 0.5 s and says so."""
    path = workload_file(tmp_path, TWO_CLASSES.replace("FIRST", "9"))
    with ScriptedServer(heartbeats_forever) as server:
        result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                          str(tmp_path), "-q", "--preflight-timeout", "0.5"])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "within the preflight's 0.5 s deadline (--preflight-timeout)" in result.output
    assert "heartbeats in 0.5 s" in result.output
