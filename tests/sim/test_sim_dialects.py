"""The simulator in every dialect: wire shapes, exact tokens, faults and its trace, then end to end.

The wire tests decode each stream with a small decoder written here (not the client's
adapters), so a shared misunderstanding cannot hide. Servers run at a high --speed;
assertions are about order, shape and counts, or compare the server's own trace times.
"""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadgen.run.processes.simulator import SimProcess, running_sim

SPEED = 50.0
PROMPT = "one two three four"  # 4 prompt tokens
SYSTEM = "be brief"  # 2 more where the dialect has a system field


@dataclass
class Decoded:
    """What a stream said, by this test's own reading of the dialect."""

    text: str = ""
    reasoning: str = ""
    output_tokens: int | None = None  # from the server's usage / counts
    prompt_tokens: int | None = None
    reasoning_tokens: int | None = None
    error: str | None = None
    names: list[str] = field(default_factory=list)  # event names / kinds, in order
    ended: bool = False  # the dialect's explicit end was seen


def sse_events(raw: bytes) -> Iterator[tuple[str | None, str]]:
    """(event name, data) of each SSE event; comments as ("comment", text)."""
    for block in raw.decode().split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith(":"):
                yield "comment", line[1:].strip()
            elif line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            yield name, "\n".join(data)


def decode_openai(raw: bytes) -> Decoded:
    out = Decoded()
    for name, data in sse_events(raw):
        if name == "comment":
            out.names.append("comment")
            continue
        if data == "[DONE]":
            out.names.append("[DONE]")
            out.ended = True
            continue
        obj = json.loads(data)
        if "error" in obj:
            out.error = obj["error"]["message"]
            out.names.append("error")
            continue
        delta = obj["choices"][0].get("delta", {}) if obj["choices"] else {}
        out.names.append("role" if "role" in delta else "chunk")
        out.text += delta.get("content") or ""
        out.reasoning += delta.get("reasoning_content") or ""
        if obj.get("usage"):
            out.output_tokens = obj["usage"]["completion_tokens"]
            out.prompt_tokens = obj["usage"]["prompt_tokens"]
    return out


def decode_anthropic(raw: bytes) -> Decoded:
    out = Decoded()
    for name, data in sse_events(raw):
        out.names.append(name or "?")
        if name == "comment":
            continue
        obj = json.loads(data)
        assert obj["type"] == name  # every Messages event names itself twice
        if name == "message_start":
            out.prompt_tokens = obj["message"]["usage"]["input_tokens"]
        elif name == "content_block_delta":
            delta = obj["delta"]
            out.text += delta.get("text", "") if delta["type"] == "text_delta" else ""
            out.reasoning += delta.get("thinking", "") if delta["type"] == "thinking_delta" else ""
        elif name == "message_delta":
            out.output_tokens = obj["usage"]["output_tokens"]
        elif name == "message_stop":
            out.ended = True
        elif name == "error":
            out.error = obj["error"]["type"]
    return out


def decode_responses(raw: bytes) -> Decoded:
    out = Decoded()
    sequence = []
    for name, data in sse_events(raw):
        out.names.append(name or "?")
        if name == "comment":
            continue
        obj = json.loads(data)
        assert obj["type"] == name
        sequence.append(obj["sequence_number"])
        if name == "response.output_text.delta":
            out.text += obj["delta"]
        elif name == "response.reasoning_text.delta":
            out.reasoning += obj["delta"]
        elif name == "response.completed":
            usage = obj["response"]["usage"]
            out.output_tokens = usage["output_tokens"]
            out.prompt_tokens = usage["input_tokens"]
            out.reasoning_tokens = usage["output_tokens_details"]["reasoning_tokens"]
            out.ended = True
        elif name == "response.failed":
            out.error = obj["response"]["error"]["message"]
    assert sequence == list(range(len(sequence)))
    return out


def decode_tgi(raw: bytes) -> Decoded:
    out = Decoded()
    for name, data in sse_events(raw):
        assert name in (None, "comment")
        if name == "comment":
            out.names.append("comment")
            continue
        obj = json.loads(data)
        if "error" in obj:
            out.error = obj["error_type"]
            out.names.append("error")
            continue
        token = obj["token"]
        out.names.append("special" if token["special"] else "token")
        out.text += "" if token["special"] else token["text"]
        if obj["generated_text"] is not None:
            assert obj["generated_text"] == out.text
            out.ended = True
            if obj["details"] is not None:
                out.output_tokens = obj["details"]["generated_tokens"]
                out.prompt_tokens = obj["details"]["input_length"]
    return out


def decode_ollama(raw: bytes) -> Decoded:
    out = Decoded()
    assert raw.endswith(b"\n")
    for line in raw.decode().splitlines():
        obj = json.loads(line)
        if "error" in obj:
            out.error = obj["error"]
            out.names.append("error")
            continue
        part = obj.get("message", obj)
        text = part.get("content", part.get("response", ""))
        out.text += text
        out.reasoning += part.get("thinking", "")
        out.names.append(
            "done" if obj["done"] else "line" if text or "thinking" in part else "empty"
        )
        if obj["done"]:
            out.ended = True
            out.output_tokens = obj["eval_count"]
            out.prompt_tokens = obj["prompt_eval_count"]
    return out


