"""Each new API family through the real engine against a scripted loopback server: TTFT at
the first generated token, the visible-token time at the first content, N from usage,
server timings kept, error events as stream_error, and one record per plan.

Each family runs over loopback and in virtual time (the `engine_run` fixture). Over
loopback, timing assertions are lower bounds (a server pause guarantees at least that
much) or orderings, never upper bounds on wall-clock time; in virtual time they are exact.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import EngineRun

from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.engine.request_ids import plan_number
from loadgen.results.records import Outcome, RequestRecord, TokenSource, from_frame, to_frame
from loadgen.testing import PlanFactory, ReceivedRequest, Step, stream_steps
from loadgen.workload.spec import Deadlines, SloTargets

MS = 1_000_000
THINK_S = 0.05  # the scripted pause between the reasoning and the first content
FAST = Deadlines(first_token_s=5, stall_s=2, total_s=10)


def sse_event(name: str, obj: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def anthropic_stream(error: bool) -> list[Step]:
    def block(kind: str, **fields: Any) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                 "delta": {"type": kind, **fields}})  # fmt: skip

    start = {
        "type": "message_start",
        "message": {"role": "assistant", "content": [], "usage": {"input_tokens": 9}},
    }
    steps = stream_steps([sse_event("message_start", start), sse_event("ping", {"type": "ping"}),
                          block("thinking_delta", thinking="hmm")], done=False)  # fmt: skip
    tail = [block("text_delta", text=" a"), block("text_delta", text=" b")]
    if error:
        tail.append(
            sse_event(
                "error",
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            )
        )
    else:
        tail += [sse_event("message_delta", {"type": "message_delta",
                                             "delta": {"stop_reason": "max_tokens"},
                                             "usage": {"output_tokens": 5}}),
                 sse_event("message_stop", {"type": "message_stop"})]  # fmt: skip
    return _with_pause(steps, tail)


def tgi_stream(error: bool) -> list[Step]:
    def token(text: str, special: bool = False, details: Any = None) -> bytes:
        obj = {"token": {"id": 1, "text": text, "logprob": -1.0, "special": special},
               "generated_text": "x" if details else None, "details": details}  # fmt: skip
        return b"data:" + json.dumps(obj).encode() + b"\n\n"

    steps = stream_steps([token(" a")], done=False)
    if error:
        tail = [b'data:{"error":"Out of available cache blocks","error_type":"generation"}\n\n']
    else:
        details = {"finish_reason": "eos_token", "generated_tokens": 4, "input_length": 9}
        tail = [token(" b"), token(" c"), token("</s>", True, details)]
    return _with_pause(steps, tail, pause=0.0)


def ollama_stream(error: bool) -> list[Step]:
    msg = {"model": "tiny", "created_at": "2025-01-01T00:00:00Z", "done": False}
    steps = stream_steps(
        [line({**msg, "message": {"role": "assistant", "content": "", "thinking": "hm"}})],
        done=False,
    )
    if error:
        tail = [line({"error": "an error was encountered while running the model"})]
    else:
        done = {"done": True, "done_reason": "length", "total_duration": 90_000_000,
                "load_duration": 1_000_000, "prompt_eval_count": 9,
                "prompt_eval_duration": 20_000_000, "eval_count": 5,
                "eval_duration": 60_000_000}  # fmt: skip
        tail = [line({**msg, "message": {"role": "assistant", "content": " a"}}),
                line({**msg, "message": {"role": "assistant", "content": " b"}}),
                line({**msg, **done, "message": {"role": "assistant", "content": ""}})]  # fmt: skip
    return _with_pause(steps, tail)


def responses_stream(error: bool) -> list[Step]:
    def event(kind: str, **fields: Any) -> bytes:
        return sse_event(kind, {"type": kind, **fields})

    resp = {"id": "r", "object": "response", "status": "in_progress", "output": []}
    steps = stream_steps([event("response.created", response=resp),
                          event("response.reasoning_summary_text.delta", delta="plan")],
                         done=False)  # fmt: skip
    if error:
        tail = [
            event(
                "response.failed",
                response={**resp, "status": "failed", "error": {"message": "model crashed"}},
            )
        ]
    else:
        usage = {"input_tokens": 9, "output_tokens": 5,
                 "output_tokens_details": {"reasoning_tokens": 3}}  # fmt: skip
        tail = [event("response.output_text.delta", delta=" a"),
                event("response.output_text.delta", delta=" b"),
                event("response.completed", response={**resp, "usage": usage})]  # fmt: skip
    return _with_pause(steps, tail)


def _with_pause(
    head_steps: list[Step], tail: Sequence[bytes], pause: float = THINK_S
) -> list[Step]:
    """`head_steps` (a response whose body so far is chunked), a pause, then `tail` chunks."""
    from loadgen.testing import LAST_CHUNK, chunk

    assert head_steps[-1] == LAST_CHUNK
    return [*head_steps[:-1], pause, *(chunk(t) for t in tail), LAST_CHUNK]


STREAMS: dict[str, Callable[[bool], list[Step]]] = {
    "anthropic": anthropic_stream,
    "tgi": tgi_stream,
    "ollama-chat": ollama_stream,
    "openai-responses": responses_stream,
}
PATHS = {"anthropic": "/v1/messages", "tgi": "/generate_stream", "ollama-chat": "/api/chat",
         "openai-responses": "/v1/responses"}  # fmt: skip
ERRORS = {"anthropic": "Overloaded", "tgi": "generation: Out of available cache blocks",
          "ollama-chat": "an error was encountered", "openai-responses": "model crashed"}  # fmt: skip


LOOPBACK = EngineRun(exact=False)


def run_api(
    api: str, engine_run: EngineRun = LOOPBACK
) -> tuple[list[RequestRecord], list[ReceivedRequest]]:
    """Three plans: two streams that end well, one (request 1) with an error event."""

    def handler(request: ReceivedRequest) -> list[Step]:
        return STREAMS[api](plan_number(request.headers.get("x-request-id")) == 1)

    plans = PlanFactory(output_tokens=5, deadlines=FAST).at(0.0, 0.01, 0.02)
    records, server = engine_run(plans, handler, api=api)
    return records, server.requests


@pytest.mark.parametrize("api", sorted(STREAMS))
def test_each_api_through_the_engine(api: str, engine_run: EngineRun) -> None:
    """TTFT at the first generated token, visible content later, N from usage, errors fail."""
    records, requests = run_api(api, engine_run)
    assert [r.request_id for r in records] == [0, 1, 2]  # planned == recorded
    assert {r.path for r in requests} == {PATHS[api]}
    if api == "anthropic":
        assert requests[0].headers["anthropic-version"] == "2023-06-01"
    ok = [records[0], records[2]]
    for record in ok:
        assert record.outcome is Outcome.OK, record.error
        assert record.first_token_ns is not None
        assert record.first_content_ns is not None
        if api == "tgi":  # no reasoning: the first token is the first visible token
            assert record.first_reasoning_ns is None
            assert record.first_content_ns == record.first_token_ns
            assert (record.output_tokens, record.token_source) == (3, TokenSource.USAGE)
            assert len(record.chunk_ns) == 3  # the special EOS is not a chunk: no fake ITL
        else:
            assert record.first_reasoning_ns == record.first_token_ns
            assert record.first_content_ns - record.first_token_ns >= (THINK_S - 0.002) * 1e9
            if engine_run.exact:  # the scripted pause, exactly
                assert record.first_content_ns - record.first_token_ns == THINK_S * 1e9
            assert (record.output_tokens, record.token_source) == (5, TokenSource.USAGE)
            assert len(record.chunk_ns) == 3
        assert record.prompt_tokens == 9
    failed = records[1]
    assert failed.outcome is Outcome.STREAM_ERROR
    assert ERRORS[api] in str(failed.error)
    assert failed.first_token_ns is not None  # partial output before the error is kept


def test_ollama_server_timings_are_kept_and_summarized(tmp_path: Path) -> None:
    """Ollama's durations land in the records (ms), survive Parquet, and reach the summary."""
    records, _ = run_api("ollama-chat")
    timings = records[0].server_timings
    assert timings is not None
    assert (timings.prefill_ms, timings.decode_ms, timings.total_ms) == (20.0, 60.0, 90.0)
    assert (timings.prefill_tokens, timings.decode_tokens) == (9, 5)
    path = tmp_path / "records.parquet"
    to_frame(records).write_parquet(path)
    back = from_frame(pl.read_parquet(path))  # every column round-trips through Parquet
    assert back == from_frame(to_frame(records))
    assert back[0].server_timings == timings
    assert back[1].server_timings is None
    objectives = {"chat": Objective(name="chat", slo=SloTargets())}
    summary = audit(to_frame(records), run_id="r", objectives=objectives, planned=3)
    chat = summary.classes["chat"]
    assert chat.server_timings_ms.requests == 2
    assert chat.server_timings_ms.prefill_ms.p50 == 20.0
    assert chat.server_timings_ms.queue_ms.count == 0
    assert chat.reasoning_requests == 2
    ttfvt, ttft = chat.ttfvt_ms, chat.ttft_ms
    assert ttfvt.count == 2
    assert ttfvt.p50 - ttft.p50 >= (THINK_S - 0.002) * 1e3


def test_summary_without_reasoning_or_server_timings() -> None:
    """An API that reports neither: TTFVT equals TTFT, no reasoning, empty server block."""
    records, _ = run_api("tgi")
    chat = audit(to_frame(records), run_id="r", objectives={}, planned=3).classes["chat"]
    assert chat.reasoning_requests == 0
    assert chat.ttfvt_ms.p50 == chat.ttft_ms.p50
    assert chat.server_timings_ms.requests == 0
    assert chat.server_timings_ms.prefill_ms.p50 is None
