"""`--api`, `--model` and `--force-output-tokens` on `check` and `run`, the API key in the
header each API expects, and the report's visible-token and server-timing tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.testing import ReceivedRequest, ScriptedServer, Step, simple_chat, stream_steps
from loadgen.testing.builders import chat_workload, workload_file

WORKLOAD = chat_workload(requests=3, output_tokens=2, slo=None, deadlines=None)


def write(tmp_path: Path, text: str = WORKLOAD) -> Path:
    return workload_file(tmp_path, text)


def ollama(request: ReceivedRequest) -> list[Step]:
    """An Ollama /api/chat stream with thinking, content and the server's durations."""

    def line(obj: dict[str, Any]) -> bytes:
        return json.dumps(obj).encode() + b"\n"

    done = {"done": True, "done_reason": "length", "total_duration": 9_000_000,
            "prompt_eval_count": 5, "prompt_eval_duration": 2_000_000, "eval_count": 2,
            "eval_duration": 6_000_000, "message": {"role": "assistant", "content": ""}}  # fmt: skip
    return stream_steps([
        line({"message": {"role": "assistant", "content": "", "thinking": "hm"}, "done": False}),
        line({"message": {"role": "assistant", "content": " a"}, "done": False}),
        line({"message": {"role": "assistant", "content": " b"}, "done": False}),
        line(done),
    ], done=False)  # fmt: skip


def run(tmp_path: Path, url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["run", str(write(tmp_path)), "--url", url, "--out",
                                    str(tmp_path), "--run-id", "r", "-q", "--lag-bound-ms",
                                    "1000", *args])  # fmt: skip


def test_check_accepts_the_target_overrides(tmp_path: Path) -> None:
    """check takes --api/--model/--no-force-output-tokens; an unknown API is a usage error."""
    ok = CliRunner().invoke(cli, ["check", str(write(tmp_path)), "--api", "anthropic",
                                  "--model", "tiny", "--no-force-output-tokens"])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(cli, ["check", str(write(tmp_path)), "--api", "mistral"])
    assert bad.exit_code == 1
    assert "mistral" in bad.output


def test_run_with_api_and_model_overrides_and_the_report(tmp_path: Path) -> None:
    """--api ollama-chat --model tiny: the path follows the API, the body carries the model;
    the summary and the report show the visible-token time and the server's timings."""
    with ScriptedServer(ollama) as server:
        result = run(tmp_path, server.url, "--api", "ollama-chat", "--model", "tiny")
        requests = server.requests
    assert result.exit_code == 0, result.output
    assert {r.path for r in requests} == {"/api/chat"}
    assert {r.body["model"] for r in requests} == {"tiny"}
    assert requests[-1].body["options"] == {"num_predict": 2}
    chat = json.loads((tmp_path / "r" / "summary.json").read_text())["classes"]["chat"]
    assert chat["reasoning_requests"] == 3
    assert chat["ttfvt_ms"]["count"] == 3
    assert chat["server_timings_ms"]["prefill_ms"]["p50"] == 2.0
    report = CliRunner().invoke(cli, ["report", str(tmp_path / "r")])
    assert report.exit_code in (0, 2), report.output
    markdown = next((tmp_path / "r" / "report").glob("*.md")).read_text()
    assert "TTFVT (first visible token; 3 with reasoning)" in markdown
    assert "Server-reported timings (3 ok requests)" in markdown


def test_no_force_output_tokens_drops_ignore_eos(tmp_path: Path) -> None:
    """--no-force-output-tokens: an OpenAI body without ignore_eos/min_tokens (transformers
    serve answers HTTP 422 to them)."""
    with ScriptedServer(lambda r: simple_chat(2)) as server:
        result = run(tmp_path, server.url, "--no-force-output-tokens")
        bodies = [r.body for r in server.requests]
    assert result.exit_code == 0, result.output
    assert bodies
    assert not any("ignore_eos" in b or "min_tokens" in b for b in bodies)


@pytest.mark.parametrize(
    ("api", "header", "value"),
    [
        ("anthropic", "x-api-key", "sk-canary-1"),
        ("ollama-chat", "authorization", "Bearer sk-canary-1"),
    ],
)
def test_api_key_goes_where_the_api_expects_and_is_redacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api: str, header: str, value: str
) -> None:
    """Anthropic gets x-api-key (+ anthropic-version), the others Bearer; the key never
    reaches run.json or the records, even when the server echoes it in an error."""
    monkeypatch.setenv("CANARY_KEY", "sk-canary-1")
    path = write(tmp_path, WORKLOAD.replace("model: m}", "model: m, api_key_env: CANARY_KEY}"))

    def echo(request: ReceivedRequest) -> list[Step]:
        body = f"bad key {request.headers.get(header)}".encode()
        return [b"HTTP/1.1 401 X\r\nContent-Length: %d\r\n\r\n" % len(body) + body]

    with ScriptedServer(echo) as server:
        result = CliRunner().invoke(cli, ["run", str(path), "--url", server.url, "--api", api,
                                          "--out", str(tmp_path), "--run-id", "r", "-q",
                                          "--no-preflight", "--lag-bound-ms", "1000"])  # fmt: skip
        seen = server.requests[0].headers
    assert result.exit_code in (0, 2), result.output
    assert seen[header] == value
    assert ("anthropic-version" in seen) is (api == "anthropic")
    errors = pl.read_parquet(tmp_path / "r" / "records.parquet").get_column("error").to_list()
    assert errors == ["HTTP 401: bad key <redacted>"] * 3  # the server echoed the key
    for name in ("run.json", "summary.json"):
        assert "sk-canary-1" not in (tmp_path / "r" / name).read_text()
