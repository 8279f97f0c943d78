"""Issues #26 and #31, the front door: `--duration` on closed-loop batches, what an unknown
model's 404 says, no half-made run folder, one request count and prompt bytes in `check`'s
memory line, SIGTERM during the preflight."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.testing import ReceivedRequest, ScriptedServer, simple_chat
from loadgen.testing.builders import workload_file
from loadgen.testing.hostile import silent_socket
from loadgen.workload.plans import PROMPT_HELD_COPIES, PROMPT_SENT_COPIES, estimate_memory
from loadgen.workload.spec import load, loads, override

WORKLOADS = Path(__file__).parents[2] / "workloads"

TINY = """
name: tiny
target: {api: openai-chat, model: sim}
classes:
  chat:
    arrival: {process: constant, rate_per_s: 20}
    requests: 2
    prompt_tokens: {dist: fixed, value: 5}
    output_tokens: {dist: fixed, value: 2}
    deadlines: {first_token_s: 30, stall_s: 30, total_s: 60}
"""


# --- --duration and closed-loop batches ------------------------------------------------------


def test_duration_on_a_workload_of_batches_only_is_a_clear_error() -> None:
    """summarization.yaml is one closed-loop batch: --duration is refused with exit 1,
    naming the class and saying to give --requests, never a traceback."""
    for command in ("check", "run"):
        result = CliRunner().invoke(
            cli, [command, str(WORKLOADS / "summarization.yaml"), "--duration", "15"]
        )
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output
        assert "--duration: every class of" in result.output
        assert "summarize: 40 documents, 8 in flight" in result.output
        assert "give --requests N" in result.output


def test_duration_replaces_open_loop_classes_and_leaves_a_batch_its_documents() -> None:
    """mixed.yaml --duration 15: chat's arrivals last 15 s; the batch keeps its 24 documents."""
    spec = override(load(WORKLOADS / "mixed.yaml"), duration_s=15)
    assert spec.classes["chat"].duration_s == 15
    assert spec.classes["chat"].requests is None
    assert spec.classes["summarize"].requests == 24
    result = CliRunner().invoke(cli, ["check", str(WORKLOADS / "mixed.yaml"), "--duration", "15"])
    assert result.exit_code == 0, result.output
    assert "24 docs" in result.output


# --- an unknown model's 404 ------------------------------------------------------------------

VLLM_404 = (b'{"error":{"message":"The model `sim` does not exist.","type":"NotFoundError",'
            b'"param":"model","code":404}}')  # fmt: skip
VLLM_OLD_404 = (b'{"object":"error","message":"The model `sim` does not exist.",'
                b'"type":"NotFoundError","param":null,"code":404}')  # fmt: skip


def _answer_404(body: bytes):  # type: ignore[no-untyped-def]
    def handler(_request: ReceivedRequest) -> list[bytes]:
        head = (f"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
        return [head.encode() + body]

    return handler


@pytest.mark.parametrize("body", [VLLM_404, VLLM_OLD_404], ids=["vllm", "vllm-older"])
def test_an_unknown_model_says_what_the_server_said_and_no_path_hint(
    body: bytes, tmp_path: Path
) -> None:
    """vLLM's 404 for a model it does not serve: its message is quoted, the hint names the
    model, not --url or target.path; exit 1."""
    path = workload_file(tmp_path, TINY)
    with ScriptedServer(_answer_404(body)) as server:
        result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                          str(tmp_path / "out"), "-q"])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "The model `sim` does not exist" in result.output
    assert "the server does not serve this model: check target.model (--model)" in result.output
    assert "endpoint there" not in result.output


def test_a_404_about_the_path_keeps_the_path_hint(tmp_path: Path) -> None:
    """A plain route 404 (FastAPI's `{"detail":"Not Found"}`) still points at the path."""
    path = workload_file(tmp_path, TINY)
    with ScriptedServer(_answer_404(b'{"detail":"Not Found"}')) as server:
        result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--out",
                                          str(tmp_path / "out"), "-q"])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "no openai-chat endpoint there: check --url, target.path and target.api" in (
        result.output
    )
    assert "does not serve this model" not in result.output