def _messages() -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPT}]


@dataclass(frozen=True)
class Dialect:
    """One API on the wire: path, a body asking for n tokens, this test's decoder."""

    api: str
    path: str
    body: Callable[[int], dict[str, Any]]
    decode: Callable[[bytes], Decoded]
    content_type: str = "text/event-stream"
    prompt_tokens: int = 4


DIALECTS = {
    "openai-chat": Dialect(
        "openai-chat",
        "/v1/chat/completions",
        lambda n: {
            "messages": _messages(),
            "max_tokens": n,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        decode_openai,
    ),
    "anthropic": Dialect(
        "anthropic",
        "/v1/messages",
        lambda n: {"messages": _messages(), "system": SYSTEM, "max_tokens": n, "stream": True},
        decode_anthropic,
        prompt_tokens=6,
    ),
    "openai-responses": Dialect(
        "openai-responses",
        "/v1/responses",
        lambda n: {"input": PROMPT, "instructions": SYSTEM, "max_output_tokens": n, "stream": True},
        decode_responses,
        prompt_tokens=6,
    ),
    "tgi": Dialect(
        "tgi",
        "/generate_stream",
        lambda n: {"inputs": PROMPT, "parameters": {"max_new_tokens": n, "details": True}},
        decode_tgi,
    ),
    "ollama-chat": Dialect(
        "ollama-chat",
        "/api/chat",
        lambda n: {"model": "m", "messages": _messages(), "options": {"num_predict": n}},
        decode_ollama,
        content_type="application/x-ndjson",
    ),
    "ollama-generate": Dialect(
        "ollama-generate",
        "/api/generate",
        lambda n: {"model": "m", "prompt": PROMPT, "system": SYSTEM, "options": {"num_predict": n}},
        decode_ollama,
        content_type="application/x-ndjson",
        prompt_tokens=6,
    ),
}
ALL = list(DIALECTS)
NEW = [name for name in ALL if name != "openai-chat"]


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sim") / "trace.jsonl"


@pytest.fixture(scope="module")
def server(trace_path: Path) -> Iterator[SimProcess]:
    with running_sim(["--speed", str(SPEED)], trace_file=trace_path) as proc:
        yield proc


@pytest.fixture
def client(server: SimProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30.0) as c:
        yield c


def stream(client: httpx.Client, dialect: Dialect, body: dict[str, Any], **headers: str) -> Decoded:
    """POST `body` to the dialect's path and decode the whole streamed answer."""
    with client.stream("POST", dialect.path, json=body, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == dialect.content_type
        assert response.headers["transfer-encoding"] == "chunked"
        return dialect.decode(response.read())


def trace_records(path: Path, *ids: str) -> dict[str, dict[str, Any]]:
    """The trace's request records by X-Request-Id, waiting (bounded) for the flush."""
    deadline = time.monotonic() + 5.0
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines if line.strip()]
        found = {r["x_request_id"]: r for r in records if r.get("x_request_id") in ids}
        if set(found) == set(ids) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def trace_steps(path: Path, start_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """The trace's engine steps that emitted tokens and were delivered in [start_ns, end_ns]
    (one request at a time: that request's steps), in order."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        line
        for line in lines
        if line["type"] == "step" and line["emitted"] and start_ns <= line["actual_ns"] <= end_ns
    ]


def with_prompt(body: dict[str, Any], words: int) -> dict[str, Any]:
    """`body` with its prompt replaced by `words` words (one token each on the simulator)."""
    text = " ".join(["w"] * words)
    if "messages" in body:
        return {**body, "messages": [{"role": "user", "content": text}]}
    key = "inputs" if "inputs" in body else "input"
    return {**body, key: text}


def prefill_real_ns(words: int) -> float:
    """Real nanoseconds the simulator prefills `words` prompt tokens in (8,000 tok/s, ÷X)."""
    return words / 8000 * 1e9 / SPEED


# -- shapes and exact counts ------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_stream_carries_exactly_the_requested_tokens(client: httpx.Client, name: str) -> None:
    """7 requested tokens: 7 words of text, usage says 7, prompt words counted, explicit end."""
    dialect = DIALECTS[name]
    got = stream(client, dialect, dialect.body(7))
    assert len(got.text.split()) == 7
    assert got.output_tokens == 7
    assert got.prompt_tokens == dialect.prompt_tokens
    assert got.reasoning == ""
    assert got.error is None
    assert got.ended


def test_anthropic_event_order(client: httpx.Client) -> None:
    """message_start, one text block (start, ping, deltas, stop), message_delta, message_stop."""
    got = stream(client, DIALECTS["anthropic"], DIALECTS["anthropic"].body(3))
    assert got.names == [
        "message_start", "content_block_start", "ping", *["content_block_delta"] * 3,
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip


def test_responses_event_order(client: httpx.Client) -> None:
    """created, in_progress, the message item around its deltas, then completed."""
    got = stream(client, DIALECTS["openai-responses"], DIALECTS["openai-responses"].body(2))
    assert got.names == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip


def test_tgi_and_ollama_send_one_event_per_token_and_no_done_marker(client: httpx.Client) -> None:
    """TGI: 5 token events, no [DONE]; Ollama: 5 lines then one done line."""
    tgi = stream(client, DIALECTS["tgi"], DIALECTS["tgi"].body(5))
    assert tgi.names == ["token"] * 5
    ollama = stream(client, DIALECTS["ollama-chat"], DIALECTS["ollama-chat"].body(5))
    assert ollama.names == ["line"] * 5 + ["done"]


def test_tgi_natural_stop_ends_with_a_special_eos_token(tmp_path: Path) -> None:
    """Without max_new_tokens the length is drawn (fixed 5); the 5th token is a special EOS."""
    with running_sim(["--speed", str(SPEED), "--output-dist", "fixed:5"]) as proc:
        response = httpx.post(
            proc.url + "/generate_stream",
            json={"inputs": PROMPT, "parameters": {"details": True}},
            timeout=30.0,
        )
    events = [json.loads(d) for _, d in sse_events(response.content)]
    got = decode_tgi(response.content)
    assert got.names == ["token"] * 4 + ["special"]
    assert events[-1]["details"]["finish_reason"] == "eos_token"
    assert got.output_tokens == 5
    assert len(got.text.split()) == 4


def test_ollama_stream_false_and_defaults_to_streaming(client: httpx.Client) -> None:
    """Ollama streams unless `stream: false`, which answers one JSON object with the counts."""
    body = {**DIALECTS["ollama-generate"].body(3), "stream": False}
    data = client.post("/api/generate", json=body).json()
    assert data["done"] is True
    assert len(data["response"].split()) == data["eval_count"] == 3


@pytest.mark.parametrize(
    ("path", "body", "tokens_key"),
    [
        ("/v1/messages", {"messages": _messages(), "max_tokens": 4}, "usage.output_tokens"),
        ("/v1/responses", {"input": PROMPT, "max_output_tokens": 4}, "usage.output_tokens"),
        ("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "details": True}},
         "details.generated_tokens"),
    ],
)  # fmt: skip
def test_non_streaming_answers_count_the_same(
    client: httpx.Client, path: str, body: dict[str, Any], tokens_key: str
) -> None:
    """A non-streamed answer is one JSON body whose token count is the requested 4."""
    data = client.post(path, json=body).json()
    outer, inner = tokens_key.split(".")
    assert data[outer][inner] == 4


# -- reasoning rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "extra", "tokens", "reasoning"),
    [
        ("anthropic", {"thinking": {"type": "enabled", "budget_tokens": 3}}, 10, 3),
        ("anthropic", {"thinking": {"type": "enabled", "budget_tokens": 100}}, 10, 5),
        ("openai-responses", {"reasoning": {"effort": "high"}}, 8, 6),
        ("openai-responses", {"reasoning": {"effort": "low"}}, 8, 2),
        ("openai-responses", {"reasoning": {}}, 8, 4),
        ("ollama-chat", {"think": True}, 9, 4),
        ("ollama-generate", {"think": "high"}, 8, 6),
    ],
)
def test_reasoning_requested_in_the_body_follows_the_rule(
    client: httpx.Client, name: str, extra: dict[str, Any], tokens: int, reasoning: int
) -> None:
    """Reasoning tokens come first, in the reasoning field, and count in the output total."""
    dialect = DIALECTS[name]
    got = stream(client, dialect, {**dialect.body(tokens), **extra})
    assert len(got.reasoning.split()) == reasoning
    assert len(got.text.split()) == tokens - reasoning
    assert got.output_tokens == tokens
    if name == "openai-responses":
        assert got.reasoning_tokens == reasoning


def test_anthropic_thinking_block_precedes_the_text_block(client: httpx.Client) -> None:
    """Thinking: block 0 (thinking deltas, a signature, stop), then block 1 with the text."""
    dialect = DIALECTS["anthropic"]
    body = {**dialect.body(4), "thinking": {"type": "enabled", "budget_tokens": 2}}
    with client.stream("POST", dialect.path, json=body) as response:
        events = [(n, json.loads(d)) for n, d in sse_events(response.read())]
    starts = [e["content_block"]["type"] for n, e in events if n == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [(e["index"], e["delta"]["type"]) for n, e in events if n == "content_block_delta"]
    assert (
        deltas == [(0, "thinking_delta")] * 2 + [(0, "signature_delta")] + [(1, "text_delta")] * 2
    )


# -- faults ---------------------------------------------------------------------------------


ERRORS = {
    "openai-chat": "simulated failure mid-stream (fault injection)",
    "anthropic": "overloaded_error",
    "openai-responses": "simulated failure mid-stream (fault injection)",
    "tgi": "generation",
    "ollama-chat": "simulated failure mid-stream (fault injection)",
    "ollama-generate": "simulated failure mid-stream (fault injection)",
}


@pytest.mark.parametrize("name", ALL)
def test_error_after_sends_the_dialects_error_event(client: httpx.Client, name: str) -> None:
    """X-Sim-Error-After: 3 streams 3 tokens, then the dialect's error event, then ends cleanly."""
    dialect = DIALECTS[name]
    got = stream(client, dialect, dialect.body(10), **{"X-Sim-Error-After": "3"})
    assert len(got.text.split()) == 3
    assert got.error == ERRORS[name]
    assert got.names[-1] in ("error", "response.failed")
    assert not got.ended


@pytest.mark.parametrize("name", NEW)
def test_status_fault_answers_with_the_dialects_error_body(client: httpx.Client, name: str) -> None:
    """X-Sim-Status: 529/503 answers at once with that status and the dialect's error JSON."""
    dialect = DIALECTS[name]
    response = client.post(dialect.path, json=dialect.body(5), headers={"X-Sim-Status": "529"})
    assert response.status_code == 529
    body = response.json()
    if name == "anthropic":
        assert (body["type"], body["error"]["type"]) == ("error", "overloaded_error")
    elif name == "openai-responses":
        assert body["error"]["code"] == 529
    elif name == "tgi":
        assert body["error_type"] == "generation"
        assert isinstance(body["error"], str)
    else:
        assert set(body) == {"error"}
        assert isinstance(body["error"], str)


@pytest.mark.parametrize("name", NEW)
def test_drop_after_cuts_the_body_and_garbage_is_undecodable(
    client: httpx.Client, name: str
) -> None:
    """Drop after 2 leaves the chunked body unterminated; garbage after 2 fails to decode."""
    dialect = DIALECTS[name]
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream(
            "POST", dialect.path, json=dialect.body(10), headers={"X-Sim-Drop-After": "2"}
        ) as response,
    ):
        response.read()
    with client.stream(
        "POST", dialect.path, json=dialect.body(10), headers={"X-Sim-Garbage-After": "2"}
    ) as response:
        raw = response.read()
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):
        dialect.decode(raw)


