"""The simulator on the wire: OpenAI shapes, fault headers, keep-alive and its trace.

Every server here runs at a high --speed; assertions are about order, shape and counts,
or about timing relative to the server's own trace with tolerances from the physics.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from loadgen.errors import ConfigError
from loadgen.run.processes.simulator import SimProcess, running_sim, sim_args_from_mapping
from loadgen.sim import cli as sim_cli
from loadgen.sim.cli import build_config, sim
from loadgen.sim.config import SimConfig

SPEED = 50.0
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


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


def _chat(tokens: int = 5, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "one two three four"}],
        "stream": True,
        "max_tokens": tokens,
        "ignore_eos": True,
        **extra,
    }


def _events(
    client: httpx.Client, body: dict[str, Any], path: str = CHAT, **headers: str
) -> list[str]:
    """The SSE lines of one streamed response (data payloads and comments), in order."""
    with client.stream("POST", path, json=body, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        return [line for line in response.iter_lines() if line]


def _data(lines: list[str]) -> list[Any]:
    return [
        json.loads(line[6:])
        for line in lines
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def _content(chunks: list[Any]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if c["choices"] and "delta" in c["choices"][0]
    )


def _read_trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_chat_stream_has_openai_shape(client: httpx.Client) -> None:
    """Role chunk, one chunk per token, finish chunk, usage chunk, then [DONE]."""
    lines = _events(client, _chat(5, stream_options={"include_usage": True}))
    assert lines[-1] == "data: [DONE]"
    chunks = _data(lines)
    assert all(
        c["object"] == "chat.completion.chunk" and c["model"] == "loadgen-sim" for c in chunks
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content = chunks[1:6]
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in content)
    assert chunks[6]["choices"][0]["finish_reason"] == "length"
    assert chunks[7]["choices"] == []
    assert chunks[7]["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    assert len(_content(chunks).split()) == 5
    assert len({c["id"] for c in chunks}) == 1


def test_completions_stream_has_text_chunks(client: httpx.Client) -> None:
    """The text-completions stream carries choices[0].text and object text_completion."""
    body = {"prompt": "a b c", "stream": True, "max_tokens": 3, "ignore_eos": True}
    chunks = _data(_events(client, body, COMPLETIONS))
    assert all(c["object"] == "text_completion" for c in chunks)
    texts = [c["choices"][0]["text"] for c in chunks]
    assert len("".join(texts).split()) == 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("path", "key"), [(CHAT, "message"), (COMPLETIONS, "text")])
def test_non_streaming_response(client: httpx.Client, path: str, key: str) -> None:
    """Non-streaming answers are one JSON body whose text has completion_tokens words."""
    body: dict[str, Any] = {"max_tokens": 4, "ignore_eos": True}
    body.update({"messages": [{"role": "user", "content": "hi there"}]} if path == CHAT else {})
    body.update({"prompt": "hi there"} if path == COMPLETIONS else {})
    data = client.post(path, json=body).json()
    choice = data["choices"][0]
    text = choice["message"]["content"] if key == "message" else choice["text"]
    assert len(text.split()) == data["usage"]["completion_tokens"] == 4
    assert data["usage"]["prompt_tokens"] == 2


def test_output_length_without_ignore_eos_is_capped_by_max_tokens(client: httpx.Client) -> None:
    """The default output distribution (fixed 300) is capped by max_tokens with 'length'."""
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 7}
    data = client.post(CHAT, json=body).json()
    assert data["usage"]["completion_tokens"] == 7
    assert data["choices"][0]["finish_reason"] == "length"


def test_models_and_health(client: httpx.Client) -> None:
    """/v1/models lists the model; /health answers 200."""
    assert client.get("/v1/models").json()["data"][0]["id"] == "loadgen-sim"
    assert client.get("/health").status_code == 200


def test_unknown_path_and_bad_json(client: httpx.Client) -> None:
    """Unknown paths get 404, bad JSON gets 400, both with an OpenAI-style error body."""
    missing = client.get("/v2/nothing")
    assert missing.status_code == 404
    assert "message" in missing.json()["error"]
    bad = client.post(CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"


def test_drop_after_closes_mid_stream(client: httpx.Client) -> None:
    """X-Sim-Drop-After: k closes the connection after k content tokens, body unterminated."""
    received: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", CHAT, json=_chat(10), headers={"X-Sim-Drop-After": "3"}) as r,
    ):
        received.extend(line for line in r.iter_lines() if line)
    assert len(_content(_data(received)).split()) == 3


def test_drop_after_zero_closes_after_headers(client: httpx.Client) -> None:
    """X-Sim-Drop-After: 0 sends headers, then closes before any token."""
    with client.stream("POST", CHAT, json=_chat(10), headers={"X-Sim-Drop-After": "0"}) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):
            r.read()


@pytest.mark.parametrize("status", [500, 503, 429, 400])
def test_status_header_answers_at_once(client: httpx.Client, status: int) -> None:
    """X-Sim-Status answers that status with an error JSON body instead of streaming."""
    response = client.post(CHAT, json=_chat(5), headers={"X-Sim-Status": str(status)})
    assert response.status_code == status
    assert response.json()["error"]["code"] == status


def test_garbage_after_sends_non_json(client: httpx.Client) -> None:
    """X-Sim-Garbage-After: k sends k tokens, then undecodable bytes, then ends without [DONE]."""
    with client.stream("POST", CHAT, json=_chat(10), headers={"X-Sim-Garbage-After": "2"}) as r:
        raw = r.read()
    assert b"data: {not json" in raw
    assert b"[DONE]" not in raw
    assert raw.count(b'"content":" ') == 2


def test_no_done_usage_in_finish_role_none(client: httpx.Client) -> None:
    """Dialect headers: no [DONE], usage inside the finish chunk, no role chunk."""
    headers = {"X-Sim-No-Done": "1", "X-Sim-Usage-In-Finish": "1", "X-Sim-Role": "none"}
    lines = _events(client, _chat(3), **headers)
    assert "data: [DONE]" not in lines
    chunks = _data(lines)
    assert all("role" not in (c["choices"][0]["delta"] if c["choices"] else {}) for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_tokens_per_chunk_and_reasoning(client: httpx.Client) -> None:
    """Coalesced deltas and reasoning_content still add up to usage's token count."""
    headers = {"X-Sim-Tokens-Per-Chunk": "3", "X-Sim-Reasoning-Tokens": "2"}
    chunks = _data(_events(client, _chat(8, stream_options={"include_usage": True}), **headers))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert len(reasoning.split()) == 2
    assert len(content.split()) == 6
    assert sum(1 for d in deltas if d.get("content")) == 2  # tokens 3-5 and 6-8
    assert chunks[-1]["usage"]["completion_tokens"] == 8


