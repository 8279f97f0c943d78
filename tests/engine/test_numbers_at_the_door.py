"""Every number a server sends is checked at the door: whatever numbers (or non-numbers)
stand in the fields each adapter reads (usage, cache counts, a server's timings, a stop
reason, an id), the request's record writes to Parquet, its counts are within
`MAX_USAGE_COUNT` (so sums over any run stay in 64 bits), its durations finite and within
`MAX_SERVER_MS`, and the run's summary is JSON (no Infinity, no overflow)."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loadgen.adapters import adapter_for
from loadgen.adapters.protocol import MAX_SERVER_MS, MAX_USAGE_COUNT
from loadgen.analysis.audit import audit
from loadgen.analysis.objectives import Objective
from loadgen.codec import to_json
from loadgen.engine.exchange import Exchange
from loadgen.results.records import RequestRecord, to_frame
from loadgen.testing import PlanFactory
from loadgen.workload.spec import SloTargets

NUMBERS = st.one_of(
    st.integers(min_value=-(2**66), max_value=2**66),
    st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**64 - 1, -1, 0]),
    st.floats(allow_nan=False, allow_infinity=False),  # JSON has no NaN or Infinity
    st.sampled_from([1.7e308, -1.7e308, 1e18, 0.5, -0.0]),
    st.booleans(), st.none(), st.text(max_size=4), st.lists(st.integers(), max_size=2),
)  # fmt: skip


def final_events(api: str, v: list[Any]) -> list[dict[str, Any]]:
    """An output event and the closing events of `api`, every number it reads taken from `v`."""
    if api == "openai-chat":
        return [{"choices": [{"delta": {"content": "hello"}}]},
                {"id": v[0], "choices": [{"delta": {}, "finish_reason": v[1]}],
                 "usage": {"completion_tokens": v[2], "prompt_tokens": v[3],
                           "prompt_tokens_details": {"cached_tokens": v[4]}},
                 "timings": {"prompt_ms": v[5], "predicted_ms": v[6], "prompt_n": v[7],
                             "predicted_n": v[8], "cache_n": v[9]}}]  # fmt: skip
    if api == "anthropic":
        return [{"type": "message_start", "message": {"id": v[0], "usage": {
                    "input_tokens": v[3], "cache_read_input_tokens": v[4],
                    "cache_creation_input_tokens": v[7]}}},
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}},
                {"type": "message_delta", "delta": {"stop_reason": v[1]},
                 "usage": {"output_tokens": v[2], "input_tokens": v[8]}}]  # fmt: skip
    if api == "tgi":
        return [{"token": {"text": "hello"}},
                {"token": {"text": "", "special": True},
                 "details": {"finish_reason": v[1], "generated_tokens": v[2],
                             "input_length": v[3]}}]  # fmt: skip
    if api == "openai-responses":
        return [{"type": "response.output_text.delta", "delta": "hello"},
                {"type": "response.completed", "response": {"id": v[0], "status": "completed",
                 "usage": {"output_tokens": v[2], "input_tokens": v[3]}}}]  # fmt: skip
    return [{"message": {"content": "hello"}},  # ollama-chat
            {"done": True, "done_reason": v[1], "eval_count": v[2], "prompt_eval_count": v[3],
             "total_duration": v[5], "load_duration": v[6], "prompt_eval_duration": v[7],
             "eval_duration": v[8]}]  # fmt: skip


def record_of(api: str, events: list[dict[str, Any]]) -> RequestRecord:
    """The record of one exchange that received `events` (SSE or NDJSON, as `api` frames)."""
    adapter = adapter_for(api)
    lines = [json.dumps(e) for e in events]
    if adapter.framing == "ndjson":
        body = "".join(f"{line}\n" for line in lines).encode()
    else:
        body = "".join(f"data: {line}\n\n" for line in lines).encode()

    async def exchange() -> RequestRecord:
        done = Exchange(PlanFactory(output_tokens=16).at(0.0)[0], adapter, 0)
        done.on_head(200, {"content-type": "text/event-stream"}, 1)
        done.on_body(body, 2)
        done.on_end(3)
        return done.record()

    return asyncio.run(exchange())


@pytest.mark.parametrize("api", ["openai-chat", "anthropic", "tgi", "openai-responses",
                                 "ollama-chat"])  # fmt: skip
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(NUMBERS, min_size=10, max_size=10))
@example(values=[2**63 - 1] * 10)
@example(values=[1.7e308] * 10)
@example(values=[2**64 - 1] * 10)
def test_no_server_number_makes_a_record_unwritable_or_a_sum_overflow(
    api: str, values: list[Any]
) -> None:
    """Three records of the same stream write to Parquet and round-trip; every count in them
    is within MAX_USAGE_COUNT and every timing finite within MAX_SERVER_MS (llama.cpp's
    cache_n of 2**63 - 1 summed to a wrapped 9223372036854775805 over 3 requests, and
    prompt_ms + predicted_ms of 1.7e308 stored Infinity); the summary is strict JSON."""
    records = [record_of(api, final_events(api, values))] * 3
    frame = to_frame(records)
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    buffer.seek(0)
    assert pl.read_parquet(buffer).height == 3
    counts = ["output_tokens", "prompt_tokens", "cached_prompt_tokens", "usage_output_tokens"]
    for name in counts:
        assert (frame[name].fill_null(0) <= MAX_USAGE_COUNT).all(), name
        assert (frame[name].fill_null(0) >= 0).all(), name
    timings = frame["server_timings"].struct.unnest()
    for name, column in zip(timings.columns, timings.iter_columns(), strict=True):
        present = column.drop_nulls()
        bound = MAX_SERVER_MS if name.endswith("_ms") else MAX_USAGE_COUNT
        assert present.is_finite().all() if name.endswith("_ms") else True, name
        assert ((present >= 0) & (present <= bound)).all(), (name, present.to_list())
    summary = audit(frame, run_id="door", planned=3,
                    objectives={"chat": Objective(name="chat", slo=SloTargets(ttft_ms=1000))})  # fmt: skip
    json.dumps(to_json(summary), allow_nan=False)