OPENING = {
    "openai-chat": "role",
    "anthropic": "message_start",
    "openai-responses": "response.created",
    "ollama-chat": "empty",
}


@pytest.mark.parametrize("name", list(OPENING))
def test_early_opening_event_is_written_before_the_first_token(
    client: httpx.Client, trace_path: Path, name: str
) -> None:
    """Role early: the opening event goes out once, first, before queueing (server's own clock)."""
    # A 4,000-word prompt is 500 ms of prefill (10 ms real at X = 50). The server's trace
    # must show the first token no earlier than arrival + prefill (the engine never ends a
    # step early: exact) and the opening written before the server even woke to deliver
    # the prefill's step (its `actual_ns`): an early opening goes out in the callback that
    # queues the request, so it precedes that wake-up by construction, however long the
    # machine stalls the server; one written with the first token would come after it.
    # (Comparing the opening with the prefill's length instead fails when the server is
    # descheduled between queueing and writing: seen, 100 ms, on a loaded machine.)
    dialect = DIALECTS[name]
    words = 4000
    rid = f"early-{name}"
    body = with_prompt(dialect.body(3), words)
    got = stream(client, dialect, body, **{"X-Sim-Role": "early", "X-Request-Id": rid})
    assert got.names[0] == OPENING[name]
    assert got.names.count(OPENING[name]) == 1
    assert len(got.text.split()) == 3
    record = trace_records(trace_path, rid)[rid]
    assert record["opening_ns"] is not None
    received, opening, first = record["received_ns"], record["opening_ns"], record["first_token_ns"]
    prefill_step = trace_steps(trace_path, received, record["done_ns"])[0]
    assert prefill_step["prefill_tokens"] == record["prompt_tokens"] >= words
    woke = prefill_step["actual_ns"]
    measured = (f"after arrival: opening {(opening - received) / 1e6:.3f} ms, woke for the "
                f"prefill's end {(woke - received) / 1e6:.3f} ms, first token "
                f"{(first - received) / 1e6:.3f} ms; prefill {prefill_real_ns(words) / 1e6:g} ms")  # fmt: skip
    assert first - received >= prefill_real_ns(words) - 1_000, measured  # 1 µs: ns rounding
    assert opening < woke <= first, measured