def test_role_early_comes_before_queueing(client: httpx.Client) -> None:
    """X-Sim-Role: early sends the role chunk first, right after the headers."""
    chunks = _data(_events(client, _chat(2), **{"X-Sim-Role": "early"}))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]) == 1


def test_heartbeat_sends_ping_comments(client: httpx.Client) -> None:
    """X-Sim-Heartbeat-S sends ': ping' comments while the request streams."""
    lines = _events(client, _chat(40), **{"X-Sim-Heartbeat-S": "0.1"})
    assert ": ping" in lines
    assert lines[-1] == "data: [DONE]"


def _client_port(response: httpx.Response) -> int:
    stream = response.extensions["network_stream"]
    return int(stream.get_extra_info("client_addr")[1])


def test_keep_alive_reuses_the_connection(client: httpx.Client) -> None:
    """Two streamed requests on one client travel over the same TCP connection."""
    ports = []
    for _ in range(2):
        with client.stream("POST", CHAT, json=_chat(2)) as response:
            ports.append(_client_port(response))
            response.read()
    assert ports[0] == ports[1]


def test_close_after_stream_header_closes(client: httpx.Client) -> None:
    """X-Sim-Close-After-Stream closes the connection, so the next request needs a new one."""
    ports = []
    for _ in range(2):
        headers = {"X-Sim-Close-After-Stream": "1"}
        with client.stream("POST", CHAT, json=_chat(2), headers=headers) as response:
            assert response.headers["connection"] == "close"
            ports.append(_client_port(response))
            response.read()
    assert ports[0] != ports[1]


def test_stall_and_header_delay_show_in_the_trace(
    client: httpx.Client, trace_path: Path, server: SimProcess
) -> None:
    """A 5 s stall after token 2 and a 0.5 s header delay appear in the server's own times.

    The trace stamps each chunk when it was written, and the sim writes a token at its
    due time or later, never before. So the stalled token comes at least the stall after
    the request arrived. The gap before it can be shorter than the stall: token 2 written
    late on a busy machine (15 ms of a 20 ms stall, seen under two busy loops) still leaves
    token 3 due on time. The stall is long (100 ms at SPEED) so that no scheduling hiccup
    in the sub-millisecond decode gaps around it outgrows it."""
    stall = client.post(
        CHAT,
        json={**_chat(4), "stream": True},
        headers={"X-Sim-Stall": "2:5", "X-Request-Id": "st"},
    )
    delay = client.post(
        CHAT, json=_chat(2), headers={"X-Sim-Header-Delay-S": "0.5", "X-Request-Id": "hd"}
    )
    assert stall.status_code == delay.status_code == 200
    records = {
        r["x_request_id"]: r for r in _trace_after_flush(trace_path) if r.get("x_request_id")
    }
    stall_chunks = records["st"]["chunk_ns"]
    gaps = [b - a for a, b in itertools.pairwise(stall_chunks)]
    assert gaps.index(max(gaps)) == 1  # the stall sits between tokens 2 and 3
    assert stall_chunks[2] - records["st"]["received_ns"] >= 5e9 / SPEED
    hd = records["hd"]
    assert hd["first_token_ns"] - hd["received_ns"] >= 0.5e9 / SPEED
    assert hd["fault"]["header_delay"] == {"value": 0.5, "by": "header"}


