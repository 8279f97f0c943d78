"""Real streams replayed: the bytes vLLM 0.32.0 and LiteLLM's proxy 1.76.1 really sent
(tests/fixtures/streams/, how each was captured in its README), served byte for byte by a
scripted server to a real `loadgen run`, each with the record it must give. No real server
needed: these are the known answers the real-server tests found, kept in the fast suite.

The rows of docs/apis.md's "How a stream ends" table they check: a gateway's cut that ends
with `stop`, a usage block of its own and `[DONE]` is `truncated` when the length was forced,
its usage kept beside the tokens that arrived and the disagreement counted; LiteLLM's
Anthropic prompt count read from `message_delta`; an `{"error": …}` event without a `type`
in every API family is a `stream_error` with the gateway's message; vLLM's Responses length
cap (`response.completed` with `status: "incomplete"`) is finish `length`; vLLM's
`finish_reason: "abort"` is `truncated`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from click.testing import CliRunner

from loadgen.cli import cli
from loadgen.testing import ReceivedRequest, ScriptedServer, head

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "streams"


def replay(name: str) -> Any:
    """A handler that answers every request with the captured body, byte for byte."""
    body = (STREAMS / name).read_bytes()

    def handler(_request: ReceivedRequest) -> list[Any]:
        return [head(chunked=False, length=len(body)), body]

    return handler


def run_capture(tmp_path: Path, name: str, *, api: str, output_tokens: int,
                force: bool) -> tuple[int, dict[str, Any], str, str]:  # fmt: skip
    """One request through `loadgen run` against the replayed capture: the exit code, the
    record as a dict, the class's stream-end counts and the run's terminal output."""
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump({
        "name": "capture",
        "target": {"api": api, "model": "tiny", "force_output_tokens": force},
        "classes": {"c": {
            "arrival": {"process": "constant", "rate_per_s": 1},
            "requests": 1,
            "prompt_tokens": {"dist": "fixed", "value": 8},
            "output_tokens": {"dist": "fixed", "value": output_tokens},
            "slo": {"ttft_ms": 60000, "percentile": 99},
            "deadlines": {"first_token_s": 30, "stall_s": 30, "total_s": 60},
        }},
    }))  # fmt: skip
    with ScriptedServer(replay(name)) as server:
        result = CliRunner().invoke(cli, [
            "run", str(workload), "--url", server.url, "--out", str(tmp_path), "--run-id", "r",
            "--no-preflight", "--lag-bound-ms", "1000", "--cache", "warm",
            "--verdict", "point",  # one request bounds no p99: its point estimate is the verdict
        ])  # fmt: skip
    record = pl.read_parquet(tmp_path / "r" / "records.parquet").to_dicts()
    assert len(record) == 1, result.output
    summary = yaml.safe_load((tmp_path / "r" / "summary.json").read_text())
    return result.exit_code, record[0], summary["classes"]["c"]["stream_ends"], result.output


def test_litellm_cut_upstream_with_its_own_stop_and_usage_is_truncated(tmp_path: Path) -> None:
    """llama-server killed behind LiteLLM: 347 content chunks, then `stop`, a usage of 424
    tokens LiteLLM made up, `[DONE]`. Forced to 3000 tokens, the record is truncated (a
    breach, exit 2), both counts kept and the disagreement counted."""
    code, record, ends, output = run_capture(
        tmp_path, "litellm-chat-upstream-cut.sse", api="openai-chat", output_tokens=3000,
        force=True,
    )  # fmt: skip
    assert (record["outcome"], record["finish_reason"]) == ("truncated", "stop")
    assert (record["counted_output_tokens"], record["usage_output_tokens"]) == (347, 424)
    assert "of 3000 forced tokens" in record["error"]
    assert ends["usage_disagrees"] == 1
    assert code == 2, output


def test_litellm_sim_drop_short_of_its_forced_length_is_truncated(tmp_path: Path) -> None:
    """The simulator's drop after 5 of 20 forced tokens, as LiteLLM ends it (`stop`, usage 5,
    `[DONE]`): usage and stream agree, the length does not: truncated."""
    code, record, ends, output = run_capture(
        tmp_path, "litellm-chat-sim-drop.sse", api="openai-chat", output_tokens=20, force=True
    )
    assert (record["outcome"], record["output_tokens"]) == ("truncated", 5)
    assert ends["usage_disagrees"] == 0
    assert code == 2, output


def test_litellm_anthropic_prompt_tokens_come_from_message_delta(tmp_path: Path) -> None:
    """LiteLLM's Anthropic stream says `input_tokens: 0` in message_start and 17 in
    message_delta: the record holds 17, never 0."""
    code, record, _, output = run_capture(
        tmp_path, "litellm-anthropic-usage.sse", api="anthropic", output_tokens=8, force=False
    )
    assert record["outcome"] == "ok"
    assert record["prompt_tokens"] == 17
    assert code == 0, output


@pytest.mark.parametrize(
    ("name", "api"),
    [("litellm-chat-sim-err.sse", "openai-chat"),
     ("litellm-anthropic-sim-err.sse", "anthropic"),
     ("litellm-responses-sim-err.sse", "openai-responses")],
)  # fmt: skip
def test_a_gateway_error_event_without_a_type_is_a_stream_error_with_its_message(
    tmp_path: Path, name: str, api: str
) -> None:
    """`data: {"error": {"message": "litellm.ServiceUnavailableError: …", "type": null}}`
    mid-stream, in each API family: stream_error, the gateway's message kept."""
    code, record, _, output = run_capture(tmp_path, name, api=api, output_tokens=20, force=False)
    assert record["outcome"] == "stream_error"
    assert "ServiceUnavailableError" in record["error"]
    assert code == 2, output


def test_vllm_responses_at_its_length_cap_is_finish_length(tmp_path: Path) -> None:
    """vLLM ends every Responses stream with `response.completed`; at the cap it holds
    `status: "incomplete"`, `incomplete_details.reason: "max_output_tokens"`: finish length."""
    code, record, _, output = run_capture(
        tmp_path, "vllm-responses-length.sse", api="openai-responses", output_tokens=4,
        force=False,
    )  # fmt: skip
    assert (record["outcome"], record["finish_reason"]) == ("ok", "length")
    assert code == 0, output


def test_vllm_chat_abort_is_truncated(tmp_path: Path) -> None:
    """vLLM's engine dropped the request: `finish_reason: "abort"` after 355 tokens, usage,
    `[DONE]`: truncated, never ok."""
    code, record, _, output = run_capture(
        tmp_path, "vllm-chat-abort.sse", api="openai-chat", output_tokens=3000, force=True
    )
    assert (record["outcome"], record["finish_reason"]) == ("truncated", "abort")
    assert code == 2, output