@pytest.mark.parametrize("name", ["anthropic", "openai-responses", "tgi", "openai-chat"])
def test_heartbeats_are_the_dialects_keepalive(
    client: httpx.Client, trace_path: Path, name: str
) -> None:
    """X-Sim-Heartbeat-S: Anthropic `ping` events, SSE comments elsewhere, counted in the trace."""
    # A 4,000-word prompt: 0.5 s of prefill before the first token, a heartbeat due every
    # 0.1 s. The first heartbeat's timer (0.1 s after the stream opens) is due before the
    # prefill step's (0.5 s after arrival), and the event loop runs due timers in deadline
    # order, so at least one heartbeat goes out before the first token however late the
    # loop wakes (a starved server delivers the tokens in one catch-up, with no beat
    # between them: counting on beats during decoding would be a race).
    dialect = DIALECTS[name]
    rid = f"beat-{name}"
    headers = {"X-Sim-Heartbeat-S": "0.1", "X-Request-Id": rid}
    got = stream(client, dialect, with_prompt(dialect.body(40), 4000), **headers)
    beats = trace_records(trace_path, rid)[rid]["heartbeats"]
    assert beats >= 1
    kind = "ping" if name == "anthropic" else "comment"
    assert got.names.count(kind) == beats + (1 if name == "anthropic" else 0)
    assert len(got.text.split()) == 40