def _trace_after_flush(path: Path) -> list[dict[str, Any]]:
    """Trace records, waiting (bounded) for the server's periodic flush."""
    import time

    deadline = time.monotonic() + 5.0
    while True:
        records = [r for r in _read_trace(path) if r["type"] == "request"] if path.exists() else []
        ids = {r.get("x_request_id") for r in records}
        if {"st", "hd"} <= ids or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def test_queue_cap_answers_429_at_once() -> None:
    """Beyond --queue-cap waiting requests the server answers 429 immediately."""
    args = ["--speed", str(SPEED), "--max-batch", "1", "--queue-cap", "1"]
    with (
        running_sim(args) as proc,
        httpx.Client(base_url=proc.url, timeout=30.0) as c1,
        httpx.Client(base_url=proc.url, timeout=30.0) as c2,
        c1.stream("POST", CHAT, json=_chat(100_000)) as running,
    ):
        assert running.status_code == 200
        with c2.stream("POST", CHAT, json=_chat(5)) as waiting:
            assert waiting.status_code == 200
            refused = httpx.post(proc.url + CHAT, json=_chat(5), timeout=30.0)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == 429


def test_global_fault_and_close_after_stream_flags() -> None:
    """--fault status=1 fails every request; --close-after-stream closes every connection."""
    args = ["--speed", str(SPEED), "--fault", "status=1", "--fault-status", "500"]
    with running_sim(args) as proc:
        assert httpx.post(proc.url + CHAT, json=_chat(2)).status_code == 500
    with (
        running_sim(["--speed", str(SPEED), "--close-after-stream"]) as proc,
        httpx.Client(base_url=proc.url) as c,
        c.stream("POST", CHAT, json=_chat(2)) as r,
    ):
        r.read()
        assert r.headers["connection"] == "close"


def test_trace_has_one_line_per_request_and_sigterm_flushes(tmp_path: Path) -> None:
    """After SIGTERM the trace holds every request, chunk count == tokens, the open one cut."""
    trace = tmp_path / "t.jsonl"
    client = httpx.Client(timeout=30.0)
    try:
        with running_sim(["--speed", str(SPEED)], trace_file=trace) as proc:
            for i in range(3):
                _events(client, _chat(6), proc.url + CHAT, **{"X-Request-Id": f"r{i}"})
            request = client.build_request(
                "POST", proc.url + CHAT, json=_chat(100_000), headers={"X-Request-Id": "open"}
            )
            response = client.send(request, stream=True)
            lines = response.iter_lines()  # kept referenced: a dropped iterator closes it
            next(lines)
            # leaving running_sim sends SIGTERM while "open" is mid-stream
    finally:
        client.close()
    records = _read_trace(trace)
    requests = {r["x_request_id"]: r for r in records if r["type"] == "request"}
    assert set(requests) == {"r0", "r1", "r2", "open"}
    for i in range(3):
        record = requests[f"r{i}"]
        assert record["output_tokens"] == len(record["chunk_ns"]) == 6
        assert record["chunk_ns"] == sorted(record["chunk_ns"])
        assert record["received_ns"] < record["first_token_ns"] <= record["chunk_ns"][0]
    assert requests["open"]["outcome"] == "shutdown"
    steps = [r for r in records if r["type"] == "step"]
    assert steps
    assert all(s["actual_ns"] >= s["intended_ns"] for s in steps)


def test_concurrent_streams_are_batched(tmp_path: Path) -> None:
    """Eight concurrent streams share decode steps (the trace shows batch 8)."""
    trace = tmp_path / "t.jsonl"
    with running_sim(["--speed", str(SPEED)], trace_file=trace) as proc:
        gate = threading.Barrier(8)

        def one() -> None:
            with httpx.Client(base_url=proc.url, timeout=30.0) as c:
                gate.wait()
                _events(c, _chat(1000))

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    steps = [r for r in _read_trace(trace) if r["type"] == "step"]
    assert max(s["batch"] for s in steps) == 8


def test_raw_pipelined_requests_are_answered_in_order(server: SimProcess) -> None:
    """Two requests written back to back on one socket get two responses, in order."""
    host, port = server.url.removeprefix("http://").split(":")
    request = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"loadgen-sim" not in data.split(b"\r\n\r\n", 2)[-1]:
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 2
    assert data.index(b'{"status":"ok"}') < data.index(b'"object":"list"')


