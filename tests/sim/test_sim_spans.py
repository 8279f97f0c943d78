"""The simulator's own spans (`--otlp-traces-endpoint`): vLLM's names, the engine's exact
queue and prefill times, parented under the request's traceparent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import polars as pl
import pytest

from loadgen.engine.otlp_receiver import Address, SpanReceiver
from loadgen.sim.spans import parse_traceparent
from loadgen.testing import netpath

SPEED = 10.0
PREFILL_TOKENS_PER_S = 8000.0  # the seed's
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, SpanReceiver, Path]]:
    """A receiver, and a simulator (ten times real time, two sequences a batch, 4 output
    tokens) sending its spans to it and keeping its trace: (sim URL, receiver, trace)."""
    receiver = SpanReceiver(Address("127.0.0.1", 0), tmp_path)
    receiver.start()
    trace = tmp_path / "trace.jsonl"
    flags = ("--speed", str(SPEED), "--max-batch", "2", "--output-dist", "fixed:4",
             "--otlp-traces-endpoint", receiver.url, "--trace-file", str(trace))  # fmt: skip
    try:
        with netpath.simulator(tmp_path / "sim", *flags) as sim:
            yield sim.url, receiver, trace
    finally:
        receiver.close()


async def _send(url: str, headers: list[dict[str, str]], words: int) -> None:
    """One streamed chat request per header set, all at once."""
    body = {"model": "sim", "stream": True, "max_tokens": 4,
            "messages": [{"role": "user", "content": " ".join(["word"] * words)}]}  # fmt: skip
    async with httpx.AsyncClient(timeout=30) as client, anyio.create_task_group() as group:
        for each in headers:
            group.start_soon(partial(client.post, f"{url}/v1/chat/completions", json=body,
                                     headers=each))  # fmt: skip


def _spans(receiver: SpanReceiver, count: int) -> pl.DataFrame:
    """Wait (up to 20 s) until `count` spans have arrived."""
    deadline = time.monotonic() + 20
    while (spans := receiver.spans()).height < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return spans


def _trace(path: Path, count: int) -> dict[str, dict[str, Any]]:
    """The trace's request lines by X-Request-Id, once `count` have been flushed."""
    deadline = time.monotonic() + 10
    while True:
        lines = (
            [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        )
        found = {r["x_request_id"]: r for r in lines if r["type"] == "request"}
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_idle_prefill_is_p_over_8000_and_no_queue(served: tuple[str, SpanReceiver, Path]) -> None:
    """One request on an idle simulator: its span's prefill is exactly P / 8,000 s (real
    seconds: divided by the speed), its queue 0, under our traceparent; a not-sampled one
    gets no span, and one without gets a root span of a new trace."""
    url, receiver, _ = served
    sampled = {"X-Request-Id": "one", "traceparent": f"00-{TRACE}-{PARENT}-01"}
    anyio.run(_send, url, [sampled], 1000)
    anyio.run(
        _send, url, [{"X-Request-Id": "off", "traceparent": f"00-{TRACE[::-1]}-{PARENT}-00"}], 10
    )
    anyio.run(_send, url, [{"X-Request-Id": "root"}], 10)
    # "off" ended before "root" was sent, and spans go out in the order requests end: once
    # root's span is here, off's would be too
    spans = _spans(receiver, 2)
    assert sorted(spans.get_column("server_request_id").to_list()) == [
        "chatcmpl-one",
        "chatcmpl-root",
    ]
    one = spans.filter(pl.col("server_request_id") == "chatcmpl-one").row(0, named=True)
    assert (one["trace_id"], one["parent_span_id"], one["name"]) == (TRACE, PARENT, "llm_request")
    prompt = one["prefill_tokens"]
    assert prompt >= 1000
    assert one["prefill_ms"] == pytest.approx(
        prompt / PREFILL_TOKENS_PER_S * 1000 / SPEED, abs=1e-6
    )
    assert one["queue_ms"] == 0.0
    assert one["decode_tokens"] == 4
    assert one["ttft_ms"] >= one["prefill_ms"]  # from the door: the engine's part and more
    root = spans.filter(pl.col("server_request_id") == "chatcmpl-root").row(0, named=True)
    assert root["parent_span_id"] is None
    assert root["trace_id"] != TRACE


def test_queue_under_load_equals_the_trace(served: tuple[str, SpanReceiver, Path]) -> None:
    """Eight requests at once on two batch slots: six wait, and every span's queue and
    prefill are the engine's own times from the trace file, to the nanosecond."""
    url, receiver, trace = served
    ids = [f"r{i}" for i in range(8)]
    anyio.run(_send, url, [{"X-Request-Id": i} for i in ids], 2000)
    spans = _spans(receiver, len(ids))
    served_lines = _trace(trace, len(ids))
    assert sorted(spans.get_column("server_request_id").to_list()) == [f"chatcmpl-{i}" for i in ids]
    queued = 0
    for row in spans.iter_rows(named=True):
        line = served_lines[row["server_request_id"].removeprefix("chatcmpl-")]["engine"]
        engine_ms = 1e6 * SPEED  # engine ns per real ms
        queue = (line["scheduled_sim_ns"] - line["queued_sim_ns"]) / engine_ms
        prefill = (line["first_token_sim_ns"] - line["scheduled_sim_ns"]) / engine_ms
        assert row["queue_ms"] == pytest.approx(queue, abs=1e-9)
        assert row["prefill_ms"] == pytest.approx(prefill, abs=1e-9)
        assert row["prefill_tokens"] == served_lines[row["server_request_id"][9:]]["prompt_tokens"]
        queued += row["queue_ms"] > 0
    assert queued >= 4  # two slots, each request a 4-token answer: most of them waited


def test_traceparent_parse() -> None:
    """Sampled gives (trace, parent); -00 says no span; malformed or all-zero ids: none."""
    assert parse_traceparent(f"00-{TRACE}-{PARENT}-01") == (
        bytes.fromhex(TRACE),
        bytes.fromhex(PARENT),
    )
    assert parse_traceparent(f"00-{TRACE}-{PARENT}-00") is False
    assert parse_traceparent(f"00-{'0' * 32}-{PARENT}-01") is None
    assert parse_traceparent("garbage") is None
    assert parse_traceparent(None) is None


def test_bad_endpoint_is_a_clear_error() -> None:
    """A URL that is not http(s) is refused at start: exit 1, what and how to fix, no traceback."""
    done = subprocess.run([sys.executable, "-m", "loadgen", "sim", "--port", "0",
                           "--otlp-traces-endpoint", "ftp://127.0.0.1/v1/traces"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1
    assert "--otlp-traces-endpoint" in done.stderr
    assert "is not an http(s) URL" in done.stderr
    assert "Traceback" not in done.stderr