def test_ollama_has_no_heartbeat(client: httpx.Client, trace_path: Path) -> None:
    """NDJSON has no comments: a heartbeat setting writes nothing extra (during the same
    0.5 s prefill that gives the other dialects their heartbeats)."""
    dialect = DIALECTS["ollama-chat"]
    headers = {"X-Sim-Heartbeat-S": "0.1", "X-Request-Id": "beat-ollama"}
    got = stream(client, dialect, with_prompt(dialect.body(40), 4000), **headers)
    assert got.names == ["line"] * 40 + ["done"]
    assert trace_records(trace_path, "beat-ollama")["beat-ollama"]["heartbeats"] == 0


@pytest.mark.parametrize("name", NEW)
def test_close_after_stream_closes_in_every_dialect(client: httpx.Client, name: str) -> None:
    """X-Sim-Close-After-Stream answers `connection: close` whatever the dialect."""
    dialect = DIALECTS[name]
    headers = {"X-Sim-Close-After-Stream": "1"}
    with client.stream("POST", dialect.path, json=dialect.body(2), headers=headers) as response:
        response.read()
        assert response.headers["connection"] == "close"


# -- the trace ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_trace_records_every_chunk_write(client: httpx.Client, trace_path: Path, name: str) -> None:
    """8 tokens, 3 per chunk: 3 writes stamped (3+3+2), 8 tokens, the api named, outcome ok."""
    dialect = DIALECTS[name]
    rid = f"trace-{name}"
    headers = {"X-Sim-Tokens-Per-Chunk": "3", "X-Request-Id": rid}
    got = stream(client, dialect, dialect.body(8), **headers)
    assert len(got.text.split()) == 8
    record = trace_records(trace_path, rid)[rid]
    assert record["api"] == name
    assert record["outcome"] == "ok"
    assert (record["output_tokens"], len(record["chunk_ns"])) == (8, 3)
    assert record["received_ns"] < record["first_token_ns"] <= record["chunk_ns"][0]


def test_ollama_durations_are_the_servers_own_times(client: httpx.Client, trace_path: Path) -> None:
    """Ollama's durations add up and match the trace: eval spans the chunk writes, and at
    least the engine's 19 decode steps from the first token's write to the last's due time."""
    dialect = DIALECTS["ollama-chat"]
    with client.stream(
        "POST", dialect.path, json=dialect.body(20), headers={"X-Request-Id": "durations"}
    ) as response:
        final = json.loads(response.read().decode().splitlines()[-1])
    record = trace_records(trace_path, "durations")["durations"]
    chunks = record["chunk_ns"]
    assert final["eval_duration"] >= chunks[-1] - chunks[0]
    assert final["total_duration"] <= record["done_ns"] - record["received_ns"]
    parts = final["load_duration"] + final["prompt_eval_duration"] + final["eval_duration"]
    assert parts == final["total_duration"]
    # The engine's steps (the trace's `step` lines): the first token's, then 19 of 20 ms
    # simulated each, due back to back. The last token is written no earlier than its
    # step's due time; the first may be written late (a starved server catches up), which
    # shortens eval by exactly that lateness, measured here, and by nothing else.
    steps = trace_steps(trace_path, record["received_ns"], record["done_ns"])
    assert len(steps) == 20, steps
    due = [step["intended_ns"] for step in steps]
    assert due[-1] - due[0] == pytest.approx(19 * 20e6 / SPEED, abs=20)  # ns rounding
    late_first = record["first_token_ns"] - due[0]
    measured = f"eval {final['eval_duration']} ns, first token written {late_first} ns late"
    assert final["eval_duration"] >= due[-1] - record["first_token_ns"], measured


# -- --api ----------------------------------------------------------------------------------


def test_api_flag_serves_one_dialect_on_its_path_and_root() -> None:
    """`--api anthropic` answers /v1/messages and /, and 404s OpenAI's path naming what it serves."""
    with (
        running_sim(["--speed", str(SPEED), "--api", "anthropic"]) as proc,
        httpx.Client(base_url=proc.url, timeout=30.0) as c,
    ):
        for path in ("/", "/v1/messages"):
            with c.stream("POST", path, json=DIALECTS["anthropic"].body(3)) as response:
                assert decode_anthropic(response.read()).output_tokens == 3
        missing = c.post("/v1/chat/completions", json=DIALECTS["openai-chat"].body(3))
        assert missing.status_code == 404
        assert "/v1/messages" in missing.json()["error"]["message"]