def test_cli_help_has_example_and_bad_config_exits_1(tmp_path: Path) -> None:
    """`loadgen sim --help` shows an Example; a bad config key exits 1 naming the key."""
    runner = CliRunner()
    assert "Example:" in runner.invoke(sim, ["--help"]).output
    config = tmp_path / "sim.yaml"
    config.write_text("max_batch: 0\n")
    result = runner.invoke(sim, ["--config", str(config)])
    assert result.exit_code == 1
    assert "max_batch" in result.output
    assert "--decode-table" in runner.invoke(sim, ["--help"]).output


def test_the_decode_table_s_old_name_still_works_and_says_its_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sim --decode-step-ms` (a table, where `plan --decode-step-ms` is one number) is now
    `--decode-table`; the old flag and the old `decode_step_ms` key still give the same
    table, hidden from --help, each saying its new name; both names at once is an error."""
    runner = CliRunner()
    assert "--decode-step-ms" not in runner.invoke(sim, ["--help"]).output
    new = build_config(None, {"decode_table": "16:20,32:30"}, ())
    old = sim_args_from_mapping({"decode_step_ms": "16:20,32:30"}, "old.yaml")
    assert "sim.decode_step_ms is deprecated: its new name is sim.decode_table" in (
        capsys.readouterr().err
    )
    assert old == ["--decode-table", "16:20,32:30"]
    config = tmp_path / "sim.yaml"
    config.write_text("decode_step_ms: '16:20,32:30'\n")
    assert build_config(config, {}, ()).engine.decode_table == new.engine.decode_table
    with pytest.raises(ConfigError, match=r"is the old name of sim\.decode_table"):
        sim_args_from_mapping({"decode_step_ms": 20, "decode_table": 20}, "both.yaml")
    both = runner.invoke(sim, ["--decode-step-ms", "20", "--decode-table", "20"])
    assert both.exit_code != 0
    assert "old name of --decode-table" in both.output
    served: list[SimConfig] = []
    monkeypatch.setattr(sim_cli, "run", served.append)  # the config it would serve
    flag = runner.invoke(sim, ["--decode-step-ms", "16:20,32:30"])
    assert flag.exit_code == 0, flag.output
    assert "--decode-step-ms is deprecated: its new name is --decode-table" in flag.output
    assert served[0].engine.decode_table == new.engine.decode_table


def test_sim_args_from_mapping_validates_and_converts() -> None:
    """A workload's sim: section becomes CLI args; bad keys raise ConfigError at sim.<key>."""
    args = sim_args_from_mapping(
        {
            "max_batch": 64,
            "decode_table": {16: 20, 32: 30},
            "faults": {"stall": 0.1},
            "no_done": True,
        },
        "w.yaml",
    )
    assert args == [
        "--max-batch", "64", "--decode-table", "16:20,32:30", "--fault=stall=0.1", "--no-done",
    ]  # fmt: skip
    with pytest.raises(ConfigError) as bad_key:
        sim_args_from_mapping({"max_bath": 3}, "w.yaml")
    assert bad_key.value.key == "sim.max_bath"
    with pytest.raises(ConfigError) as bad_value:
        sim_args_from_mapping({"chunk_tokens": -1}, "w.yaml")
    assert bad_value.value.key == "sim.chunk_tokens"
    with pytest.raises(ConfigError):
        sim_args_from_mapping({"port": 9}, "w.yaml")


def test_sim_section_passes_api_and_error_after_through() -> None:
    """A sim: section may pick the dialect and the error_after fault; a bad api is rejected."""
    args = sim_args_from_mapping({"api": "ollama", "faults": {"error_after": 0.5}}, "w.yaml")
    assert args == ["--api", "ollama", "--fault=error_after=0.5"]
    with pytest.raises(ConfigError) as bad:
        sim_args_from_mapping({"api": "grpc"}, "w.yaml")
    assert bad.value.key == "sim.api"


def test_global_error_after_fault_ends_openai_streams_with_an_error_event() -> None:
    """--fault error_after=1 --fault-after-tokens 2: every stream ends with an error data event."""
    args = ["--speed", str(SPEED), "--fault", "error_after=1", "--fault-after-tokens", "2"]
    with running_sim(args) as proc, httpx.Client(base_url=proc.url, timeout=30.0) as c:
        lines = _events(c, _chat(6))
    assert "data: [DONE]" not in lines
    assert json.loads(lines[-1][6:])["error"]["type"] == "server_error"
    assert len(_content(_data(lines[:-1])).split()) == 2


def test_api_flag_rejects_unknown_dialects() -> None:
    """`loadgen sim --api grpc` exits 2 naming the valid choices."""
    result = CliRunner().invoke(sim, ["--api", "grpc"])
    assert result.exit_code == 2
    assert "anthropic" in result.output