# --- no half-made run folder -----------------------------------------------------------------


def test_a_failed_preflight_leaves_no_folder_and_the_run_id_can_be_given_again(
    tmp_path: Path,
) -> None:
    """The preflight fails: no `out/again` folder, its log kept as `out/again.failed.log`
    (named in the error), ending with the error itself (it held one INFO line); the same
    --run-id then runs and records every plan."""
    path = workload_file(tmp_path, TINY)
    out = tmp_path / "out"
    args = ["run", str(path), "--out", str(out), "--run-id", "again", "-q",
            "--lag-bound-ms", "1000"]  # fmt: skip
    with ScriptedServer(_answer_404(VLLM_404)) as server:
        failed = CliRunner().invoke(cli, [*args, "--url", server.url])
    assert failed.exit_code == 1, failed.output
    assert not (out / "again").exists()
    kept = out / "again.failed.log"
    assert f"nothing was sent; its log: {kept}" in failed.output
    log = kept.read_text().splitlines()
    assert "run again: 2 planned requests" in log[0]
    assert " ERROR loadgen: run stopped: " in log[-1]
    assert failed.output.split("error: ", 1)[1].split(" (nothing was sent")[0] in log[-1]
    with ScriptedServer(lambda request: simple_chat(2)) as server:
        ok = CliRunner().invoke(cli, [*args, "--url", server.url])
    assert ok.exit_code == 0, ok.output
    summary = json.loads((out / "again" / "summary.json").read_text())
    assert summary["generator"]["recorded"] == 2


# --- check: one request count, prompt bytes --------------------------------------------------


def test_check_prints_one_request_count() -> None:
    """chat.yaml --duration 30 samples its Poisson sessions: the memory line counts the
    plan's requests, the same number as the table's title."""
    result = CliRunner().invoke(cli, ["check", str(WORKLOADS / "chat.yaml"), "--duration", "30"])
    assert result.exit_code == 0, result.output
    planned = re.search(r"(\d[\d,]*) planned requests", result.output)
    estimated = re.search(r"client memory: ~[^ ]+ [^ ]+ for (\d[\d,]*) requests", result.output)
    assert planned is not None, result.output
    assert estimated is not None, result.output
    assert planned.group(1) == estimated.group(1)


def test_the_memory_estimate_counts_a_datasets_prompt_bytes(tmp_path: Path) -> None:
    """One 4 MB line of prompt: the estimate is at least the line times the copies the
    client holds and sends (before: ~10 KiB, the line ignored)."""
    line_chars = 4_000_000
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "lorem " * (line_chars // 6)}))
    text = TINY.replace(
        "    prompt_tokens: {dist: fixed, value: 5}\n",
        "    dataset: {path: d.jsonl, format: jsonl}\n",
    )
    spec = loads(text, source=str(tmp_path / "w.yaml"))
    estimate = estimate_memory(spec)
    chars = len("lorem " * (line_chars // 6))
    assert estimate.prompt_chars == chars
    assert estimate.bytes >= chars * (PROMPT_HELD_COPIES + PROMPT_SENT_COPIES)
    small = estimate_memory(loads(TINY))
    assert small.bytes < 100_000  # the prompt is what makes the difference


# --- SIGTERM during the preflight ------------------------------------------------------------


def test_sigterm_during_the_preflight_exits_130_and_leaves_no_folder(tmp_path: Path) -> None:
    """The server never answers the preflight; SIGTERM then stops `loadgen run` as Ctrl-C
    does: exit 130 (not 143), no run folder left behind."""
    path = workload_file(tmp_path, TINY)
    out = tmp_path / "out"
    with ScriptedServer(silent_socket) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "run", str(path), "--url", server.url, "--out",
             str(out), "--run-id", "term", "--preflight-timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.requests, "the preflight never arrived"
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "Traceback" not in output
    assert not (out / "term").exists()
    assert "run stopped: interrupted (Ctrl-C or SIGTERM)" in (out / "term.failed.log").read_text()