def test_bad_bodies_get_400_in_the_dialects_shape(client: httpx.Client) -> None:
    """A Messages body without max_tokens, or a TGI body without inputs, is a 400."""
    missing_max = client.post("/v1/messages", json={"messages": _messages()})
    assert missing_max.status_code == 400
    assert missing_max.json()["error"]["type"] == "invalid_request_error"
    no_inputs = client.post("/generate_stream", json={"parameters": {}})
    assert no_inputs.status_code == 400
    assert no_inputs.json()["error_type"] == "validation"


# -- end to end: loadgen's engine and each adapter against the simulator --------------------
#
# One simulator per API at X = 2 with a 100 ms (sim) decode step: 50 ms real between two
# tokens of a request, 125 ms real of prefill for a 2,000-word prompt. Three requests each:
# a plain one with the opening event sent early plus heartbeats (TTFT must not stop at
# either), one whose first 5 tokens are reasoning, one failing with the dialect's error
# event after 3 tokens. TTFT is checked against the simulator's own trace by causality:
# the client sent before the server stamped `received_ns` and read each chunk after the
# server wrote it, so the client's interval is never shorter, and its first chunk is the
# server's first write (as many chunks read as written). How late the client read is the
# machine's, not bounded (see `assert_ttft_is_the_first_token_write`): no clock tolerance.

E2E_SPEED = 2.0
E2E_STEP_MS = 100.0
E2E_PROMPT = 2000
E2E_TOKENS = 20
E2E_APIS = ["anthropic", "openai-responses", "tgi", "ollama-chat", "ollama-generate"]
E2E_HEADERS = [
    {"X-Sim-Role": "early", "X-Sim-Heartbeat-S": "0.02"},
    {"X-Sim-Reasoning-Tokens": "5"},
    {"X-Sim-Error-After": "3"},
]


@dataclass
class E2eRun:
    """The client's records and the simulator's trace of one API's run."""

    plans: list[Any]
    records: list[Any]
    trace: dict[str, dict[str, Any]]
    t0_ns: int  # the run's t0 on the simulator's clock (both CLOCK_MONOTONIC)


def _adapters() -> tuple[str, ...]:
    from loadgen.adapters import APIS

    return APIS


def run_against_sim(
    api: str, trace_file: Path, *, generic: Any = None, path: str | None = None
) -> E2eRun:
    """Send the three e2e plans through the real engine with `api`'s adapter."""
    from loadgen.testing import PlanFactory, run_engine

    headers = E2E_HEADERS
    plans = PlanFactory(prompt_tokens=E2E_PROMPT, output_tokens=E2E_TOKENS).at(
        *[0.3 * i for i in range(len(headers))]
    )
    args = ["--speed", str(E2E_SPEED), "--decode-table", str(E2E_STEP_MS)]
    with running_sim(args, trace_file=trace_file) as sim:
        t0_ns = time.perf_counter_ns() + 50_000_000
        records = run_engine(
            plans,
            sim.url,
            api=api,
            generic=generic,
            path=path,
            headers_for=lambda p: headers[p.request_id],
            t0_ns=t0_ns,
        )
    lines = [json.loads(line) for line in trace_file.read_text().splitlines()]
    trace = {r["x_request_id"]: r for r in lines if r["type"] == "request"}
    return E2eRun(plans=plans, records=records, trace=trace, t0_ns=t0_ns)


@pytest.fixture(scope="module", params=E2E_APIS)
def e2e(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> E2eRun:
    """One API's run against its own simulator."""
    api = request.param
    if api not in _adapters():
        pytest.skip(f"no client adapter for {api} yet")
    return run_against_sim(api, tmp_path_factory.mktemp(api) / "trace.jsonl")


def _server(run: E2eRun, request_id: int) -> dict[str, Any]:
    sent = next(r.request_id_sent for r in run.records if r.request_id == request_id)
    return run.trace[str(sent)]


def assert_ttft_is_the_first_token_write(record: Any, server: dict[str, Any], t0_ns: int) -> None:
    """Client TTFT from send is the server's received → first-token-write interval, by
    causality: the client reads no chunk before the server began writing it (the first
    token is stamped before its write, later chunks after theirs), it reads as many chunks
    as the server wrote (an ok stream), and TTFT is its first.

    No upper bound on how late the client read: on a loaded machine the client alone can be
    starved (seen: the first token read 94 ms after its write while the server, also late,
    wrote the second 41 µs after the first), so a bound from the server's write gaps would
    judge the machine. A TTFT stopped at an opening event or a heartbeat is caught by the
    lower bound (those are written before the first token); one stopped at a later chunk,
    by the chunk count and the first chunk's causality."""
    server_ns = server["first_token_ns"] - server["received_ns"]
    client_ns = record.first_token_ns - record.sent_ns
    read_late_ns = server["received_ns"] - (t0_ns + record.sent_ns)
    written = server["chunk_ns"]
    read = [t0_ns + c for c in record.chunk_ns]
    measured = (f"client TTFT {client_ns / 1e6:.3f} ms, server {server_ns / 1e6:.3f} ms, request "
                f"read {read_late_ns / 1e6:.3f} ms after sending; chunks written {len(written)}, "
                f"read {len(read)}")  # fmt: skip
    assert server_ns <= client_ns, measured
    assert record.first_token_ns == record.chunk_ns[0], measured
    assert len(read) == len(written) or server["outcome"] != "ok", measured
    # The server stamps a chunk right after its write, so chunk k (k >= 1) can only be read
    # after chunk k - 1's stamp (its write began then): none is read before it was written.
    early = [r - w for r, w in zip(read[1:], written, strict=False) if r < w]
    assert not early, f"{measured}; chunks read before their write began (ns): {early}"


def test_e2e_planned_equals_recorded_and_outcomes(e2e: E2eRun) -> None:
    """Every plan has one record: two ok with N = 20 from the server's count, one stream_error."""
    from loadgen.results.records import Outcome, TokenSource

    assert [r.request_id for r in e2e.records] == [p.request_id for p in e2e.plans]
    outcomes = [r.outcome for r in e2e.records]
    assert outcomes == [Outcome.OK, Outcome.OK, Outcome.STREAM_ERROR], [
        r.error for r in e2e.records
    ]
    for record in e2e.records[:2]:
        assert (record.output_tokens, record.token_source) == (E2E_TOKENS, TokenSource.USAGE)
        assert record.prompt_tokens == _server(e2e, record.request_id)["prompt_tokens"]


def test_e2e_chunks_match_the_servers_writes(e2e: E2eRun) -> None:
    """The client saw as many output-bearing chunks as the server wrote, 20 for 20 tokens."""
    for record in e2e.records[:2]:
        server = _server(e2e, record.request_id)
        assert server["outcome"] == "ok"
        assert len(server["chunk_ns"]) == E2E_TOKENS
        assert len(record.chunk_ns) == E2E_TOKENS


def test_e2e_ttft_is_not_fooled_by_the_early_opening_event_or_heartbeats(e2e: E2eRun) -> None:
    """Opening event at accept and heartbeats: TTFT still lands on the first token write."""
    record, server = e2e.records[0], _server(e2e, 0)
    assert server["first_token_ns"] - server["received_ns"] >= E2E_PROMPT / 8000 * 1e9 / E2E_SPEED
    if server["opening_ns"] is not None:  # TGI has no opening event
        assert server["opening_ns"] < server["first_token_ns"]
    assert_ttft_is_the_first_token_write(record, server, e2e.t0_ns)


def test_e2e_reasoning_is_the_first_generated_token(e2e: E2eRun) -> None:
    """5 reasoning tokens: TTFT at the first (reasoning) write, first visible token 5 writes on."""
    record, server = e2e.records[1], _server(e2e, 1)
    assert_ttft_is_the_first_token_write(record, server, e2e.t0_ns)
    if e2e.records[1].first_reasoning_ns is None:  # TGI has no reasoning field: all text
        assert record.first_content_ns == record.first_token_ns
        return
    assert record.first_reasoning_ns == record.first_token_ns
    assert record.first_content_ns == record.chunk_ns[5]


def test_e2e_mid_stream_error_event_is_a_stream_error_with_partial_output(e2e: E2eRun) -> None:
    """The dialect's error event after 3 tokens: stream_error, the 3 tokens kept."""
    record, server = e2e.records[2], _server(e2e, 2)
    assert server["outcome"] == "error_event"
    assert len(record.chunk_ns) == len(server["chunk_ns"]) == 3
    assert record.error is not None


def test_e2e_ollama_server_timings_are_kept(e2e: E2eRun) -> None:
    """Ollama's own durations reach the record; its decode time spans the 19 later steps."""
    record = e2e.records[0]
    if _server(e2e, 0)["api"] not in ("ollama-chat", "ollama-generate"):
        assert record.server_timings is None
        return
    timings = record.server_timings
    assert timings is not None
    assert timings.decode_ms is not None
    chunks = _server(e2e, 0)["chunk_ns"]
    assert timings.decode_ms >= (chunks[-1] - chunks[0]) / 1e6 - 0.001


@pytest.mark.slow  # ~2 s on 2 cores: left to .ci/run's second part
def test_e2e_generic_adapter_decodes_ollama_ndjson(tmp_path: Path) -> None:
    """A `generic` target describing Ollama's NDJSON gets the same counts as the Ollama adapter."""
    if "generic" not in _adapters():
        pytest.skip("no generic client adapter yet")
    from loadgen.adapters.generic import generic_spec
    from loadgen.results.records import Outcome, TokenSource

    spec = generic_spec(
        {
            "framing": "ndjson",
            "body": {
                "model": "$model",
                "messages": "$messages",
                "options": {"num_predict": "$max_tokens"},
            },
            "content": "message.content",
            "reasoning": "message.thinking",
            "done": {"path": "done", "equals": True},
            "output_tokens": "eval_count",
            "prompt_tokens": "prompt_eval_count",
            "error": "error",
        },
        "test",
    )
    run = run_against_sim("generic", tmp_path / "trace.jsonl", generic=spec, path="/api/chat")
    assert [r.outcome for r in run.records] == [Outcome.OK, Outcome.OK, Outcome.STREAM_ERROR]
    for record in run.records[:2]:
        assert (record.output_tokens, record.token_source) == (E2E_TOKENS, TokenSource.USAGE)
        assert_ttft_is_the_first_token_write(record, _server(run, record.request_id), run.t0_ns)
    assert len(run.records[2].chunk_ns) == 3


# -- the Responses events against the spec's types --------------------------------------------
# Required fields, from the OpenAI spec (openapi `Response` and the stream event schemas),
# checked here when the openai SDK is not installed; with it, its own types judge instead.
RESPONSE_REQUIRED = (
    "id", "object", "created_at", "error", "incomplete_details", "instructions", "model",
    "tools", "output", "parallel_tool_calls", "metadata", "tool_choice", "temperature", "top_p",
)  # fmt: skip
_WHERE = ("item_id", "output_index", "content_index")
EVENT_REQUIRED = {
    **dict.fromkeys(("response.created", "response.in_progress", "response.completed",
                     "response.incomplete", "response.failed"), ("response",)),
    **dict.fromkeys(("response.output_item.added", "response.output_item.done"),
                    ("output_index", "item")),
    **dict.fromkeys(("response.content_part.added", "response.content_part.done"),
                    (*_WHERE, "part")),
    "response.output_text.delta": (*_WHERE, "delta", "logprobs"),
    "response.output_text.done": (*_WHERE, "text", "logprobs"),
    "response.reasoning_text.delta": (*_WHERE, "delta"),
    "response.reasoning_text.done": (*_WHERE, "text"),
}  # fmt: skip
ITEM_REQUIRED = {"message": ("id", "type", "role", "content", "status"),
                 "reasoning": ("id", "type", "summary")}  # fmt: skip


def _missing(obj: dict[str, Any], required: tuple[str, ...], where: str) -> list[str]:
    return [f"{where}.{key}" for key in required if key not in obj]


def spec_problems(event: dict[str, Any]) -> list[str]:
    """What the checked-in required lists find missing from one Responses event."""
    kind = event["type"]
    problems = _missing(event, ("type", "sequence_number", *EVENT_REQUIRED[kind]), kind)
    if "response" in event:
        problems += _missing(event["response"], RESPONSE_REQUIRED, f"{kind}.response")
        for item in event["response"]["output"]:
            problems += _missing(item, ITEM_REQUIRED[item["type"]], f"{kind}.output")
    if "item" in event:
        problems += _missing(event["item"], ITEM_REQUIRED[event["item"]["type"]], f"{kind}.item")
    return problems


def sdk_problems(event: dict[str, Any]) -> list[str]:
    """What the openai SDK's own type for this event rejects in it ([] without the SDK)."""
    try:
        from openai.types.responses import ResponseStreamEvent
        from pydantic import ValidationError
    except ImportError:
        return []
    union = typing.get_args(ResponseStreamEvent)[0]  # Annotated[Union[...], discriminator]
    types = {typing.get_args(t.model_fields["type"].annotation)[0]: t
             for t in typing.get_args(union)}  # fmt: skip
    model = types.get(event["type"])
    if model is None:
        return [f"{event['type']}: no such event in the openai SDK"]
    try:
        model.model_validate(event)
    except ValidationError as exc:
        return [f"{event['type']}: {exc}"]
    return []


@pytest.mark.parametrize("end", ["", "incomplete", "incomplete-event", "cancelled", "failed"])
@pytest.mark.parametrize("reasoning", [False, True])
def test_responses_events_carry_every_field_the_spec_requires(
    client: httpx.Client, end: str, reasoning: bool
) -> None:
    """Every event of a Responses stream (each end kind, with and without a reasoning item)
    has the spec's required fields (parallel_tool_calls, tool_choice, tools, ...), by the
    openai SDK's types where it is installed and by the spec's lists always."""
    dialect = DIALECTS["openai-responses"]
    body = dialect.body(4)
    if reasoning:
        body["reasoning"] = {"effort": "medium"}
    with client.stream("POST", dialect.path, json=body, headers={"X-Sim-Finish": end}) as reply:
        raw = reply.read()
    events = [json.loads(data) for name, data in sse_events(raw) if name != "comment"]
    assert {e["type"] for e in events} >= {"response.created", "response.in_progress"}
    assert any(e["type"] == "response.reasoning_text.delta" for e in events) is reasoning
    problems = [p for e in events for p in spec_problems(e) + sdk_problems(e)]
    assert problems == []


def test_the_spec_check_can_fail() -> None:
    """A response.created without parallel_tool_calls, tool_choice and tools (the shape the
    simulator sent before) is caught by the checked-in lists, and by the SDK when present."""
    response = {"id": "r", "object": "response", "created_at": 1, "status": "in_progress",
                "model": "m", "output": [], "usage": None}  # fmt: skip
    event = {"type": "response.created", "sequence_number": 0, "response": response}
    problems = spec_problems(event)
    assert "response.created.response.parallel_tool_calls" in problems
    assert "response.created.response.tools" in problems
    try:
        import openai  # noqa: F401  # only to know whether the SDK can judge too
    except ImportError:
        return
    assert sdk_problems(event) != []
